"""Real engines: time to ready of real vLLM 0.32.0 (CPU) and real SGLang 0.5.23 (CPU engine) serving the tiny
model, `deploy up` (preflight included) against a hand-written OpenSSH launch of the same engine and flags, runs
alternated; and a warm restart (compile caches kept) against a cold start of the same engine.

Needs `make real-engines` (the venvs and the model; see tests/real_engines/conftest.py for the profiles: the
KV cache capped on every launch). The hand baseline is what a person scripts: scp launch.sh (the engine command
line deployer renders for the profile, its environment exported), `ssh setsid nohup bash launch.sh &`, then
`ssh 'until curl -sf /health && curl -sf /v1/completions (one token)'` every 0.25 s (the readiness `deploy up` waits
for: a generated token); `deploy up` polls health at the same interval.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

from common import (
    DEPLOY, REPO, SSHD, Figure, deploy_env, hand_launch_script, hand_start, median, served_model, ssh_argv, timed,
)

sys.path.insert(0, str(REPO / "tests" / "real_engines"))
from conftest import sglang_engine, vllm_engine, write_real_profile  # noqa: E402

START_S = 400.0


def _profile(tmp: Path, bed: SSHD, name: str, engine: dict[str, Any]) -> Path:
    prof = write_real_profile(tmp, bed, name, engine)
    data = yaml.safe_load(prof.read_text())
    data["health"]["interval_s"] = 0.25
    data["retry"] = {"max_attempts": 1, "backoff_s": 0.5}
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    return prof


def _hand_once(bed: SSHD, script: Path, rdir: str, port: int, model: str) -> float:
    took = hand_start(bed, script, rdir, port, polls=1600, timeout=START_S, model=model)
    timed(ssh_argv(bed, f"kill -TERM -- -$(cat {rdir}/pid); for i in $(seq 300); do "
                        f"kill -0 -- -$(cat {rdir}/pid) 2>/dev/null || exit 0; sleep 0.1; done; "
                        f"kill -KILL -- -$(cat {rdir}/pid)"), timeout=60, check=False)
    return took


def _deploy_once(profile: Path, home: Path) -> float:
    env = deploy_env(home)
    took, _ = timed([DEPLOY, "up", str(profile)], env=env, timeout=START_S)
    timed([DEPLOY, "down", str(profile)], env=env, timeout=120)
    return took


def _time_to_ready(bed: SSHD, tmp: Path, reps: int, kind: str,
                   engine: Callable[[int, Path], dict[str, Any]]) -> Figure:
    from sshbed import free_port

    port = free_port()
    work = tmp / kind
    work.mkdir()
    profile = _profile(work, bed, f"bench-real-{kind}", engine(port, work))
    rdir = str(work / "hand")
    timed(ssh_argv(bed, f"mkdir -p {rdir}"))
    script = hand_launch_script(profile, work / "launch.sh")
    home = work / "home"
    _deploy_once(profile, home)  # warm-up: caches (compile, page cache), the deployment dir, the probe
    hand, ours = [], []
    for _ in range(reps):
        hand.append(_hand_once(bed, script, rdir, port, served_model(profile)))
        ours.append(_deploy_once(profile, home))
    name = {"vllm": "real vLLM 0.32.0", "sglang": "real SGLang 0.5.23"}[kind]
    value, base = median(ours), median(hand)
    return Figure(name=f"{name}: deploy up (preflight) -> ready", value=value, unit="s", baseline=base,
                  baseline_name="hand-written OpenSSH launch of the same argv", target="ratio <= 1.05",
                  ok=value / base <= 1.05, samples=ours, baseline_samples=hand)


def _warm_vs_cold(bed: SSHD, tmp: Path, reps: int) -> Figure:
    """vLLM with torch.compile (no --enforce-eager): a cold start (empty VLLM_CACHE_ROOT and inductor cache)
    against `deploy restart` of the same deployment (caches kept)."""
    from sshbed import free_port

    work = tmp / "warmcold"
    work.mkdir()
    engine = vllm_engine(free_port(), work)
    engine["args"].pop("enforce_eager")
    profile = _profile(work, bed, "bench-real-warmcold", engine)
    home, env = work / "home", deploy_env(work / "home")
    cold, warm = [], []
    for _ in range(reps):
        for cache in ("vllm-cache", "inductor"):
            shutil.rmtree(work / cache, ignore_errors=True)
        took, _ = timed([DEPLOY, "up", str(profile), "--force"], env=env, timeout=START_S)
        cold.append(took)
        took, _ = timed([DEPLOY, "restart", str(profile)], env=env, timeout=START_S)
        warm.append(took)
        timed([DEPLOY, "down", str(profile)], env=env, timeout=120)
    del home
    return Figure(name="real vLLM 0.32.0 (torch.compile): warm restart vs cold start", value=median(warm), unit="s",
                  baseline=median(cold), baseline_name="cold start (empty compile caches)", target="reported",
                  samples=warm, baseline_samples=cold)


def run(bed: SSHD, tmp: Path, reps: int) -> list[Figure]:
    smi = bed.bin_dir / "nvidia-smi"
    if not smi.exists():  # preflight reads the GPUs: the stand-in nvidia-smi (the engines run on this CPU)
        smi.symlink_to(REPO / "tests" / "standin" / "bin" / "nvidia-smi")
    return [_time_to_ready(bed, tmp, reps, "vllm", vllm_engine),
            _time_to_ready(bed, tmp, reps, "sglang", sglang_engine),
            _warm_vs_cold(bed, tmp, reps)]
