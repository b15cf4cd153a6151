"""`deploy status` against what a person types instead: `ssh host cat <run>/state.json` (issue 13: <= 1.3x).

One deployment of the stand-in engine stays up while both are timed, alternating (baseline, status, ...);
each is a fresh process with a full SSH handshake, as a person runs them.
"""

from __future__ import annotations

from pathlib import Path

from common import DEPLOY, SSHD, Figure, bench_profile, deploy_env, median, ssh_argv, timed

TARGET_RATIO = 1.3


def run(bed: SSHD, tmp: Path, reps: int) -> Figure:
    workdir = tmp / "status-work"
    profile = bench_profile(tmp, bed, "bench-status", {}, workdir=workdir)
    env = deploy_env(tmp / "home-status")
    timed([DEPLOY, "up", str(profile), "--skip-preflight"], env=env, timeout=120)
    state = workdir / profile.stem / "current" / "state.json"
    try:
        timed(ssh_argv(bed, f"cat {state}"))
        timed([DEPLOY, "status", str(profile)], env=env)
        base, ours = [], []
        for _ in range(reps):
            base.append(timed(ssh_argv(bed, f"cat {state}"))[0])
            ours.append(timed([DEPLOY, "status", str(profile)], env=env)[0])
    finally:
        timed([DEPLOY, "down", str(profile)], env=env, check=False)
    fig = Figure("deploy status", median(ours), "s", median(base), "ssh host cat <run>/state.json",
                 f"ratio <= {TARGET_RATIO}", samples=ours, baseline_samples=base)
    fig.ok = fig.ratio is not None and fig.ratio <= TARGET_RATIO
    return fig
