"""Detection latency: engine killed -> diagnosis printed, with a 1 MB and a 1 GB log.

The stand-in's `fail_text` mode replays a log file verbatim into engine.log and then dies by SIGKILL (exit
137, like SGLang after "Received sigquit"). The log is filler (realistic decode-batch lines) with a real CUDA
OOM traceback at the END: the worst case for finding the first traceback, which the pipeline must search
for in a bounded window (`pipeline.attempt_log`). Latency = the `diagnosis` event's time (NDJSON from
`deploy up --json --no-heal`) minus `ended_at` in the attempt's state.json (written by the supervisor when
it reaped the engine; same clock, same machine). `health.interval_s` is 0.25.

The big file and the run dirs live under a temp dir in /tmp and are deleted after each size.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from common import DEPLOY, REPO, SSHD, Figure, bench_profile, deploy_env, median, timed

CASE = REPO / "tests" / "cases" / "sglang" / "cuda-oom.log"
FILLER = ("[2026-11-29 12:00:{s:02d}] Decode batch. #running-req: 12, #token: 34567, token usage: 0.21, "
          "cuda graph: True, gen throughput (token/s): 1234.56, #queue-req: 0\n")
MB = 1 << 20
GB = 1 << 30


def make_log(path: Path, size: int) -> Path:
    """`size` bytes of filler, then the real failure (traceback + sigquit lines)."""
    tail = CASE.read_bytes()
    block = "".join(FILLER.format(s=i % 60) for i in range(4096)).encode()
    left = max(size - len(tail), 0)
    with path.open("wb") as fh:
        while left > 0:
            chunk = block[:left]
            fh.write(chunk)
            left -= len(chunk)
        fh.write(tail)
    return path


def _once(profile: Path, home: Path, workdir: Path) -> tuple[float, dict[str, float]]:
    _, proc = timed([DEPLOY, "up", str(profile), "--json", "--no-heal", "--skip-preflight"], env=deploy_env(home),
                    check=False, timeout=300)
    if proc.returncode != 5:
        raise RuntimeError(f"expected a launch failure (exit 5), got {proc.returncode}: {proc.stderr[-1500:]}")
    evs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    diag = next(e for e in evs if e["event"] == "diagnosis")
    if diag.get("signature") != "cuda-oom":
        raise RuntimeError(f"wrong diagnosis {diag.get('signature')!r}: {diag.get('summary')}")
    exited = next(e for e in evs if e["event"] == "exited")
    state = json.loads((workdir / profile.stem / "current" / "state.json").read_text())
    ended = float(state["ended_at"])
    parts = {"exit_noticed_s": exited["at"] - ended, "diagnosed_s": diag["at"] - exited["at"]}
    for run in (workdir / profile.stem / "runs").iterdir():       # 1 GB engine.log per attempt: gone at once
        shutil.rmtree(run, ignore_errors=True)
    return diag["at"] - ended, parts


def measure(bed: SSHD, tmp: Path, size: int, label: str, reps: int) -> tuple[list[float], dict[str, float]]:
    d = tmp / f"detect-{label}"
    d.mkdir()
    try:
        log = make_log(d / "replay.log", size)
        workdir = d / "work"
        env = {"STANDIN_MODE": "fail_text", "STANDIN_FAIL_LOG": str(log), "STANDIN_EXIT": "137"}
        profile = bench_profile(d, bed, f"bench-detect-{label.lower()}", env, workdir=workdir)
        samples: list[float] = []
        parts: dict[str, float] = {}
        for _ in range(reps):
            took, parts = _once(profile, d / "home", workdir)
            samples.append(took)
        return samples, parts
    finally:
        shutil.rmtree(d, ignore_errors=True)


def free_gb(path: str = "/tmp") -> float:
    return shutil.disk_usage(path).free / GB


def run(bed: SSHD, tmp: Path, reps: int) -> list[Figure]:
    small, small_parts = measure(bed, tmp, MB, "1MB", reps)
    fig_small = Figure("detect: killed -> diagnosis (1 MB log)", median(small), "s", target="<= 1.5 s",
                       samples=small, notes=json.dumps({k: round(v, 3) for k, v in small_parts.items()}))
    fig_small.ok = fig_small.value <= 1.5
    if free_gb() < 5:
        skipped = Figure("detect: killed -> diagnosis (1 GB log)", float("nan"), "s", target="<= 1.5 s",
                         notes=f"skipped: {free_gb():.1f} GB free in /tmp, 5 GB needed")
        return [fig_small, skipped]
    big, big_parts = measure(bed, tmp, GB, "1GB", max(1, min(reps, 3)))
    fig_big = Figure("detect: killed -> diagnosis (1 GB log)", median(big), "s", median(small),
                     "the same with a 1 MB log", "<= 1.5 s and ratio <= 1.2", samples=big, baseline_samples=small,
                     notes=json.dumps({k: round(v, 3) for k, v in big_parts.items()}))
    fig_big.ok = fig_big.value <= 1.5 and (fig_big.ratio or 99) <= 1.2
    return [fig_small, fig_big]
