"""STAND-IN for tests: imitates vLLM 0.33.0 (no GPU here); never used by the product.

The startup of `python -m vllm.entrypoints.openai.api_server` and its failures, with vLLM 0.33.0's texts
(file:line in vllm/ given where each is printed). Memory is a small model of vLLM's own arithmetic, so a
profile fails or fits the way it would on the pretended GPU and a remedy computed from a message works:

  budget = gpu_memory_utilization * total;  KV = budget - weights - activation peak - CUDA graph estimate
  a request of max_model_len needs ceil(max_model_len / block_size) * block_size * kv_bytes_per_token

| env                     | default       | meaning |
|-------------------------|---------------|---------|
| STANDIN_MODE            | ok            | ok, crash, sigkill_empty, hang, crash_after_ready, worker_killed_after_ready, sampler_oom, cudagraph_oom, fail_text |
| STANDIN_GPU_GB          | 139.8         | pretended total GPU memory (GiB; an H200) |
| STANDIN_GPU_FREE_GB     | total - 0.5   | free at startup (other processes hold the rest) |
| STANDIN_GPU_CC          | 9.0           | compute capability; below 8.0 bfloat16 fails |
| STANDIN_GPU_NAME        | NVIDIA H200   | GPU name in messages |
| STANDIN_WEIGHTS_GB      | from model    | weight size (GiB) |
| STANDIN_KV_BYTES_PER_TOKEN | from model | KV cache bytes per token (all layers) |
| STANDIN_DERIVED_MAX_LEN | from model    | max_position_embeddings of the model's config.json |
| STANDIN_STEP_S          | 0.01          | pause between progress lines |
| STANDIN_READY_DELAY_S   | 0.05          | between the engine being up and uvicorn's startup complete |
| STANDIN_DRAIN_S         | 0.1           | after SIGTERM: seconds before exit 0 |
| STANDIN_CRASH_AFTER_S   | 0.3           | crash_after_ready, worker_killed_after_ready: seconds of readiness before the engine core / worker dies |
| STANDIN_CHAT_TEXT       | (hello)       | content of /v1/chat/completions answers |
| STANDIN_DEAD_CORE_FILE  | (none)        | while this file exists the engine core is dead: /health 200, completions hang (standin_core.py) |
| STANDIN_SERVES_MODEL    | (none)        | STAND-IN ONLY: serve this model name instead of --served-model-name/--model (as a launch wrapper that rewrites the name would): a request for the profile's name then gets real vLLM's 404 "The model `X` does not exist." (vllm/entrypoints/openai/models/serving.py:58, 0.32.0) |
| STANDIN_FAIL_LOG / STANDIN_EXIT | | fail_text: file printed verbatim, exit status |
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

from vllm import __version__
from vllm.standin_http import EngineState, bind
from vllm.standin_log import Frame, env_float, env_str, log, raw, traceback_text, tqdm_bar, uvicorn

GIB = float(1 << 30)
BLOCK_SIZE = 16
ACTIVATION_PEAK_GB = 1.2
CUDAGRAPH_GB = 0.56
# (weights GiB, KV bytes per token, max_position_embeddings, architecture) of the models the tests name.
MODELS = {
    "qwen3-8b": (15.27, 147456, 40960, "Qwen3ForCausalLM"),
    "qwen3-0.6b": (1.12, 114688, 40960, "Qwen3ForCausalLM"),
    "llama-3.1-8b-instruct": (14.99, 131072, 131072, "LlamaForCausalLM"),
}
DEFAULT_MODEL = (15.27, 147456, 40960, "Qwen3ForCausalLM")
CORE = "EngineCore"


class StandinExit(Exception):
    """A failure already printed: exit with this code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def mode() -> str:
    return os.environ.get("STANDIN_MODE", "ok").strip() or "ok"


def step() -> None:
    time.sleep(env_float("STANDIN_STEP_S", 0.01))


def fmt_gib(n: float) -> str:
    """utils/mem_utils.py format_gib: two decimals."""
    return f"{n:.2f}"


class Gpu:
    def __init__(self) -> None:
        self.total = env_float("STANDIN_GPU_GB", 139.8)
        self.free = env_float("STANDIN_GPU_FREE_GB", self.total - 0.5)
        self.cc = env_float("STANDIN_GPU_CC", 9.0)
        self.name = env_str("STANDIN_GPU_NAME", "NVIDIA H200")


class Model:
    def __init__(self, name: str) -> None:
        weights, per_token, derived, arch = MODELS.get(name.rstrip("/").split("/")[-1].lower(), DEFAULT_MODEL)
        self.name = name
        self.weights = env_float("STANDIN_WEIGHTS_GB", weights)
        self.per_token = int(env_float("STANDIN_KV_BYTES_PER_TOKEN", per_token))
        self.derived = int(env_float("STANDIN_DERIVED_MAX_LEN", derived))
        self.arch = arch


def non_default_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Dict[str, Any]:
    """entrypoints/common/startup.py:63 get_non_default_args + :53 redact_sensitive_args (0.33.0)."""
    defaults = vars(parser.parse_args([]))
    changed = {k: v for k, v in vars(args).items() if defaults.get(k) != v}
    sensitive = {"api_key", "hf_token", "watermark_config"}
    if os.environ.get("STANDIN_VLLM_CLEAR_SECRETS") == "1":  # releases before the redaction printed them
        return changed
    return {k: ("***" if k in sensitive else v) for k, v in changed.items()}


class Server:
    """The API server process and (pretended) its EngineCore child."""

    def __init__(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        self.parser, self.args = parser, args
        self.pid = os.getpid()
        self.child: Optional[subprocess.Popen] = None
        self.core_pid = 0
        self.gpu = Gpu()
        self.model = Model(args.model)
        self.max_len = 0
        self.stop = threading.Event()
        self.state = EngineState(os.environ.get("STANDIN_SERVES_MODEL") or
                                 (args.served_model_name[0] if args.served_model_name else args.model))

    def api(self, level: str, where: str, message: str) -> None:
        log("APIServer", self.pid, level, where, message)

    def core(self, level: str, where: str, message: str) -> None:
        log(CORE, self.core_pid, level, where, message)

    # --- startup --------------------------------------------------------------------------------

    def run(self) -> int:
        self.api("INFO", "launcher.py:367",
                 f"vLLM server version {__version__}, serving model {self.args.model}")
        self.api("INFO", "launcher.py:368", f"non-default args: {non_default_args(self.parser, self.args)}")
        server = self.bind_early()
        signal.signal(signal.SIGTERM, self.on_sigterm_early)
        self.config()
        self.spawn_core()
        try:
            self.engine_core()
        except StandinExit as failed:
            self.kill_core()
            return failed.code
        self.api("INFO", "entry.py:135", "Supported tasks: ['generate']")
        return self.serve(server)

    def bind_early(self) -> Any:
        """launcher.py:359 setup_server binds before the engine starts (a busy port fails at once)."""
        server, err = bind(self.args.host or "0.0.0.0", int(self.args.port), self.state)
        if err is None:
            return server
        frames: List[Frame] = [
            ("<frozen runpy>", 198, "_run_module_as_main", ""),
            ("entrypoints/launchers/api_server/entry.py", 176, "run_server",
             "listen_address, sock = setup_server(args, reuse_port=False)"),
            ("entrypoints/launchers/launcher.py", 380, "setup_server",
             "sock = create_server_socket(sock_addr, reuse_port=reuse_port)"),
            ("entrypoints/launchers/launcher.py", 349, "create_server_socket", "sock.bind(addr)"),
        ]
        raw(traceback_text(frames, f"OSError: [Errno {err.errno}] {err.strerror}"))
        sys.exit(1)

    def config(self) -> None:
        """config/model.py: the architecture, then max_model_len against the model's derived limit."""
        self.api("INFO", "model.py:744", f"Resolved architecture: {self.model.arch}")
        asked = self.args.max_model_len
        if asked is not None and asked > 0 and asked > self.model.derived:
            msg = (f"User-specified max_model_len ({asked}) is greater than the derived max_model_len "
                   f"(max_position_embeddings={float(self.model.derived)} or model_max_length=None in model's "
                   "config.json). To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
                   "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative "
                   "position encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the model "
                   "uses absolute position encoding, positions exceeding derived_max_model_len will cause a CUDA "
                   "array out-of-bounds error.")
            frames: List[Frame] = [
                ("<frozen runpy>", 198, "_run_module_as_main", ""),
                ("entrypoints/launchers/api_server/entry.py", 230, "main", "uvloop.run(run_server(args))"),
                ("entrypoints/launchers/api_server/entry.py", 81, "build_async_engine_client_from_engine_args",
                 "vllm_config = engine_args.create_engine_config(usage_context=usage_context)"),
                ("/usr/local/lib/python3.12/dist-packages/pydantic/_internal/_dataclasses.py", 121, "__init__",
                 "s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)"),
            ]
            exc = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
                   f"  Value error, {msg} [type=value_error, input_value=ArgsKwargs((), {{'model': "
                   f"'{self.args.model}', ...}}), input_type=ArgsKwargs]\n"
                   "    For further information visit https://errors.pydantic.dev/2.14/v/value_error")
            raw(traceback_text(frames, exc))
            sys.exit(1)
        self.max_len = asked if asked is not None and asked > 0 else self.model.derived
        self.api("INFO", "model.py:2170", f"Using max model len {self.max_len}")
        self.api("INFO", "scheduler.py:311", "Chunked prefill is enabled with max_num_batched_tokens=8192.")

    def spawn_core(self) -> None:
        code = ("import ctypes,os,signal,sys,time\n"
                "ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"  # PR_SET_PDEATHSIG, like the real child
                f"if os.getppid() != {os.getpid()}: sys.exit(0)\n"  # parent gone before the prctl: no signal comes
                "[time.sleep(1) for _ in range(86400)]\n")
        self.child = subprocess.Popen(["VLLM::EngineCore", "-S", "-c", code], executable=sys.executable,
                                      stdin=subprocess.DEVNULL)
        self.core_pid = self.child.pid

    def kill_core(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.wait(timeout=5)

    def engine_core(self) -> None:
        a = self.args
        self.core("INFO", "core.py:140",
                  f"Initializing a V1 LLM engine (v{__version__}) with config: model='{a.model}', "
                  f"speculative_config=None, tokenizer='{a.tokenizer or a.model}', dtype={a.dtype}, "
                  f"max_seq_len={self.max_len}, tensor_parallel_size={a.tensor_parallel_size}, "
                  f"enforce_eager={bool(a.enforce_eager)}, kv_cache_dtype={a.kv_cache_dtype}, seed={a.seed}")
        util = float(a.gpu_memory_utilization)
        budget = util * self.gpu.total
        if self.gpu.free < budget:
            self.core_failed(
                [("v1/engine/core.py", 150, "__init__", "self.model_executor = executor_class(vllm_config)"),
                 ("v1/worker/gpu_worker.py", 542, "init_device", "self.requested_memory = request_memory("),
                 ("v1/worker/utils.py", 762, "request_memory", "raise ValueError(")],
                f"ValueError: Free memory on device cuda:0 ({fmt_gib(self.gpu.free)}/{fmt_gib(self.gpu.total)} GiB) "
                f"on startup is less than desired GPU memory utilization ({util}, {fmt_gib(budget)} GiB). "
                "Decrease GPU memory utilization or reduce GPU memory used by other processes.")
        if a.dtype in ("auto", "bfloat16") and self.gpu.cc < 8.0:
            self.core_failed(
                [("v1/engine/core.py", 150, "__init__", "self.model_executor = executor_class(vllm_config)"),
                 ("v1/worker/gpu_worker.py", 498, "init_device",
                  "current_platform.check_if_supports_dtype(self.model_config.dtype)"),
                 ("platforms/cuda.py", 650, "check_if_supports_dtype", "raise ValueError(")],
                "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. "
                f"Your {self.gpu.name} GPU has compute capability {self.gpu.cc:.1f}. You can use float16 instead "
                "by explicitly setting the `dtype` flag in CLI, for example: --dtype=half.")
        self.load_weights(budget)
        self.kv_cache(budget)
        self.warm_up()

    def load_weights(self, budget: float) -> None:
        self.core("INFO", "gpu_model_runner.py:4979", f"Starting to load model {self.args.model}...")
        if mode() == "hang":
            deadline = time.monotonic() + 3600
            while time.monotonic() < deadline:
                time.sleep(1.0)
        step()
        if mode() == "crash":
            self.core_failed([("v1/engine/core.py", 150, "__init__",
                               "self.model_executor = executor_class(vllm_config)")],
                             "RuntimeError: stand-in engine: unexpected fused kernel state (STANDIN_MODE=crash)")
        if self.model.weights > self.gpu.free:
            oom = self.oom_text(1.0, self.gpu.free - self.model.weights % 1)
            self.core("ERROR", "gpu_model_runner.py:5086",
                      "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to free "
                      "memory for weights, increasing --tensor-parallel-size, or using --quantization. See "
                      "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more tips. "
                      f"(original error: {oom})")
            self.core_failed([("v1/worker/gpu_worker.py", 601, "load_model",
                               "self.model_runner.load_model(load_dummy_weights=load_dummy_weights)")],
                             f"torch.OutOfMemoryError: {oom}")
        shards = max(1, int(self.model.weights // 4) + 1)
        tqdm_bar("Loading safetensors checkpoint shards", shards)
        self.core("INFO", "default_loader.py:507", "Loading weights took 3.21 seconds")
        self.core("INFO", "gpu_model_runner.py:5089",
                  f"Model loading took {fmt_gib(self.model.weights)} GiB memory and 4.118262 seconds")

    def kv_cache(self, budget: float) -> None:
        step()
        avail = budget - self.model.weights - ACTIVATION_PEAK_GB - (0 if self.args.enforce_eager else CUDAGRAPH_GB)
        avail_bytes = int(avail * GIB)
        frames: List[Frame] = [
            ("v1/engine/core.py", 163, "__init__", "kv_cache_config = self._initialize_kv_caches(vllm_config)"),
            ("v1/engine/core.py", 321, "_initialize_kv_caches", "kv_cache_configs = get_kv_cache_configs("),
            ("v1/core/kv_cache_planning.py", 1554, "get_kv_cache_configs", "_check_enough_kv_cache_memory("),
        ]
        if avail_bytes <= 0:
            self.core_failed(frames + [("v1/core/kv_cache_planning.py", 57, "_check_enough_kv_cache_memory",
                                        "raise ValueError(")],
                             "ValueError: No available memory for the cache blocks. Try increasing "
                             "`gpu_memory_utilization` when initializing the engine (this flag also controls CPU "
                             "memory reservation on the CPU backend, despite its name). See "
                             "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
        self.core("INFO", "gpu_worker.py:773", f"Available KV cache memory: {fmt_gib(avail)} GiB")
        page = BLOCK_SIZE * self.model.per_token
        needed = -(-self.max_len // BLOCK_SIZE) * page
        if needed > avail_bytes:
            estimated = (avail_bytes // page) * BLOCK_SIZE
            note = (f"Based on the available memory, the estimated maximum model length is {estimated}. "
                    if estimated > 0 else "")
            self.core_failed(frames + [("v1/core/kv_cache_planning.py", 77, "_check_enough_kv_cache_memory",
                                        "raise ValueError(")],
                             f"ValueError: To serve at least one request with the model's max seq len "
                             f"({self.max_len}), ({fmt_gib(needed / GIB)} GiB KV cache is needed, which is larger "
                             f"than the available KV cache memory ({fmt_gib(avail)} GiB). {note}Try increasing "
                             "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or "
                             "decreasing `max_model_len` when initializing the engine. See "
                             "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
        tokens = (avail_bytes // page) * BLOCK_SIZE
        self.core("INFO", "kv_cache_utils.py:1148",
                  f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for {self.max_len:,} tokens per "
                  f"request: {tokens / self.max_len:.2f}x")

    def warm_up(self) -> None:
        step()
        if not self.args.enforce_eager:
            if mode() == "cudagraph_oom":
                tqdm_bar("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", 51)
                self.core_failed(
                    [("v1/engine/core.py", 389, "_initialize_kv_caches",
                      "self.model_executor.compile_or_warm_up_model()"),
                     ("v1/worker/gpu_worker.py", 994, "compile_or_warm_up_model",
                      "cuda_graph_memory_bytes = self.model_runner.capture_model()"),
                     ("v1/worker/gpu_model_runner.py", 6417, "capture_model", ""),
                     ("v1/worker/gpu_model_runner.py", 6571, "_capture_cudagraphs", "")],
                    f"torch.OutOfMemoryError: {self.oom_text(0.5, 0.31)}")
            tqdm_bar("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", 51)
            tqdm_bar("Capturing CUDA graphs (decode, FULL)", 35)
            self.core("INFO", "gpu_model_runner.py:6516", f"Graph capturing finished in 3 secs, took {CUDAGRAPH_GB:.2f} GiB")
        if mode() == "sampler_oom":
            seqs = int(self.args.max_num_seqs or 256)
            self.core_failed(
                [("v1/engine/core.py", 389, "_initialize_kv_caches", "self.model_executor.compile_or_warm_up_model()"),
                 ("v1/worker/gpu_worker.py", 1090, "compile_or_warm_up_model",
                  "self.model_runner._dummy_sampler_run(hidden_states=last_hidden_states)"),
                 ("v1/worker/gpu_model_runner.py", 5929, "_dummy_sampler_run", "raise RuntimeError(")],
                f"RuntimeError: CUDA out of memory occurred when warming up sampler with {seqs} dummy requests. "
                "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.")
        self.core("INFO", "core.py:413", "init engine (profile, create kv cache, warmup model) took 21.37 s")

    def oom_text(self, tried: float, free: float) -> str:
        used = self.gpu.total - free
        return (f"CUDA out of memory. Tried to allocate {tried:.2f} GiB. GPU 0 has a total capacity of "
                f"{self.gpu.total:.2f} GiB of which {max(free, 0):.2f} GiB is free. Including non-PyTorch memory, this "
                f"process has {used:.2f} GiB memory in use. Of the allocated memory {max(used - 0.5, 0):.2f} GiB is "
                "allocated by PyTorch, and 27.43 MiB is reserved by PyTorch but unallocated.")

    def core_failed(self, frames: List[Frame], exception: str) -> None:
        """An EngineCore startup failure as 0.33.0 prints it: the core's logger.exception (core.py:1584),
        multiprocessing's own traceback of the dead process, then the API server's wrapper (exit 1)."""
        head: List[Frame] = [("v1/engine/core.py", 1555, "run_engine_core",
                              "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)"),
                             ("v1/engine/core.py", 1232, "__init__", "super().__init__(")]
        text = traceback_text(head + frames, exception)
        self.core("ERROR", "core.py:1584", "EngineCore failed to start.\n" + text)
        mp: List[Frame] = [("/usr/lib/python3.12/multiprocessing/process.py", 314, "_bootstrap", "self.run()"),
                           ("/usr/lib/python3.12/multiprocessing/process.py", 108, "run",
                            "self._target(*self._args, **self._kwargs)")]
        raw("Process EngineCore:\n" + traceback_text(mp + head + frames, exception))
        api: List[Frame] = [
            ("<frozen runpy>", 198, "_run_module_as_main", ""),
            ("entrypoints/launchers/api_server/entry.py", 230, "main", "uvloop.run(run_server(args))"),
            ("entrypoints/launchers/api_server/entry.py", 93, "build_async_engine_client_from_engine_args",
             "async_llm = AsyncLLM.from_vllm_config("),
            ("v1/engine/utils.py", 1393, "launch_core_engines", "wait_for_engine_startup("),
            ("v1/engine/utils.py", 1473, "wait_for_engine_startup", "raise RuntimeError("),
        ]
        raw(traceback_text(api, "RuntimeError: Engine core initialization failed. See root cause above. "
                                "Failed core proc(s): {'EngineCore': 1}"))
        raise StandinExit(1)

    # --- serving --------------------------------------------------------------------------------

    def serve(self, server: Any) -> int:
        host = self.args.host or "0.0.0.0"
        self.api("INFO", "entry.py:139", f"Starting vLLM server on http://{host}:{self.args.port}")
        self.api("INFO", "launcher.py:188", "Available routes are:")
        for path, methods in (("/health", "GET"), ("/v1/models", "GET"), ("/v1/chat/completions", "POST"),
                              ("/version", "GET"), ("/ping", "GET, POST")):
            self.api("INFO", "launcher.py:196", f"Route: {path}, Methods: {methods}")
        uvicorn("INFO", f"Started server process [{self.pid}]")
        uvicorn("INFO", "Waiting for application startup.")
        time.sleep(env_float("STANDIN_READY_DELAY_S", 0.05))
        # as the real server: `args.api_key or [envs.VLLM_API_KEY]` (deployer passes the key in the environment)
        self.state.api_key = (self.args.api_key or [os.environ.get("VLLM_API_KEY")])[0]
        self.state.access_log = not self.args.disable_uvicorn_access_log
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.state.set_phase("ready")
        uvicorn("INFO", "Application startup complete.")
        signal.signal(signal.SIGTERM, self.on_sigterm)
        if mode() == "crash_after_ready":
            threading.Thread(target=self.crash_later, daemon=True).start()
        if mode() == "worker_killed_after_ready":
            threading.Thread(target=self.worker_killed_later, daemon=True).start()
        while not self.stop.wait(0.05):
            pass
        return self.shutdown(server)

    def crash_later(self) -> None:
        time.sleep(env_float("STANDIN_CRASH_AFTER_S", 0.3))
        frames: List[Frame] = [("v1/engine/core.py", 1566, "run_engine_core", "engine_core.run_busy_loop()")]
        self.core("ERROR", "core.py:1586", "EngineCore encountered a fatal error.\n" + traceback_text(
            frames, "RuntimeError: CUDA error: an illegal memory access was encountered"))
        self.kill_core()
        self.api("ERROR", "async_llm.py:701", "AsyncLLM output_handler failed.")
        self.state.set_phase("dead")
        self.stop.set()

    def worker_killed_later(self) -> None:
        """What real vLLM 0.32.0 prints when its worker is SIGKILLed while serving (the OOM killer), as captured in
        tests/cases/vllm/worker-killed.log (file:line of 0.32.0): /health 503 at once, then the API server shuts
        down and exits 0 (main)."""
        time.sleep(env_float("STANDIN_CRASH_AFTER_S", 0.3))
        self.core("ERROR", "multiproc_executor.py:315",
                  "Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor.")
        self.core("INFO", "multiproc_executor.py:479", "[shutdown] Executor: waiting for worker exit count=0")
        self.core("INFO", "multiproc_executor.py:486", "[shutdown] Executor: all workers exited gracefully")
        core: List[Frame] = [
            ("v1/engine/core.py", 1496, "run_engine_core", "engine_core.run_busy_loop()"),
            ("v1/engine/core.py", 1551, "run_busy_loop", "self._process_input_queue()"),
            ("v1/engine/core.py", 1589, "_process_input_queue", "self._handle_client_request(*req)"),
            ("v1/engine/core.py", 1702, "_handle_client_request", 'raise RuntimeError("Executor failed.")'),
        ]
        self.core("ERROR", "core.py:1512", "EngineCore encountered a fatal error.\n"
                  + traceback_text(core, "RuntimeError: Executor failed."))
        self.state.set_phase("dead")
        api: List[Frame] = [
            ("v1/engine/async_llm.py", 849, "output_handler", "outputs = await engine_core.get_output_async()"),
            ("v1/engine/core_client.py", 1235, "get_output_async", "raise self._format_exception(outputs) from None"),
        ]
        self.api("ERROR", "async_llm.py:906", "AsyncLLM output_handler failed.\n" + traceback_text(
            api, "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
                 "(above) for the root cause."))
        raw("Process EngineCore:\n" + traceback_text(core, "RuntimeError: Executor failed."))
        self.kill_core()
        time.sleep(env_float("STANDIN_DRAIN_S", 0.1))
        self.worker_killed = True
        self.stop.set()

    def on_sigterm_early(self, signum: int, frame: Any) -> None:
        """entry.py:172: SIGTERM before uvicorn runs interrupts the initialization."""
        self.kill_core()
        raise KeyboardInterrupt("terminated")

    def on_sigterm(self, signum: int, frame: Any) -> None:
        self.state.set_phase("draining")
        self.stop.set()

    def shutdown(self, server: Any) -> int:
        dead = self.state.get_phase() == "dead"
        time.sleep(0 if dead else env_float("STANDIN_DRAIN_S", 0.1))
        uvicorn("INFO", "Shutting down")
        server.shutdown()
        server.server_close()
        uvicorn("INFO", "Waiting for application shutdown.")
        uvicorn("INFO", "Application shutdown complete.")
        uvicorn("INFO", f"Finished server process [{self.pid}]")
        self.kill_core()
        if getattr(self, "worker_killed", False):
            return 0        # real 0.32.0: the API server exits 0 after its worker was killed
        return 1 if dead else 0


def run_server(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    return Server(parser, args).run()
