"""Deploy overhead: `deploy up` to ready against a hand-written OpenSSH baseline, on the same sshd and engine.

Baseline (what a person would script): scp the launch script; `ssh host 'setsid nohup bash launch.sh &'`;
`ssh host 'until curl -sf /health && <a one-token /v1/completions>; do sleep 0.25; done'` (ready means a generated
token, as for `deploy up`). Both start the identical engine command line (the
argv deployer renders for the profile) with the stand-in set to be ready at once, and both poll health every
0.25 s. Runs alternate (baseline, up, baseline, up, ...) so drift hits both; medians are compared.

Three figures against that one baseline: `up --skip-preflight`; `up` with preflight, the probe cached on the target
(issue 13: the next `up` skips it); and the first `up` on a fresh target (the helper is uploaded, the probe runs
cold: no probe cache on the target, an empty local cache), stated separately and measured once per rep.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from common import (
    DEPLOY, REPO, SSHD, Figure, bench_profile, deploy_env, hand_launch_script, hand_start, median, served_model,
    ssh_argv, timed,
)


def _baseline_once(bed: SSHD, script: Path, rdir: str, port: int, model: str) -> float:
    took = hand_start(bed, script, rdir, port, polls=480, model=model)
    timed(ssh_argv(bed, f"kill -TERM -- -$(cat {rdir}/pid); for i in $(seq 100); do "
                        f"curl -s -o /dev/null http://127.0.0.1:{port}/health || exit 0; sleep 0.1; done"))
    return took


def _deploy_once(profile: Path, home: Path, *flags: str) -> float:
    env = deploy_env(home)
    took, _ = timed([DEPLOY, "up", str(profile), *flags], env=env)
    timed([DEPLOY, "down", str(profile)], env=env)
    return took


def _fresh_target(bed: SSHD, home: Path) -> None:
    """Forget what earlier runs left: the helper and the probe cache on the target, the local flag cache. Only
    deployer's own files (a bed without a private home shares the user's ~/.cache/deployer with other things)."""
    timed(ssh_argv(bed, 'rm -rf "${XDG_CACHE_HOME:-$HOME/.cache}"/deployer/probes '
                        '"${XDG_CACHE_HOME:-$HOME/.cache}"/deployer/helper-*.py'))
    shutil.rmtree(home, ignore_errors=True)


def run(bed: SSHD, tmp: Path, reps: int) -> list[Figure]:
    profile = bench_profile(tmp, bed, "bench-overhead", {})
    rdir = str(tmp / "baseline")
    timed(ssh_argv(bed, f"mkdir -p {rdir}"))
    script = hand_launch_script(profile, tmp / "launch.sh")
    port = int(yaml.safe_load(profile.read_text())["engine"]["port"])
    home = tmp / "home"
    smi = bed.bin_dir / "nvidia-smi"
    if not smi.exists():  # preflight reads the GPUs: the stand-in nvidia-smi (no GPU here)
        smi.symlink_to(REPO / "tests" / "standin" / "bin" / "nvidia-smi")
    _deploy_once(profile, home)                # warm-up: first run creates the deployment dir and history db
    base, skip, full, first = [], [], [], []
    for _ in range(reps):
        base.append(_baseline_once(bed, script, rdir, port, served_model(profile)))
        skip.append(_deploy_once(profile, home, "--skip-preflight"))
        full.append(_deploy_once(profile, home))   # the probe is cached on the target by the run before
        _fresh_target(bed, tmp / "fresh-home")
        first.append(_deploy_once(profile, tmp / "fresh-home"))
    return [_figure("deploy up --skip-preflight -> ready", skip, base, 1.3),
            _figure("deploy up (preflight, probe cached) -> ready", full, base, 1.5),
            _figure("deploy up, first on a fresh target", first, base, None,
                    "helper uploaded, probe cold (no target or local cache)")]


def _figure(name: str, ours: list[float], base: list[float], target: float | None, what: str = "") -> Figure:
    fig = Figure(name, median(ours), "s", median(base), "scp + ssh setsid nohup + curl loop",
                 f"ratio <= {target:g}" if target else "- (stated)", samples=ours, baseline_samples=base,
                 notes=f"{what + '; ' if what else ''}fixed cost {median(ours) - median(base):+.2f} s per up")
    fig.ok = target is None or (fig.ratio is not None and fig.ratio <= target)
    return fig
