"""Hangs under load (issue 37): how fast a frozen engine core is found hung and restarted, and how many restarts a
saturated but healthy engine gets (goal 0).

    .venv/bin/python bench/hang.py [--reps 3] [--hang-s auto|SECONDS] [--saturate-s 60] [--step-s 0.3]
                                   [--engine standin|sglang|vllm] [--py-spy-dir DIR]

The target-side supervisor (supervise.py, run by its CLI as deployer runs it on a target) runs the step stand-in
(tests/standin/stepengine.py: an HTTP server and a forked core process that steps while requests run, /metrics
with vLLM's names) under the hang rule (hang.py) with the profile's defaults (hang_s auto, /metrics
read every second). `--engine sglang` runs real SGLang's CPU engine instead, `--engine vllm` real vLLM's CPU build
(float32, 4 running at most), each from its venv under ~/.cache/deployer (`make real-engines`) with the tiny model:
the series the rule reads are the engine package's (engines/<kind>/metrics.yaml), the process frozen is vLLM's
EngineCore or SGLang's scheduler (tests/engine_cores.py).

- detection: 8 clients keep its 4 slots full and 4 requests waiting for --warm-s seconds, then the core process
  gets SIGSTOP (as `kill -STOP` of vLLM's EngineCore or SGLang's scheduler); measured: SIGSTOP -> the
  supervisor's hung record (state.json last_crash.hung, its `at`), and SIGSTOP -> serving again (ready, 1
  restart). Goal: <= 30 s.
- false restarts: 8 clients saturate it for --saturate-s seconds with slow steps (--step-s, a long prefill
  each step) and a full queue; measured: restarts (goal 0), hung records, requests answered and failed.

Prints a table and writes bench/results/hang-<engine>.json. Exit 0 whatever the numbers (they are measurements).
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
from deployer.engines.registry import engine_for  # noqa: E402
from deployer.supervisor.base import group_pids  # noqa: E402
from deployer.box.tokenprobe import load_gauges, progress_names  # noqa: E402
from engine_cores import CORE_TITLE, cores_among  # noqa: E402
from payload import payload_program  # noqa: E402
from sshbed import free_port  # noqa: E402

SUPERVISE = payload_program("supervise.py")  # the program a run dir holds
STEPENGINE = REPO / "tests" / "standin" / "stepengine.py"
RESULTS = REPO / "bench" / "results"
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
READY = "The server is fired up and ready to roll!"
VLLM_READY = "Application startup complete."
CLIENTS, TOKENS = 8, 20
DETECT_GOAL_S = 30.0
STARTUP_S = 240.0


def sup(*args: str) -> dict[str, Any]:
    done = subprocess.run([PY, str(SUPERVISE), *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"supervise.py {args[0]}: {done.stderr.strip()}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


class Engine:
    """What the bench runs: the step stand-in, real SGLang's CPU engine (--engine sglang) or real vLLM's CPU build
    (--engine vllm). The series the hang rule reads come from the engine package's metrics.yaml (the stand-in
    speaks vLLM's), the process to freeze from tests/engine_cores.py."""

    def __init__(self, kind: str, python: str, model: str) -> None:
        self.kind, self.python, self.model = kind, python, model

    @property
    def ready(self) -> str:
        return VLLM_READY if self.kind == "vllm" else READY

    @property
    def served_model(self) -> str:
        return "standin" if self.kind == "standin" else self.model

    def launch(self, port: int, tmp: Path) -> str:
        if self.kind == "standin":
            return f"exec python3 {STEPENGINE} {port}"
        if self.kind == "vllm":   # as tests/real_engines/conftest.py vllm_engine, 4 running at most: a queue waits
            return (f"exec {self.python} -m vllm.entrypoints.openai.api_server --model {self.model} --host 127.0.0.1 "
                    f"--port {port} --enforce-eager --max-model-len 512 --dtype float32 --max-num-seqs 4")
        return (f"exec {self.python} -m sglang.launch_server --model-path {self.model} --device cpu --host 127.0.0.1 "
                f"--port {port} --max-total-tokens 8192 --enable-metrics")

    def env(self, step_s: float, tmp: Path) -> dict[str, str]:
        if self.kind == "standin":
            return {"STEPENGINE_STEP_S": str(step_s)}
        (tmp / "tmp").mkdir(exist_ok=True)
        if self.kind == "vllm":   # tests/real_engines/conftest.py vllm_engine says why each
            return {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
                    "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"), "TMPDIR": str(tmp / "tmp"),
                    "VLLM_RPC_BASE_PATH": str(tmp / "tmp"), "VLLM_HOST_IP": "127.0.0.1",
                    "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        return {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp / "tmp")}

    def names(self) -> dict[str, list[str]]:
        """The probe's series, from the engine package (engines/<kind>/metrics.yaml) as deployer renders them."""
        kind, args = ("sglang", {"enable_metrics": True}) if self.kind == "sglang" else ("vllm", {})
        engine = engine_for(kind)
        running, waiting = load_gauges(engine, args)
        progress, labels = progress_names(engine, args)
        return {"running_metrics": running, "waiting_metrics": waiting, "progress_metrics": progress,
                "engine_labels": labels}

    def body(self) -> bytes:
        return json.dumps({"model": self.served_model, "prompt": "Tell me a story.",
                           "max_tokens": TOKENS if self.kind == "standin" else 256, "ignore_eos": True}).encode()

    def core(self, run: Path, pgid: int) -> int:
        """The process that steps: the stand-in's forked core, vLLM's EngineCore, SGLang's scheduler."""
        if self.kind == "standin":
            lines = [ln for ln in (run / "engine.log").read_text().splitlines() if ln.startswith("core pid ")]
            return int(lines[-1].split()[2])
        found = cores_among(self.kind, group_pids(pgid))
        if len(found) != 1:
            raise RuntimeError(f"{len(found)} {CORE_TITLE[self.kind]} processes in the engine's group: {found}")
        return found[0]


ENGINE = Engine("standin", "", "")


def make_run(root: Path, port: int, env: dict[str, str], hang_s: float | None) -> Path:
    run = root / f"run-{port}"
    run.mkdir()
    (run / "launch.sh").write_text(f'set -euo pipefail\n{ENGINE.launch(port, root)}\n')
    (run / "launch.sh").chmod(0o700)
    (run / "env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    probe: dict[str, Any] = {"port": port, "model": ENGINE.served_model, "interval_s": 0, **ENGINE.names()}
    if hang_s is not None:
        probe["hang_s"] = hang_s
    cfg = {"launch": "launch.sh", "env_file": "env", "log": "engine.log", "grace_s": 2, "ready_pattern": ENGINE.ready,
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
        body = ENGINE.body()
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


def detection(root: Path, hang_s: float | None, warm_s: float, py_spy_dir: str | None) -> dict[str, Any]:
    port = free_port()
    env = ENGINE.env(0.02, root)
    if py_spy_dir:
        env["PATH"] = f"{py_spy_dir}:/usr/bin:/bin"
    run = make_run(root, port, env, hang_s)
    sup("start", str(run))
    try:
        first = wait(lambda: (lambda s: s if s["status"] == "ready" else None)(sup("status", str(run))), STARTUP_S,
                     "ready")
        with Load(port):
            time.sleep(warm_s)
            core = ENGINE.core(run, first["pgid"])
            stopped_at = time.time()
            os.kill(core, signal.SIGSTOP)
            hung = wait(lambda: (sup("status", str(run)).get("last_crash") or {}).get("hung"), 400, "hung", 0.2)
            back = wait(lambda: (lambda s: s if s["status"] == "ready" and s["restarts"] == 1 else None)(
                sup("status", str(run))), STARTUP_S, "serving again", 0.1)
            served_at = time.time()
        return {"detect_s": hung["at"] - stopped_at, "serving_again_s": served_at - stopped_at,
                "hang_s": hung["hang_s"], "derived": hung["derived"], "stacks": hung["stacks"]["method"],
                "stacks_took_s": hung["stacks"]["took_s"], "restarts": back["restarts"],
                "top": {str(p["pid"]): p["top"] for p in hung["stacks"]["processes"]},
                "kind": _kind(hung)}
    finally:
        sup("stop", str(run), "--grace", "1")


def _kind(hung: dict[str, Any]) -> str | None:
    found = classify(hung.get("stacks"))
    return found[0].kind if found else None


def saturation(root: Path, hang_s: float | None, seconds: float, step_s: float) -> dict[str, Any]:
    port = free_port()
    run = make_run(root, port, ENGINE.env(step_s, root), hang_s)
    sup("start", str(run))
    try:
        wait(lambda: sup("status", str(run))["status"] == "ready", STARTUP_S, "ready")
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
    parser.add_argument("--engine", choices=("standin", "sglang", "vllm"), default="standin",
                        help="sglang: real SGLang's CPU engine, vllm: real vLLM's CPU build (--python, --model); "
                        "their steps are their own (--step-s applies to the stand-in only)")
    parser.add_argument("--python", help="the real engine's python (default: its venv under ~/.cache/deployer)")
    parser.add_argument("--model", default=str(Path.home() / ".cache/deployer/tiny-llama"))
    args = parser.parse_args(argv)
    global ENGINE
    if args.python is None:
        args.python = str(Path.home() / f".cache/deployer/real-{args.engine}-venv/bin/python")
    ENGINE = Engine(args.engine, args.python, args.model)
    hang_s = None if args.hang_s == "auto" else float(args.hang_s)
    with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp:
        detections = [detection(Path(tmp), hang_s, args.warm_s, args.py_spy_dir) for _ in range(args.reps)]
        saturated = saturation(Path(tmp), hang_s, args.saturate_s, args.step_s)
    detect = statistics.median(d["detect_s"] for d in detections)
    again = statistics.median(d["serving_again_s"] for d in detections)
    print(f"engine: {args.engine}")
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
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"hang-{args.engine}.json").write_text(json.dumps({
                                   "machine": platform.node(), "cpus": os.cpu_count(), "at": time.time(),
                                   "args": vars(args), "detections": detections, "saturation": saturated,
                                   "detect_median_s": detect, "serving_again_median_s": again}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
