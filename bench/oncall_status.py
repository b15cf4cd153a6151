"""`deploy status` against what a person types instead: `ssh host cat <run>/state.json` (issue 13: <= 1.3x).

One deployment of the stand-in engine stays up while both are timed, alternating (baseline, status, ...);
each is a fresh process with a full SSH handshake, as a person runs them. `compare` (run.py --compare DIR): the
`deploy status` of another copy of the code (DIR holds its `deployer/` package, e.g. `git archive REV deployer`
untarred there) is timed in the same rounds against the same baseline, so a before/after is read off one command
whatever the machine's load does meanwhile.
"""

from __future__ import annotations

import compileall
from pathlib import Path

from common import DEPLOY, SSHD, Figure, bench_profile, deploy_env, median, ssh_argv, timed

TARGET_RATIO = 1.3


def run(bed: SSHD, tmp: Path, reps: int, compare: Path | None = None) -> list[Figure]:
    workdir = tmp / "status-work"
    profile = bench_profile(tmp, bed, "bench-status", {}, workdir=workdir)
    env = deploy_env(tmp / "home-status")
    other = None
    if compare is not None:
        compileall.compile_dir(str(compare / "deployer"), quiet=1)  # as this checkout's: compiled once, not per call
        other = {**env, "PYTHONPATH": str(compare)}
    timed([DEPLOY, "up", str(profile), "--skip-preflight"], env=env, timeout=120)
    state = workdir / profile.stem / "current" / "state.json"
    status = [DEPLOY, "status", str(profile)]
    try:
        timed(ssh_argv(bed, f"cat {state}"))
        timed(status, env=env)  # loads the profile once; the timed runs read where it points (oncall.remembered)
        if other is not None:
            timed(status, env=other)
        base, ours, theirs = [], [], []
        for _ in range(reps):
            base.append(timed(ssh_argv(bed, f"cat {state}"))[0])
            ours.append(timed(status, env=env)[0])
            if other is not None:
                theirs.append(timed(status, env=other)[0])
    finally:
        timed([DEPLOY, "down", str(profile)], env=env, check=False)
    figures = [_figure("deploy status", ours, base)]
    if compare is not None:
        figures.append(_figure(f"deploy status ({compare})", theirs, base))
    return figures


def _figure(name: str, samples: list[float], base: list[float]) -> Figure:
    fig = Figure(name, median(samples), "s", median(base), "ssh host cat <run>/state.json",
                 f"ratio <= {TARGET_RATIO}", samples=samples, baseline_samples=base)
    fig.ok = fig.ratio is not None and fig.ratio <= TARGET_RATIO
    return fig
