"""Deploy overhead: `deploy up` to ready against a hand-written OpenSSH baseline, on the same sshd and engine.

Baseline (what a person would script): scp the launch script; `ssh host 'setsid nohup bash launch.sh &'`;
`ssh host 'until curl -sf /health; do sleep 0.25; done'`. Both start the identical engine command line (the
argv deployer renders for the profile) with the stand-in set to be ready at once, and both poll health every
0.25 s. Runs alternate (baseline, up, baseline, up, ...) so drift hits both; medians are compared.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import yaml

from common import DEPLOY, SSHD, Figure, bench_profile, deploy_env, median, scp_argv, ssh_argv, timed


def _baseline_script(profile: Path, dest: Path) -> Path:
    from deployer.profile.loader import load_profile
    from deployer.render.bundle import render

    prof = load_profile(str(profile))
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in prof.engine.env.items())
    dest.write_text(f"#!/bin/bash\nexport {exports}\nexec {shlex.join(render(prof).argv)}\n")
    return dest


def _baseline_once(bed: SSHD, script: Path, rdir: str, port: int) -> float:
    t0 = time.perf_counter()
    timed(scp_argv(bed, script, f"{rdir}/launch.sh"))
    timed(ssh_argv(bed, f"cd {rdir}; setsid nohup bash launch.sh > engine.log 2>&1 < /dev/null & "
                        f"echo $! > {rdir}/pid"))
    timed(ssh_argv(bed, f"for i in $(seq 480); do curl -sf -o /dev/null http://127.0.0.1:{port}/health && "
                        "exit 0; sleep 0.25; done; exit 1"))
    took = time.perf_counter() - t0
    timed(ssh_argv(bed, f"kill -TERM -- -$(cat {rdir}/pid); for i in $(seq 100); do "
                        f"curl -s -o /dev/null http://127.0.0.1:{port}/health || exit 0; sleep 0.1; done"))
    return took


def _deploy_once(profile: Path, home: Path) -> float:
    env = deploy_env(home)
    took, _ = timed([DEPLOY, "up", str(profile), "--skip-preflight"], env=env)
    timed([DEPLOY, "down", str(profile)], env=env)
    return took


def run(bed: SSHD, tmp: Path, reps: int) -> Figure:
    profile = bench_profile(tmp, bed, "bench-overhead", {})
    rdir = str(tmp / "baseline")
    timed(ssh_argv(bed, f"mkdir -p {rdir}"))
    script = _baseline_script(profile, tmp / "launch.sh")
    port = int(yaml.safe_load(profile.read_text())["engine"]["port"])
    home = tmp / "home"
    _deploy_once(profile, home)                # warm-up: first run creates the deployment dir and history db
    base, ours = [], []
    for _ in range(reps):
        base.append(_baseline_once(bed, script, rdir, port))
        ours.append(_deploy_once(profile, home))
    fig = Figure("deploy up -> ready", median(ours), "s", median(base), "scp + ssh setsid nohup + curl loop",
                 "ratio <= 1.5", samples=ours, baseline_samples=base,
                 notes=f"fixed cost {median(ours) - median(base):+.2f} s per up (imports, supervisor round trips)")
    fig.ok = fig.ratio is not None and fig.ratio <= 1.5
    return fig
