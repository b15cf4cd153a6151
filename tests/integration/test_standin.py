"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product.

Tests of the stand-in SGLang engine (tests/standin/sglang) and the stand-in nvidia-smi: each runs the
stand-in as a real subprocess under /usr/bin/python3 with a clean environment, on a free loopback port.
"""

from __future__ import annotations

import ast
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
from sshbed import free_port

STANDIN = Path(__file__).resolve().parents[1] / "standin"
NVIDIA_SMI = STANDIN / "bin" / "nvidia-smi"
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
MODEL = "Qwen/Qwen3.6-27B"
SCENARIO_TEXT = (
    "ValueError: Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix cache "
    "when using --mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, please use "
    "--mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
)
pytestmark = pytest.mark.timeout(20)


class Engine:
    """One stand-in process (own process group), its merged log in a file, and its port."""

    def __init__(self, tmp: Path, args: List[str], env: Optional[Dict[str, str]] = None, port: int = 0) -> None:
        self.port = port or free_port()
        self.log_path = tmp / f"engine-{self.port}.log"
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(STANDIN)}
        full_env.update(env or {})
        argv = [PYTHON, "-m", "sglang.launch_server", "--port", str(self.port), *args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                         start_new_session=True, stdin=subprocess.DEVNULL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = 5.0) -> int:
        return self.proc.wait(timeout=timeout)

    def wait_for_log(self, needle: str, timeout: float = 3.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log():
                return True
            time.sleep(0.02)
        return False

    def get(self, path: str, timeout: float = 2.0) -> Optional[int]:
        """HTTP status of GET path, or None when nothing listens."""
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
            conn.request("GET", path)
            status = conn.getresponse().status
            conn.close()
            return status
        except OSError:
            return None

    def post(self, path: str, body: Dict[str, Any]) -> Tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
        resp = conn.getresponse()
        data = json.loads(resp.read() or b"null")
        conn.close()
        return resp.status, data

    def wait_status(self, path: str, want: Optional[int], timeout: float = 3.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.get(path, timeout=0.5) == want:
                return True
            time.sleep(0.02)
        return False

    def kill_group(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)


Start = Callable[..., Engine]


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[Start]:
    started: List[Engine] = []

    def start(args: List[str], env: Optional[Dict[str, str]] = None, port: int = 0) -> Engine:
        engine = Engine(tmp_path, args, env, port)
        started.append(engine)
        return engine

    yield start
    for engine in started:
        try:
            os.killpg(engine.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        engine.proc.wait(timeout=5)


def line_index(log: str, needle: str) -> int:
    for i, line in enumerate(log.splitlines()):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in log:\n{log}")


ORDER = [
    "server_args={",
    "Load weight begin. avail mem=",
    "Load weight end. elapsed=",
    "Mamba Cache is allocated. max_mamba_cache_size:",
    "KV Cache is allocated. dtype: torch.bfloat16, #tokens:",
    "Memory pool end. avail mem=",
    "Capture target decode CUDA graph begin.",
    "Capture target decode CUDA graph end.",
    "max_total_num_tokens=",
    "Engine startup timings (s): load_weight=",
    "INFO:     Uvicorn running on http://127.0.0.1:",
    "The server is fired up and ready to roll!",
]


def test_ok_reaches_ready_with_real_log_order_and_serves(engines: Start) -> None:
    eng = engines(["--model-path", MODEL])
    assert eng.wait_status("/health", 200)
    log = eng.log()
    positions = [line_index(log, needle) for needle in ORDER]
    assert positions == sorted(positions)
    assert f"(Press CTRL+C to quit)" in log
    for line in log.splitlines():
        if "server_args=" in line or "Load weight" in line:
            assert line.startswith("[20") and line[20:22] == "] ", line[:80]
    status, data = eng.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and data["choices"][0]["message"]["content"]
    for path in ("/v1/models", "/model_info", "/server_info", "/get_server_info", "/health_generate", "/ready"):
        assert eng.get(path) == 200, path
    status, data = eng.post("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert status == 200 and data["text"]


def test_server_args_dump_parses_and_shows_resolution(engines: Start) -> None:
    eng = engines(["--model-path", MODEL])
    assert eng.wait_for_log("server_args={")
    line = next(ln for ln in eng.log().splitlines() if "server_args={" in ln)
    args = ast.literal_eval(line.split("server_args=", 1)[1])
    assert len(args) > 500
    assert args["mamba_radix_cache_strategy"] == "extra_buffer"
    assert args["mem_fraction_static"] == 0.907
    assert args["port"] == eng.port


def test_disable_overlap_makes_auto_no_buffer_and_spec_defaults(engines: Start) -> None:
    eng = engines(["--model-path", MODEL, "--disable-overlap-schedule", "--speculative-algorithm", "NEXTN"])
    assert eng.wait_for_log("server_args={")
    line = next(ln for ln in eng.log().splitlines() if "server_args={" in ln)
    args = ast.literal_eval(line.split("server_args=", 1)[1])
    assert args["mamba_radix_cache_strategy"] == "no_buffer"
    assert (args["speculative_algorithm"], args["speculative_num_steps"]) == ("EAGLE", 3)
    assert args["speculative_eagle_topk"] == 1 and args["speculative_num_draft_tokens"] == 4


def test_nothing_listens_while_loading_then_503_during_warmup(engines: Start) -> None:
    eng = engines(["--model-path", MODEL], {"STANDIN_STEP_S": "0.15", "STANDIN_READY_DELAY_S": "0.6"})
    assert eng.wait_for_log("Load weight begin")
    assert eng.get("/health", timeout=0.3) is None
    assert eng.wait_status("/health", 503)
    assert eng.get("/model_info") == 200
    assert "fired up" not in eng.log()
    assert eng.wait_status("/health", 200)


def test_sigterm_drains_then_exits_zero(engines: Start) -> None:
    eng = engines(["--model-path", MODEL], {"STANDIN_DRAIN_S": "1.0"})
    assert eng.wait_status("/health", 200)
    t0 = time.monotonic()
    os.killpg(eng.proc.pid, signal.SIGTERM)
    assert eng.wait_status("/health", 503, timeout=0.9), eng.log()[-1500:]
    assert eng.wait(timeout=3) == 0
    assert time.monotonic() - t0 < 2.5
    assert "Finished server process" in eng.log()


def test_unknown_flag_exits_2_with_real_usage(engines: Start) -> None:
    eng = engines(["--model-path", MODEL, "--bogus-flag", "1"])
    assert eng.wait() == 2
    log = eng.log()
    assert "usage: sglang serve [-h] --model-path MODEL_PATH" in log
    assert "sglang serve: error: unrecognized arguments: --bogus-flag 1" in log


def test_ambiguous_prefix_and_unique_prefix(engines: Start) -> None:
    eng = engines(["--model-path", MODEL, "--cuda-graph-max-bs", "4"])
    assert eng.wait() == 2
    assert ("sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
            "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill") in eng.log()
    ok = engines(["--model-path", MODEL, "--mem-frac", "0.8"])
    assert ok.wait_for_log("'mem_fraction_static': 0.8,")


@pytest.mark.parametrize(
    "version,flag,value,rejected",
    [
        ("0.5.23", "--mamba-scheduler-strategy", "extra_buffer", True),
        ("0.5.23", "--mamba-radix-cache-strategy", "extra_buffer_lazy", False),
        ("0.5.10", "--mamba-radix-cache-strategy", "extra_buffer", True),
        ("0.5.10", "--mamba-scheduler-strategy", "extra_buffer", False),
    ],
)
def test_era_flag_names(engines: Start, version: str, flag: str, value: str, rejected: bool) -> None:
    eng = engines(["--model-path", MODEL, flag, value], {"STANDIN_SGLANG_VERSION": version})
    if rejected:
        assert eng.wait() == 2
        assert f"sglang serve: error: unrecognized arguments: {flag} {value}" in eng.log()
    else:
        assert eng.wait_status("/health", 200)


def test_old_era_choices_and_version_attribute() -> None:
    out = subprocess.run(
        [PYTHON, "-c", "import sglang; print(sglang.__version__)"],
        env={"PYTHONPATH": str(STANDIN), "STANDIN_SGLANG_VERSION": "0.5.10"},
        capture_output=True, text=True, timeout=10,
    )
    assert out.stdout.strip() == "0.5.10"
    bad = subprocess.run(
        [PYTHON, "-m", "sglang.launch_server", "--model-path", MODEL, "--mamba-scheduler-strategy", "extra_buffer_lazy"],
        env={"PYTHONPATH": str(STANDIN), "STANDIN_SGLANG_VERSION": "0.5.10"},
        capture_output=True, text=True, timeout=10,
    )
    assert bad.returncode == 2
    assert "argument --mamba-scheduler-strategy: invalid choice: 'extra_buffer_lazy'" in bad.stderr


def test_scenario_old_era_spec_with_no_buffer_fails(engines: Start) -> None:
    eng = engines(["--model-path", MODEL, "--speculative-algorithm", "NEXTN"], {"STANDIN_SGLANG_VERSION": "0.5.10"})
    assert eng.wait() == 1
    log = eng.log()
    assert "Traceback (most recent call last):" in log
    assert log.rstrip().splitlines()[-1] == SCENARIO_TEXT
    assert "in _handle_mamba_radix_cache" in log


def test_scenario_fix_extra_buffer_and_spec_v2_starts(engines: Start) -> None:
    eng = engines(
        ["--model-path", MODEL, "--speculative-algorithm", "NEXTN", "--mamba-scheduler-strategy", "extra_buffer"],
        {"STANDIN_SGLANG_VERSION": "0.5.10", "SGLANG_ENABLE_SPEC_V2": "1"},
    )
    assert eng.wait_status("/health", 200)
    line = next(ln for ln in eng.log().splitlines() if "server_args=" in ln)
    assert "server_args=ServerArgs(model_path='Qwen/Qwen3.6-27B'" in line
    assert "mamba_scheduler_strategy='extra_buffer'" in line


def test_new_era_explicit_no_buffer_with_overlap_is_plain_traceback(engines: Start) -> None:
    eng = engines(["--model-path", MODEL, "--mamba-radix-cache-strategy", "no_buffer"])
    assert eng.wait() == 1
    assert eng.log().rstrip().endswith(
        "AssertionError: no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True.")
    assert "server_args=" not in eng.log()


def test_crash_is_scheduler_exception_then_sigkill(engines: Start) -> None:
    eng = engines(["--model-path", MODEL], {"STANDIN_MODE": "crash"})
    assert eng.wait() == -signal.SIGKILL
    log = eng.log()
    first = line_index(log, "Scheduler hit an exception: Traceback (most recent call last):")
    assert line_index(log, "RuntimeError: stand-in engine: unexpected fused kernel state") > first
    assert line_index(log, "Received sigquit from a child process. It usually means the child failed.") > first
    assert log.splitlines()[first + 1].startswith("  File ")


def test_sigkill_empty_prints_nothing(engines: Start) -> None:
    eng = engines(["--model-path", MODEL], {"STANDIN_MODE": "sigkill_empty"})
    assert eng.wait() == -signal.SIGKILL
    assert eng.log() == ""


def test_hang_prints_a_little_then_nothing(engines: Start) -> None:
    eng = engines(["--model-path", MODEL], {"STANDIN_MODE": "hang"})
    assert eng.wait_for_log("Load weight begin")
    size = len(eng.log())
    time.sleep(0.4)
    assert eng.proc.poll() is None and len(eng.log()) == size
    assert eng.get("/health", timeout=0.3) is None
    eng.kill_group()


def test_slow_spaces_progress_lines(engines: Start) -> None:
    eng = engines(["--model-path", MODEL], {"STANDIN_MODE": "slow", "STANDIN_STEP_S": "0.3"})
    assert eng.wait_for_log("Load weight begin")
    assert "Load weight end" not in eng.log()
    assert eng.wait_for_log("Load weight end", timeout=2)
    assert eng.wait_status("/health", 200, timeout=4)


def test_crash_after_ready_dies_by_sigkill(engines: Start) -> None:
    eng = engines(["--model-path", MODEL], {"STANDIN_MODE": "crash_after_ready", "STANDIN_CRASH_AFTER_S": "0.2"})
    assert eng.wait_status("/health", 200)
    assert eng.wait(timeout=3) == -signal.SIGKILL
    log = eng.log()
    assert line_index(log, "fired up") < line_index(log, "Scheduler hit an exception")
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in log


def test_crash_after_ready_with_chosen_signal(engines: Start) -> None:
    env = {"STANDIN_MODE": "crash_after_ready", "STANDIN_CRASH_AFTER_S": "0.1", "STANDIN_CRASH_SIGNAL": "SIGSEGV"}
    eng = engines(["--model-path", MODEL], env)
    assert eng.wait(timeout=3) == -signal.SIGSEGV
    assert "fired up" in eng.log()


def test_mem_weights_too_big_is_cuda_oom_while_loading(engines: Start) -> None:
    eng = engines(["--model-path", MODEL], {"STANDIN_MODE": "mem", "STANDIN_GPU_MEM_GB": "80",
                                            "STANDIN_WEIGHTS_GB": "120"})
    assert eng.wait() == -signal.SIGKILL
    log = eng.log()
    assert line_index(log, "Load weight begin") < line_index(log, "torch.OutOfMemoryError: CUDA out of memory.")
    assert "Load weight end" not in log


def test_mem_mfs_too_high_is_capture_failure(engines: Start) -> None:
    eng = engines(["--model-path", MODEL], {"STANDIN_MODE": "mem", "STANDIN_MAX_MFS": "0.85"})
    assert eng.wait() == -signal.SIGKILL
    log = eng.log()
    assert "Exception: Capture cuda graph failed: CUDA out of memory." in log
    assert "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)" in log
    assert "During handling of the above exception, another exception occurred:" in log


def test_mem_mfs_too_low_is_not_enough_memory(engines: Start) -> None:
    eng = engines(["--model-path", MODEL, "--mem-fraction-static", "0.3"],
                  {"STANDIN_MODE": "mem", "STANDIN_MIN_MFS": "0.5"})
    assert eng.wait() == -signal.SIGKILL
    assert ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            "Current value: mem_fraction_static=0.3") in eng.log()


def test_mem_fitting_config_starts(engines: Start) -> None:
    eng = engines(["--model-path", MODEL, "--mem-fraction-static", "0.8"],
                  {"STANDIN_MODE": "mem", "STANDIN_MAX_MFS": "0.85", "STANDIN_MIN_MFS": "0.5"})
    assert eng.wait_status("/health", 200)


def test_fail_text_replays_verbatim(engines: Start, tmp_path: Path) -> None:
    recorded = tmp_path / "real.log"
    recorded.write_bytes(b"[2026-01-01 00:00:00] something\nTraceback (most recent call last):\nX: y\n")
    eng = engines(["--model-path", MODEL], {"STANDIN_MODE": "fail_text", "STANDIN_FAIL_LOG": str(recorded),
                                            "STANDIN_EXIT": "3"})
    assert eng.wait() == 3
    assert eng.log() == recorded.read_text()


def test_port_busy_is_uvicorn_errno_98_after_loading(engines: Start) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        eng = engines(["--model-path", MODEL], port=port)
        assert eng.wait() == 1
    log = eng.log()
    text = f"[Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address already in use"
    assert line_index(log, "Load weight end") < line_index(log, text)


def test_scheduler_child_dies_with_the_group(engines: Start) -> None:
    eng = engines(["--model-path", MODEL])
    assert eng.wait_status("/health", 200)
    children = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == eng.proc.pid]
    assert any((p / "cmdline").read_bytes().startswith(b"sglang::scheduler") for p in children)
    eng.kill_group()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and any(_alive(p) for p in children):
        time.sleep(0.02)
    assert not any(_alive(p) for p in children)


def _ppid(proc_dir: Path) -> int:
    try:
        stat = (proc_dir / "stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


def _alive(proc_dir: Path) -> bool:
    try:
        return (proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_server_args_module_probe() -> None:
    code = ("import argparse; from sglang.srt.server_args import ServerArgs, prepare_server_args\n"
            "p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)\n"
            "print(len(p._actions), prepare_server_args(['--model-path', 'm', '--tp', '2']).tp_size)")
    out = subprocess.run([PYTHON, "-c", code], env={"PYTHONPATH": str(STANDIN)}, capture_output=True,
                         text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["532", "2"]


def _smi(args: List[str], env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    full_env = {"PATH": "/usr/bin:/bin", **(env or {})}
    return subprocess.run([str(NVIDIA_SMI), *args], capture_output=True, text=True, timeout=10, env=full_env)


def test_nvidia_smi_default_csv() -> None:
    out = _smi(["--query-gpu=index,name,uuid,memory.total,memory.used,memory.free,utilization.gpu",
                "--format=csv,noheader,nounits"])
    assert out.returncode == 0
    fields = out.stdout.strip().split(", ")
    assert fields[0:2] == ["0", "NVIDIA H200"] and fields[2].startswith("GPU-")
    assert fields[3:] == ["143771", "1", "143770", "0"]


def test_nvidia_smi_from_json_subset_apps_and_header(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"gpus": [
        {"name": "NVIDIA H100 80GB HBM3", "memory_total": 81559, "memory_used": 70000, "uuid": "GPU-aaa",
         "apps": [{"pid": 4242, "process_name": "python3", "used_memory": 69990}]},
        {"name": "NVIDIA H100 80GB HBM3", "memory_total": 81559},
    ]}))
    env = {"STANDIN_GPUS_FILE": str(gpus)}
    out = _smi(["--query-gpu=memory.free,index", "--format=csv,noheader,nounits"], env)
    assert out.stdout.splitlines() == ["11559, 0", "81559, 1"]
    out = _smi(["--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv,noheader,nounits"], env)
    assert out.stdout.splitlines() == ["4242, python3, 69990, GPU-aaa"]
    out = _smi(["--query-gpu=name,memory.total", "--format=csv"], env)
    assert out.stdout.splitlines()[0:2] == ["name, memory.total [MiB]", "NVIDIA H100 80GB HBM3, 81559 MiB"]
    assert "CUDA Version" in _smi(["--version"], env).stdout
    assert "Driver Version:" in _smi([], env).stdout
    assert _smi(["--query-gpu=bogus", "--format=csv"], env).returncode == 2
