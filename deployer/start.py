"""Start: drive the target-side supervisor (start/stop/status) and the port check (the lock: deployer/lock.py).

The supervisor (deployer/supervise.py, stdlib only) runs on the target's python3; these functions are the only
place that knows its command line.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from typing import Any

from deployer.errors import CommandFailed, PortBusy, TargetError
from deployer.push import Layout, RunDir
from deployer.remote import Remote

# The target's python3 (stdlib only, >= 3.8); images that ship only `python` work too.
SUPERVISOR_PYTHON = '"$(command -v python3 || command -v python || echo python3)"'


@dataclass(frozen=True)
class Launch:
    """A started engine: where it runs and where its output goes."""

    run: RunDir
    pid: int
    pgid: int
    started_at: float
    log_offset: int


def supervisor(script: str, *args: str) -> str:
    return " ".join([SUPERVISOR_PYTHON, *(shlex.quote(w) for w in (script, *args))])


def _json_line(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            data = json.loads(line)
            if isinstance(data, dict):
                return data
    return {}


def start(remote: Remote, run: RunDir) -> Launch:
    try:
        result = remote.run(supervisor(run.file("supervise.py"), "start", run.path), timeout=30)
    except CommandFailed as exc:
        raise TargetError(f"supervisor could not start the engine: {' '.join(exc.tail) or 'no output'}") from None
    state = _json_line(result.stdout)
    if not state.get("pid"):
        raise TargetError(f"supervisor did not report an engine pid (got {result.stdout.strip()[:200]!r})")
    return Launch(run=run, pid=int(state["pid"]), pgid=int(state.get("pgid") or state["pid"]),
                  started_at=float(state.get("started_at") or time.time()),
                  log_offset=int(state.get("log_offset") or 0))


def status(remote: Remote, run: RunDir) -> dict[str, Any]:
    result = remote.run(supervisor(run.file("supervise.py"), "status", run.path), timeout=30, check=False)
    if not result.ok:
        return {"status": "absent", "error": (result.stderr or result.stdout).strip()[:300]}
    return _json_line(result.stdout)


def stop(remote: Remote, run: RunDir, grace: float) -> dict[str, Any]:
    result = remote.run(supervisor(run.file("supervise.py"), "stop", run.path, "--grace", f"{grace:g}"),
                        timeout=grace + 30)
    return _json_line(result.stdout)


def port_free(remote: Remote, layout: Layout, port: int, wait_s: float = 0.0) -> tuple[bool, str]:
    """Whether the engine port can be bound on the target; waits up to wait_s for it to free."""
    deadline = time.monotonic() + wait_s
    while True:
        result = remote.run(supervisor(layout.supervisor, "ports", str(port)), timeout=20, check=False)
        if result.exit_code == 0:
            return True, ""
        if result.exit_code != 1:
            raise CommandFailed(result, host=remote.label, what="port check")
        if time.monotonic() >= deadline:
            return False, result.stdout.strip()
        time.sleep(0.5)


def check_port(remote: Remote, layout: Layout, port: int, wait_s: float = 0.0) -> None:
    free, detail = port_free(remote, layout, port, wait_s)
    if not free:
        raise PortBusy(f"port {port} is already in use on {remote.label} ({detail})",
                       hint="stop what holds it, or set engine.port to another port")
