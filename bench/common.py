"""Shared pieces of the benchmarks: a throwaway sshd, bench profiles, timing, and the result record.

Every figure is a ratio against a baseline measured in the same command, so the numbers travel between
machines; absolute values are recorded too.
"""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO / "tests", REPO / "tests" / "integration"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from deploy_helpers import write_profile  # noqa: E402
from sshbed import SSHD as SSHD  # noqa: E402  (re-exported)

DEPLOY = str(REPO / ".venv" / "bin" / "deploy")
FAST_ENGINE = {"STANDIN_STEP_S": "0", "STANDIN_READY_DELAY_S": "0"}   # the stand-in ready at once
BENCH_HEALTH = {"interval_s": 0.25, "startup_timeout_s": 120, "stall_timeout_s": 60}
LINK = {"delay_s": 0.0, "ssh_config": ""}   # set by bench/run.py --delay: every SSH command goes through bench/link.py


def use_link(delay_s: float, tmp: Path, host: str) -> None:
    """Send every SSH connection of the benchmarks (OpenSSH baselines and deployer alike) through a relay that adds
    `delay_s` each way."""
    if delay_s <= 0:
        return
    config = tmp / "link_ssh_config"
    config.write_text(f"Host {host}\n    ProxyCommand {_proxy(delay_s)}\n")
    LINK.update(delay_s=delay_s, ssh_config=str(config))


def _proxy(delay_s: float) -> str:
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(REPO / 'bench' / 'link.py'))} %h %p {delay_s:g}"


def _link_options() -> list[str]:
    return ["-o", f"ProxyCommand={_proxy(float(LINK['delay_s']))}"] if LINK["delay_s"] else []


@dataclass
class Figure:
    """One benchmark line: value against its baseline, and the target it is held to."""

    name: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    target: str = ""
    ok: bool | None = None
    samples: list[float] = field(default_factory=list)
    baseline_samples: list[float] = field(default_factory=list)
    notes: str = ""
    shell_cost_s: float | None = None  # `ssh host true` on the target it was measured on; None: no SSH

    @property
    def ratio(self) -> float | None:
        return None if not self.baseline else self.value / self.baseline

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = None if self.ratio is None else round(self.ratio, 3)
        return data


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def timed(argv: list[str], *, env: dict[str, str] | None = None, check: bool = True,
          timeout: float = 60) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Wall time of one command (fresh process), and what it left."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(REPO))
    took = time.perf_counter() - t0
    if check and proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return took, proc


def deploy_env(home: Path, **extra: str) -> dict[str, str]:
    link = {"DEPLOYER_SSH_CONFIG": str(LINK["ssh_config"])} if LINK["delay_s"] else {}
    # PYTHONPATH: this checkout's deployer. Without it the venv's editable install imports the checkout the venv
    # was installed from (a shared venv: another one), and the bench timed that code, not this.
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"),
            "PYTHONPATH": str(REPO), "DEPLOYER_HOME": str(home), **link, **extra}


def bench_profile(tmp: Path, bed: SSHD, name: str, env: dict[str, str], **kw: Any) -> Path:
    extra = {"health": BENCH_HEALTH, "retry": {"max_attempts": 1, "backoff_s": 0.2}, **kw.pop("extra", {})}
    path: Path = write_profile(tmp, bed, name=name, env={**FAST_ENGINE, **env}, extra=extra, **kw)
    return path


def ssh_argv(bed: SSHD, *remote: str) -> list[str]:
    """Plain OpenSSH to the test sshd, as a person would type it (no ControlMaster: one handshake each)."""
    return ["ssh", "-F", "/dev/null", *_link_options(), "-i", str(bed.identity_file), "-p", str(bed.port),
            "-o", f"UserKnownHostsFile={bed.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", f"{bed.user}@{bed.host}", *remote]


def scp_argv(bed: SSHD, src: Path, dest: str) -> list[str]:
    return ["scp", "-q", "-F", "/dev/null", *_link_options(), "-i", str(bed.identity_file), "-P", str(bed.port),
            "-o", f"UserKnownHostsFile={bed.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", str(src), f"{bed.user}@{bed.host}:{dest}"]


def hand_launch_script(profile: Path, dest: Path) -> Path:
    """The launch script a person would write for the profile: its engine environment exported, then exec of the
    engine command line deployer renders for it."""
    from deployer.profile.loader import load_profile
    from deployer.render.bundle import render

    prof = load_profile(str(profile))
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in prof.engine.env.items())
    dest.write_text(f"#!/bin/bash\nexport {exports}\nexec {shlex.join(render(prof).argv)}\n")
    return dest


def served_model(profile: Path) -> str:
    """The model name the profile's engine serves (what a one-token completion asks for)."""
    from deployer.profile.loader import load_profile

    return load_profile(str(profile)).engine.served_model


def hand_start(bed: SSHD, script: Path, rdir: str, port: int, polls: int, timeout: float = 60,
               model: str = "") -> float:
    """The hand-written OpenSSH launch: scp the script, `ssh setsid nohup bash launch.sh &`, then an ssh curl loop
    every 0.25 s until /health answers and a one-token completion of `model` comes back (the readiness `deploy up`
    waits for; at most `polls` times); the seconds it took."""
    from deployer.supervisor.probe import request_body

    body = shlex.quote(request_body(model).decode())
    t0 = time.perf_counter()
    timed(scp_argv(bed, script, f"{rdir}/launch.sh"))
    timed(ssh_argv(bed, f"cd {rdir}; setsid nohup bash launch.sh > engine.log 2>&1 < /dev/null & "
                        f"echo $! > {rdir}/pid"))
    timed(ssh_argv(bed, f"for i in $(seq {polls}); do curl -sf -o /dev/null http://127.0.0.1:{port}/health && "
                        f"curl -sf -m 30 -H 'content-type: application/json' -d {body} "
                        f"http://127.0.0.1:{port}/v1/completions | grep -Eq '\"completion_tokens\": ?[1-9]' && "
                        "exit 0; sleep 0.25; done; exit 1"), timeout=timeout)
    return time.perf_counter() - t0
