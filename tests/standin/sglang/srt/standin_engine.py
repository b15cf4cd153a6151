"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product.

The startup sequence of the stand-in engine and its failure modes. Lines, order and error texts are the
real ones (see /work/shared/sglang-facts.md); numbers come from the small capacity model in
standin_model.py.

Env knobs (all optional):

| env                     | default | meaning |
|-------------------------|---------|---------|
| STANDIN_MODE            | ok      | ok, crash, sigkill_empty, hang, slow, crash_after_ready, mem, fail_text, download, download_frozen, download_quiet, download_hub |
| STANDIN_STEP_S          | 0.01    | pause between progress lines (slow mode: 0.5 when unset) |
| STANDIN_READY_DELAY_S   | 0.05    | warmup time: HTTP up, /health 503, before "fired up" |
| STANDIN_CRASH_AFTER_S   | 0.3     | crash_after_ready: seconds of readiness before dying |
| STANDIN_CRASH_SIGNAL    | (none)  | crash_after_ready: die by this signal (name or number) instead of a scheduler traceback |
| STANDIN_GPU_MEM_GB      | 140.4   | pretended GPU memory (GiB); H200 = 143771 MiB |
| STANDIN_WEIGHTS_GB      | min(16, mem/4) | pretended weight size (GiB) |
| STANDIN_MIN_MFS         | (weights+1)/mem | mem mode: below it -> "Not enough memory" |
| STANDIN_MAX_MFS         | 1.0     | mem mode: above it -> "Capture cuda graph failed" |
| STANDIN_DRAIN_S         | 0.1     | after SIGTERM: seconds of draining (/health 503) before exit 0 |
| STANDIN_FAIL_LOG        |         | fail_text: file printed verbatim |
| STANDIN_HEALTH_SLOW_S   | 0       | /health and /health_generate keep answering 503 this long after the ready line |
| STANDIN_CHAT_TEXT       | (hello) | content of /v1/chat/completions answers ("" -> an empty answer) |
| STANDIN_CHAT_STATUS     | 200     | HTTP status of /v1/chat/completions (non-200 -> an OpenAI-style error) |
| STANDIN_CHAT_DELAY_S    | 0       | seconds each /v1/chat/completions answer takes (requests in flight during a stop) |
| STANDIN_DEAD_CORE_FILE  | (none)  | while this file exists the engine core is dead: completions hang, /health 503 after SGLANG_HEALTH_CHECK_TIMEOUT (standin_core.py) |
| STANDIN_EXIT            | 1       | fail_text: exit status; 128+N or -N means death by signal N |
| STANDIN_BIND_FAILURE    | exit    | the HTTP port taken: exit (logs uvicorn's bind error, exits 1) or hang (as real 0.5.23 does: the error, then never exits, SIGTERM ignored) |

Modes:
- ok: the full real log sequence, HTTP up after loading, 503 during warmup, 200 when ready.
- crash: a scheduler traceback nobody has a signature for, then the sigquit line and SIGKILL (137).
- sigkill_empty: SIGKILLs itself before printing anything (handled in launch_server).
- hang: server_args + "Load weight begin" then silence until killed (capped at 1 hour).
- slow: ok, with progress lines spaced by STANDIN_STEP_S.
- crash_after_ready: ok, then after STANDIN_CRASH_AFTER_S a scheduler failure (or STANDIN_CRASH_SIGNAL).
- mem: weights > GPU -> torch.OutOfMemoryError while loading; mfs > STANDIN_MAX_MFS -> "Capture cuda graph
  failed: ... Possible solutions: ..."; mfs < STANDIN_MIN_MFS -> "Not enough memory. Please try to
  increase --mem-fraction-static." (all in the scheduler exception form, exit 137).
- fail_text: prints STANDIN_FAIL_LOG verbatim, exits with STANDIN_EXIT (handled in launch_server).
- download: ok, with the weights downloaded first after "Load weight begin": huggingface_hub's tqdm bars on
  stderr, \r-redrawn with no newline (standin_download.py has its knobs).
- download_frozen: the download stops part-way and its bar never moves again (until killed, capped at 1 hour).
- download_quiet: the download as it really goes under a supervisor (bars off without a terminal): no output,
  the files grow in the hub cache.
- download_hub: the engine downloads the model's files itself, for real, from HF_ENDPOINT (the hub stand-in,
  tests/standin/hubstub.py) while it loads, as an engine does without deployer's `engine.weights`.

HF_HUB_OFFLINE=1 with a hub id as the model (deployer's `engine.weights`): the snapshot of --revision (a commit,
or what refs/<revision> names) must be in the hub cache, as huggingface_hub requires offline; else its error and
exit 1. The snapshot used is logged ("standin: weights from <dir>"); a local directory (`engine.weights.push`)
must hold config.json, and is logged so too.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from types import SimpleNamespace
from typing import Any, Optional

from sglang.srt import standin_download, standin_http, standin_model, standin_multinode
from sglang.srt.server_args import ServerArgs, server_args_log_text

logger = logging.getLogger("sglang.srt.entrypoints.engine")

CUDA_GRAPH_CAPTURE_FAILED_MSG = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)
HANG_CAP_S = 3600.0


class OutOfMemoryError(RuntimeError):
    """Prints as torch.OutOfMemoryError in tracebacks, like the real one."""


OutOfMemoryError.__module__ = "torch"


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default


def mode() -> str:
    return os.environ.get("STANDIN_MODE", "ok").strip() or "ok"


def step() -> None:
    default = 0.5 if mode() == "slow" else 0.01
    time.sleep(env_float("STANDIN_STEP_S", default))


def uvicorn_log(level: str, message: str) -> None:
    prefix = f"{level}:".ljust(10)
    sys.stderr.write(f"[{standin_http.stamp()}] {prefix}{message}\n")
    sys.stderr.flush()


def oom_text(tried_gb: float, total_gb: float, free_gb: float) -> str:
    used = total_gb - free_gb
    return (
        f"CUDA out of memory. Tried to allocate {tried_gb:.2f} GiB. GPU 0 has a total capacity of "
        f"{total_gb:.2f} GiB of which {free_gb:.2f} GiB is free. Including non-PyTorch memory, this process "
        f"has {used:.2f} GiB memory in use. Of the allocated memory {max(used - 0.5, 0):.2f} GiB is allocated "
        "by PyTorch, and 27.43 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory "
        "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


class ModelRunner:
    """The scheduler-side work: weights, memory pools, CUDA graphs (all pretended)."""

    def __init__(self, view: SimpleNamespace, cap: standin_model.Capacity) -> None:
        self.view = view
        self.cap = cap
        self.arch = standin_model.architecture(view.model_path)
        self.avail = cap.gpu_gb - 0.6
        self.max_total_num_tokens = 0

    def initialize(self) -> None:
        self.load_model()
        self.init_memory_pool()
        if getattr(self.view, "device", None) != "cpu":   # the real CPU engine captures no CUDA graphs
            self.init_device_graphs()

    def load_model(self) -> None:
        logger.info(f"Load weight begin. avail mem={self.avail:.2f} GB")
        if mode() == "hang":
            deadline = time.monotonic() + HANG_CAP_S
            while time.monotonic() < deadline:
                time.sleep(1.0)
        if mode() in ("download", "download_frozen"):
            standin_download.download(frozen=mode() == "download_frozen")
        if mode() == "download_quiet":
            standin_download.download_quiet(self.view.model_path)
        if mode() == "download_hub":
            standin_download.download_hub(self.view.model_path)
        step()
        if mode() == "mem" and self.cap.weights_gb > self.avail:
            raise OutOfMemoryError(oom_text(1.0, self.cap.gpu_gb, self.avail - (self.cap.weights_gb % 1)))
        if mode() == "crash":
            self._unknown_failure()
        self.avail -= self.cap.weights_gb
        logger.info(
            f"Load weight end. elapsed={env_float('STANDIN_STEP_S', 0.01):.2f} s, type={self.arch}, "
            f"avail mem={self.avail:.2f} GB, mem usage={self.cap.weights_gb:.2f} GB."
        )

    def _unknown_failure(self) -> None:
        raise RuntimeError("stand-in engine: unexpected fused kernel state (STANDIN_MODE=crash)")

    def init_memory_pool(self) -> None:
        mfs = float(self.view.mem_fraction_static)
        rest = self.avail - self.cap.gpu_gb * (1 - mfs)
        if mode() == "mem" and mfs < self.cap.min_mfs:
            rest = 0.0
        tokens = int(max(rest, 0.0) * (1 << 30) / 65536) if mode() == "mem" else max(int(rest * 16384), 4096)
        if standin_model.is_hybrid(self.arch) and tokens > 0:
            logger.info(
                f"Mamba Cache is allocated. max_mamba_cache_size: {int(self.view.max_running_requests or 48) * 3}, "
                f"conv_state size: {rest * 0.01:.2f}GB, ssm_state size: {rest * 0.3:.2f}GB "
            )
        self.max_total_num_tokens = tokens
        MemoryPoolConfig(max_total_num_tokens=tokens, mem_fraction_static=mfs)
        kv = tokens * 65536 / (1 << 30)
        logger.info(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, "
                    f"K size: {kv / 2:.2f} GB, V size: {kv / 2:.2f} GB")
        self.avail -= max(rest, 0.0)
        step()
        logger.info(f"Memory pool end. avail mem={self.avail:.2f} GB")

    def init_device_graphs(self) -> None:
        spec = self.view.speculative_algorithm is not None
        name = "target verify" if spec else "target decode"
        per_req = int(self.view.speculative_num_draft_tokens or 1) if spec else 1
        logger.info(f"Capture {name} CUDA graph begin. backend=full, num_tokens_per_req={per_req}, "
                    f"avail mem={self.avail:.2f} GB")
        step()
        if mode() == "mem" and float(self.view.mem_fraction_static) > self.cap.max_mfs:
            DecodeCudaGraphRunner(self.avail)
        self.avail -= 0.4
        logger.info(f"Capture {name} CUDA graph end. elapsed=0.52 s, mem usage=0.40 GB, "
                    f"avail mem={self.avail:.2f} GB.")


class MemoryPoolConfig:
    def __init__(self, max_total_num_tokens: int, mem_fraction_static: Optional[float]) -> None:
        self.max_total_num_tokens = max_total_num_tokens
        self.mem_fraction_static = mem_fraction_static
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.max_total_num_tokens <= 0:
            msg = "Not enough memory. Please try to increase --mem-fraction-static."
            if self.mem_fraction_static is not None:
                msg += f" Current value: mem_fraction_static={self.mem_fraction_static}"
            raise RuntimeError(msg)


class DecodeCudaGraphRunner:
    def __init__(self, avail: float) -> None:
        self.avail = avail
        try:
            self.capture()
        except RuntimeError as e:
            raise Exception(f"Capture cuda graph failed: {e}\n{CUDA_GRAPH_CAPTURE_FAILED_MSG}")

    def capture(self) -> None:
        raise OutOfMemoryError(oom_text(2.0, self.avail + 120.0, min(self.avail, 0.35)))


def run_scheduler_process(view: SimpleNamespace, cap: standin_model.Capacity) -> ModelRunner:
    runner = ModelRunner(view, cap)
    runner.initialize()
    logger.info(
        f"max_total_num_tokens={runner.max_total_num_tokens}, chunked_prefill_size={view.chunked_prefill_size}, "
        f"max_prefill_tokens={view.max_prefill_tokens}, max_running_requests={view.max_running_requests or 2048}, "
        f"context_len={view.context_length or 262144}, available_gpu_mem={runner.avail:.2f} GB"
    )
    return runner


class Engine:
    """Main-process side: child 'scheduler', sigquit handling, uvicorn imitation, warmup, SIGTERM."""

    def __init__(self, server_args: ServerArgs) -> None:
        self.server_args = server_args
        self.view = server_args.resolved_view()
        self.child: Optional[subprocess.Popen] = None
        self.stop = threading.Event()
        self.server: Any = None
        self.group: Optional[standin_multinode.Group] = None  # set on a multi-node engine (--nnodes > 1)
        self.state = standin_http.EngineState(self.view.model_path, {"version": _version(), **_jsonable(self.view)})
        # uvicorn's access log follows --log-level-http (else --log-level): warning and above hide request lines
        level = str(getattr(self.view, "log_level_http", None) or getattr(self.view, "log_level", None) or "info")
        self.state.access_log = level.lower() in ("debug", "info", "trace")

    def kill_process_tree(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
        os.kill(os.getpid(), signal.SIGKILL)

    def on_sigquit(self, signum: int, frame: Any) -> None:
        logger.error("Received sigquit from a child process. It usually means the child failed.")
        self.kill_process_tree()

    def scheduler_failed(self) -> None:
        logger.error(f"Scheduler hit an exception: {traceback.format_exc()}")
        os.kill(os.getpid(), signal.SIGQUIT)
        time.sleep(5)  # the sigquit handler ends the process; never reached

    def spawn_scheduler(self) -> None:
        code = ("import ctypes,os,signal,sys,time\n"
                "ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"  # PR_SET_PDEATHSIG, like real children
                f"if os.getppid() != {os.getpid()}: sys.exit(0)\n"  # parent gone before the prctl: no signal comes
                "[time.sleep(1) for _ in range(86400)]\n")
        self.child = subprocess.Popen(["sglang::scheduler", "-S", "-c", code], executable=sys.executable,
                                      stdin=subprocess.DEVNULL)

    def launch(self) -> int:
        logger.info(f"server_args={server_args_log_text(self.server_args)}")
        offline_snapshot(self.server_args)
        signal.signal(signal.SIGQUIT, self.on_sigquit)
        self.spawn_scheduler()
        t0 = time.monotonic()
        try:
            with standin_multinode.scheduler_ranks(self.view) as self.group:
                run_scheduler_process(self.view, standin_model.Capacity.from_env())
        except Exception:
            self.scheduler_failed()
        if self.group is not None and self.group.node_rank > 0:
            return self.group.serve_follower()  # no tokenizer manager there: no timings line, no API
        if self.group is not None:  # rank 0 of a group: generations need the group's steps (standin_multinode)
            self.group.on_step = self.state.metrics.stepped
            self.state.steps = self.group.wait_steps
        elapsed = time.monotonic() - t0
        logger.info(f"Engine startup timings (s): load_weight={elapsed / 3:.2f}, kv_cache_allocation="
                    f"{elapsed / 3:.2f}, scheduler_e2e={elapsed:.2f}, cuda_graph={{decode=0.52}}, "
                    f"tokenizer_e2e={elapsed + 0.05:.2f}")
        return self.serve()

    def serve(self) -> int:
        uvicorn_log("INFO", f"Started server process [{os.getpid()}]")
        uvicorn_log("INFO", "Waiting for application startup.")
        uvicorn_log("INFO", "Application startup complete.")
        host, port = self.view.host, int(self.view.port)
        self.server, err = standin_http.bind(host, port, self.state)
        if err is not None:
            uvicorn_log("ERROR", f"[Errno {err.errno}] error while attempting to bind on address "
                                 f"('{host}', {port}): {(err.strerror or '').lower()}")
            uvicorn_log("INFO", "Waiting for application shutdown.")
            if os.environ.get("STANDIN_BIND_FAILURE", "exit") == "hang":
                # Real SGLang 0.5.23 stops here for good (tests/cases/sglang/real-port-in-use.log): no "shutdown
                # complete", no exit, and a SIGTERM is not acted on (only its scheduler dies); SIGKILL ends it.
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                deadline = time.monotonic() + HANG_CAP_S
                while time.monotonic() < deadline:
                    time.sleep(1.0)
            uvicorn_log("INFO", "Application shutdown complete.")
            return 1
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        uvicorn_log("INFO", f"Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
        signal.signal(signal.SIGTERM, self.on_sigterm)
        threading.Thread(target=self.warmup, daemon=True).start()
        # Poll: a signal may land on a server thread, and Python handlers only run on the main thread.
        while not self.stop.wait(0.05):
            pass
        return self.shutdown()

    def warmup(self) -> None:
        base = f"http://{_connect_host(self.view.host)}:{self.view.port}"
        time.sleep(env_float("STANDIN_READY_DELAY_S", 0.05))
        key = getattr(self.view, "api_key", None)  # http_server.py _wait_and_warmup sends it, as a client would
        auth = {"authorization": f"Bearer {key}"} if key else {}
        try:
            urllib.request.urlopen(urllib.request.Request(base + "/model_info", headers=auth), timeout=5).read()
            logger.info("Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, "
                        "#running-req: 0, #queue-req: 0, input throughput (token/s): 0.00, cuda graph: False")
            req = urllib.request.Request(base + "/generate", method="POST",
                                         headers={"content-type": "application/json", **auth},
                                         data=b'{"text": "The capital city of France is", '
                                              b'"sampling_params": {"temperature": 0, "max_new_tokens": 8}}')
            urllib.request.urlopen(req, timeout=5).read()
        except OSError as exc:
            logger.error(f"Initialization failed. warmup error: {exc!r}")
            self.kill_process_tree()
        if self.state.get_phase() == "draining":
            return
        self.state.set_phase("ready")
        logger.info("The server is fired up and ready to roll!")
        if mode() == "crash_after_ready":
            self.crash_later()

    def crash_later(self) -> None:
        time.sleep(env_float("STANDIN_CRASH_AFTER_S", 0.3))
        sig = os.environ.get("STANDIN_CRASH_SIGNAL", "").strip()
        if sig:
            number = int(sig) if sig.isdigit() else int(getattr(signal, sig if sig.startswith("SIG") else "SIG" + sig))
            if self.child is not None:
                self.child.kill()
            os.kill(os.getpid(), number)
            return
        try:
            raise RuntimeError("CUDA error: an illegal memory access was encountered\n"
                               "CUDA kernel errors might be asynchronously reported at some other API call, "
                               "so the stacktrace below might be incorrect.")
        except RuntimeError:
            self.scheduler_failed()

    def on_sigterm(self, signum: int, frame: Any) -> None:
        logger.info(f"SIGTERM received. {signum=} {frame=}. Draining requests and shutting down...")
        self.state.set_phase("draining")
        self.stop.set()

    def shutdown(self) -> int:
        time.sleep(env_float("STANDIN_DRAIN_S", 0.1))  # drain window: /health answers 503 meanwhile
        if self.group is not None:
            self.group.broadcast_shutdown()
        uvicorn_log("INFO", "Shutting down")
        self.server.shutdown()
        self.server.server_close()
        uvicorn_log("INFO", "Waiting for application shutdown.")
        uvicorn_log("INFO", "Application shutdown complete.")
        uvicorn_log("INFO", f"Finished server process [{os.getpid()}]")
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.wait(timeout=5)
        return 0


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _version() -> str:
    from sglang.version import __version__

    return __version__


def _jsonable(view: SimpleNamespace) -> dict:
    return {k: v for k, v in vars(view).items() if isinstance(v, (str, int, float, bool, type(None), list))}


def offline_snapshot(server_args: ServerArgs) -> None:
    """HF_HUB_OFFLINE=1 and a hub id: the cached snapshot, as huggingface_hub finds it offline, or its error."""
    model = str(server_args.model_path)
    if os.environ.get("HF_HUB_OFFLINE") == "1" and os.path.isdir(model):  # a local directory (a pushed one)
        if not os.path.isfile(os.path.join(model, "config.json")):
            sys.stderr.write(f"OSError: {model} does not appear to have a file named config.json.\n")
            sys.stderr.flush()
            sys.exit(1)
        logger.info(f"standin: weights from {model}")
        return
    if os.environ.get("HF_HUB_OFFLINE") != "1" or os.path.isdir(model) or model.count("/") != 1:
        return
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
    folder = os.path.join(hub, "models--" + model.replace("/", "--"))
    revision = getattr(server_args, "revision", None) or "main"
    commit = revision
    ref = os.path.join(folder, "refs", revision)
    if os.path.isfile(ref):
        with open(ref, encoding="utf-8") as fh:
            commit = fh.read().strip()
    snapshot = os.path.join(folder, "snapshots", commit)
    config = os.path.join(snapshot, "config.json")
    if not os.path.isfile(config):  # a dangling link (its blob missing) counts as missing too
        sys.stderr.write("huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached "
                         "snapshot folder for the specified revision on the local disk and outgoing traffic has "
                         "been disabled. To enable repo look-ups and downloads online, pass "
                         "'local_files_only=False' as input.\n")
        sys.stderr.flush()
        sys.exit(1)
    logger.info(f"standin: weights from {snapshot}")


def launch_server(server_args: ServerArgs) -> int:
    return Engine(server_args).launch()
