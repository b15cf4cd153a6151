"""The fault suite's shared checks, which every fault case ends with: what serves, what the lock says, and that
nothing was lost or leaked (orphan processes, secrets in files); plus `deploy` started in the background or inside
a namespace host (tests/netbed.py; the `net` fixture is in conftest.py)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # deploy_helpers

from deploy_helpers import REPO, deploy  # noqa: E402
from netbed import NetHost, processes_under  # noqa: E402

SECRET = "hf_fault_suite_SECRET_8c1f2e"  # passed as ${FAULT_SECRET}; must appear in no file but the 0600 env


def secret_env(lease_s: float | None = None) -> dict[str, str]:
    env = {"FAULT_SECRET": SECRET}
    if lease_s is not None:
        env["DEPLOYER_LOCK_LEASE_S"] = f"{lease_s:g}"
    return env


def start_deploy(*argv: str, home: Path, env: dict[str, str] | None = None,
                 netns: str | None = None) -> subprocess.Popen[bytes]:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.Popen([*prefix, sys.executable, "-m", "deployer.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=str(REPO),
                            env={"PATH": os.environ["PATH"], "DEPLOYER_HOME": str(home),
                                 "HOME": os.environ.get("HOME", "/root"), **(env or {})})


def deploy_in(host: NetHost, *argv: str, home: Path, env: dict[str, str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`deploy` run inside the host's namespace: a colleague logged in on the GPU box itself."""
    proc = start_deploy(*argv, home=home, env=env, netns=host.ns)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())


def wait_for_event(proc: subprocess.Popen[bytes], needle: str, timeout: float = 30) -> bytes:
    """Read `deploy --json` output until an event line containing `needle` (e.g. '"event": "pushed"')."""
    assert proc.stdout is not None
    got, deadline = b"", time.monotonic() + timeout
    while needle.encode() not in got and time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.5)[0]:
            got += os.read(proc.stdout.fileno(), 65536)
    assert needle.encode() in got, got[-3000:]
    return got


def inside_profile(prof: Path, host: NetHost) -> Path:
    """The same deployment as seen from inside the namespace (127.0.0.1:2222), for deploy_in."""
    assert host.sshd is not None
    data = yaml.safe_load(prof.read_text())
    known = host.sshd.dir / "known_hosts_inside"
    key = host.sshd.known_hosts.read_text().split(None, 1)[1]
    known.write_text(f"[127.0.0.1]:{host.sshd.port} {key}")
    data["target"].update(host="127.0.0.1", known_hosts=str(known))
    out = prof.with_name(prof.stem + "-inside.yaml")
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def lease(workdir: Path, name: str) -> dict[str, Any]:
    path = workdir / name / "lock"
    text = path.read_text().strip() if path.exists() else ""
    return dict(json.loads(text)) if text else {}


def assert_lock_free(workdir: Path, name: str) -> None:
    current = lease(workdir, name)
    assert not current.get("token") or current.get("expires_at", 0) < time.time(), current


def current_run(workdir: Path, name: str) -> Path | None:
    link = workdir / name / "current"
    return link.resolve() if link.exists() else None


def assert_nothing_leaked(workdir: Path, home: Path, name: str, *, serving: bool) -> None:
    """No process of the deployment outside its current run (none at all when not serving); the secret in no
    file but the run's 0600 env, nor in the local history."""
    deadline = time.monotonic() + 10
    while True:  # a stopped group can take a moment to be reaped
        pids = processes_under(workdir / name)
        run = current_run(workdir, name)
        strays = [p for p in pids if not serving or run is None or not _belongs(p, run)]
        if not strays or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not strays, [_describe(p) for p in strays]
    if serving:
        assert pids, "nothing runs for a deployment that should serve"
    for root in (workdir, home):
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and path.name != "env":
                assert SECRET.encode() not in path.read_bytes(), f"secret written to {path}"
            if path.is_file() and path.name == "env":
                assert path.stat().st_mode & 0o077 == 0, f"{path} readable by others"


def host_pid(ns_pid: int, near: Path) -> int:
    """The pid, in this namespace, of a target process known by its pid in the sshd's PID namespace."""
    for pid in processes_under(near):
        try:
            line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if int(line.split()[-1]) == ns_pid:
            return pid
    raise AssertionError(f"no process with namespace pid {ns_pid} under {near}")


def _belongs(pid: int, run: Path) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/cwd").startswith(str(run)) or \
            str(run) in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:
        return True  # gone meanwhile


def _describe(pid: int) -> str:
    try:
        return f"{pid}: {Path(f'/proc/{pid}/cmdline').read_text(errors='replace').replace(chr(0), ' ')[:200]}"
    except OSError:
        return f"{pid}: gone"


def status_of(prof: Path, home: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`deploy status --json` of one deployment; its exit code must agree with what it prints (0 only serving: up,
    healthy, and watched by a live supervisor)."""
    out = deploy("status", str(prof), "--json", home=home, env=env)
    assert out.returncode in (0, 5, 6, 8) and "Traceback" not in out.stderr, (out.returncode, out.stderr)
    st = dict(json.loads(out.stdout))
    assert (out.returncode == 0) == bool(st["serving"]), (out.returncode, st)
    assert not st["serving"] or (st["status"] in ("ready", "running") and st["healthy"]), st
    return st


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def guard_of(work: Path, name: str, timeout: float = 10, intent: str = "replace-intent.json") -> int:
    """This machine's pid of the deployment's armed repair guard (the target's sshd may run in a pid namespace of
    its own: the intent file names the guard in that one), waited for (bounded)."""
    path = work / name / intent
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), "no repair guard was armed"
    found = [pid for pid in processes_under(work / name) if b"supervise_guard.py" in cmdline(pid)]
    while len(found) > 1 and time.monotonic() < deadline + 5:  # `arm` itself, leaving once the guard reported
        time.sleep(0.05)
        found = [pid for pid in processes_under(work / name) if b"supervise_guard.py" in cmdline(pid)]
    assert len(found) == 1, found
    return found[0]
