"""Hangs under load (issue 37): how fast a frozen engine core is found hung and restarted, and how many restarts a
saturated but healthy engine gets (goal 0).

    .venv/bin/python bench/hang.py [--reps 3] [--hang-s auto|SECONDS] [--saturate-s 60] [--step-s 0.3]

The target-side supervisor (supervise.py, run by its CLI as deployer runs it on a target) runs the step stand-in
(tests/standin/stepengine.py: an HTTP server and a forked core process that steps while requests run, /metrics
with vLLM's names) under the hang rule (supervise_hang.py) with the profile's defaults (hang_s auto, /metrics
read every second).

- detection: 8 clients keep its 4 slots full and 4 requests waiting for --warm-s seconds, then the core process
  gets SIGSTOP (as `kill -STOP` of vLLM's EngineCore or SGLang's scheduler); measured: SIGSTOP -> the
  supervisor's hung record (state.json last_crash.hung, its `at`), and SIGSTOP -> serving again (ready, 1
  restart). Goal: <= 30 s.
- false restarts: 8 clients saturate it for --saturate-s seconds with slow steps (--step-s, a long prefill
  each step) and a full queue; measured: restarts (goal 0), hung records, requests answered and failed.

Prints a table and writes bench/results/hang.json. Exit 0 whatever the numbers (they are measurements).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # this checkout's deployer, and the test bed's ports

from deployer.diagnose.hangkinds import classify  # noqa: E402
from sshbed import free_port  # noqa: E402

SUPERVISE = REPO / "deployer" / "supervisor" / "supervise.py"
STEPENGINE = REPO / "tests" / "standin" / "stepengine.py"
RESULTS = REPO / "bench" / "results" / "hang.json"
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
READY = "The server is fired up and ready to roll!"
CLIENTS, TOKENS = 8, 20
DETECT_GOAL_S = 30.0


def sup(*args: str) -> dict[str, Any]:
    done = subprocess.run([PY, str(SUPERVISE), *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"supervise.py {args[0]}: {done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def make_run(root: Path, port: int, env: dict[str, str], hang_s: float | None) -> Path:
    run = root / f"run-{port}"
    run.mkdir()
    (run / "launch.sh").write_text(f'set -euo pipefail\nexec python3 {STEPENGINE} {port}\n')
    (run / "launch.sh").chmod(0o700)
    (run / "env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    probe: dict[str, Any] = {"port": port, "model": "standin", "interval_s": 0,
                             "running_metrics": ["vllm:num_requests_running"],
                             "waiting_metrics": ["vllm:num_requests_waiting"],
                             "progress_metrics": ["vllm:iteration_tokens_total_count"]}
    if hang_s is not None:
        probe["hang_s"] = hang_s
    cfg = {"launch": "launch.sh", "env_file": "env", "log": "engine.log", "grace_s": 2, "ready_pattern": READY,
           "restart": {"policy": "on-failure", "max": 5, "backoff_s": [0.5, 1], "window_s": 600}, "probe": probe}
    (run / "supervise.json").write_text(json.dumps(cfg))
    return run


def wait(pred: Any, timeout: float, what: str, poll: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(poll)
    raise TimeoutError(f"no {what} within {timeout:g} s")


class Load:
    """CLIENTS threads, each sending completions of TOKENS tokens back to back until stopped."""

    def __init__(self, port: int) -> None:
        self.port, self.stop = port, threading.Event()
        self.ok = self.failed = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _client(self) -> None:
        body = json.dumps({"model": "standin", "prompt": "x", "max_tokens": TOKENS}).encode()
        for _ in range(100000):
            if self.stop.is_set():
                return
            request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", body,
                                             {"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=120) as reply:
                    good = reply.status == 200
            except (OSError, urllib.error.URLError):
                good = False
                time.sleep(0.2)
            with self.lock:
                self.ok, self.failed = self.ok + good, self.failed + (not good)


def core_pid(run: Path) -> int:
    lines = [ln for ln in (run / "engine.log").read_text().splitlines() if ln.startswith("core pid ")]
    return int(lines[-1].split()[2])


def detection(root: Path, hang_s: float | None, warm_s: float, py_spy_dir: str | None) -> dict[str, Any]:
    port = free_port()
    env = {"STEPENGINE_STEP_S": "0.02"}
    if py_spy_dir:
        env["PATH"] = f"{py_spy_dir}:/usr/bin:/bin"
    run = make_run(root, port, env, hang_s)
    sup("start", str(run))
    try:
        wait(lambda: sup("status", str(run))["status"] == "ready", 30, "ready")
        with Load(port):
            time.sleep(warm_s)
            core = core_pid(run)
            stopped_at = time.time()
            os.kill(core, signal.SIGSTOP)
            hung = wait(lambda: (sup("status", str(run)).get("last_crash") or {}).get("hung"), 400, "hung", 0.2)
            back = wait(lambda: (lambda s: s if s["status"] == "ready" and s["restarts"] == 1 else None)(
                sup("status", str(run))), 60, "serving again", 0.1)
            served_at = time.time()
        return {"detect_s": hung["at"] - stopped_at, "serving_again_s": served_at - stopped_at,
                "hang_s": hung["hang_s"], "derived": hung["derived"], "stacks": hung["stacks"]["method"],
                "stacks_took_s": hung["stacks"]["took_s"], "restarts": back["restarts"],
                "kind": _kind(hung)}
    finally:
        sup("stop", str(run), "--grace", "1")


def _kind(hung: dict[str, Any]) -> str | None:
    found = classify(hung.get("stacks"))
    return found[0].kind if found else None


def saturation(root: Path, hang_s: float | None, seconds: float, step_s: float) -> dict[str, Any]:
    port = free_port()
    run = make_run(root, port, {"STEPENGINE_STEP_S": str(step_s)}, hang_s)
    sup("start", str(run))
    try:
        wait(lambda: sup("status", str(run))["status"] == "ready", 30, "ready")
        with Load(port) as load:
            time.sleep(seconds)
        st = sup("status", str(run))
        return {"seconds": seconds, "step_s": step_s, "restarts": st["restarts"],
                "hung": bool((st.get("last_crash") or {}).get("hung") or st.get("hung")),
                "answered": load.ok, "failed": load.failed}
    finally:
        sup("stop", str(run), "--grace", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--hang-s", default="auto", help="health.hang_s: auto (the default) or seconds")
    parser.add_argument("--warm-s", type=float, default=5.0, help="load before the SIGSTOP")
    parser.add_argument("--saturate-s", type=float, default=60.0)
    parser.add_argument("--step-s", type=float, default=0.3, help="the saturated run's step time")
    parser.add_argument("--py-spy-dir", help="a directory holding py-spy, put on the engine's PATH (the stacks "
                        "are then py-spy's; without it, the kernel's view from /proc)")
    args = parser.parse_args(argv)
    hang_s = None if args.hang_s == "auto" else float(args.hang_s)
    with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp:
        detections = [detection(Path(tmp), hang_s, args.warm_s, args.py_spy_dir) for _ in range(args.reps)]
        saturated = saturation(Path(tmp), hang_s, args.saturate_s, args.step_s)
    detect = statistics.median(d["detect_s"] for d in detections)
    again = statistics.median(d["serving_again_s"] for d in detections)
    print(f"{'benchmark':<52} {'value':>10}  goal")
    print(f"{'SIGSTOP of the core under load -> hung (median)':<52} {detect:>8.1f} s  <= {DETECT_GOAL_S:g} s "
          f"{'ok' if detect <= DETECT_GOAL_S else 'MISS'}")
    print(f"{'SIGSTOP of the core under load -> serving again':<52} {again:>8.1f} s")
    print(f"{'  each: detect / serving again / hang_s / stacks':<52} " + ", ".join(
        f"{d['detect_s']:.1f}/{d['serving_again_s']:.1f}/{d['hang_s']:g}/{d['stacks']}:{d['kind']}"
        for d in detections))
    print(f"{'restarts of a saturated engine (%gs, step %gs)' % (saturated['seconds'], saturated['step_s']):<52} "
          f"{saturated['restarts']:>10d}  0 {'ok' if saturated['restarts'] == 0 else 'MISS'}")
    print(f"{'  requests answered / failed meanwhile':<52} {saturated['answered']:>6d} / {saturated['failed']}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": platform.node(), "cpus": os.cpu_count(), "at": time.time(),
                                   "args": vars(args), "detections": detections, "saturation": saturated,
                                   "detect_median_s": detect, "serving_again_median_s": again}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
