"""vLLM as an `Engine`: how it is launched, what its startup log says, its knowledge tables, its probe.

Texts are vLLM 0.33.0's (paths relative to vllm/ in the wheel) and the real 0.32.0 CPU build's (its captures in
tests/cases/vllm/, e.g. good-startup.log): the logger prefix `(APIServer pid=N) INFO 12-01 18:09:45 [entry.py:140] `
(logger.py _FORMAT; also `(EngineCore pid=N)`, `(Worker pid=N)`, `(VllmWorker-0 pid=N)`), the startup lines of
entrypoints/launchers/launcher.py:367-368 (0.32.0: api_utils.py:286) and api_server/entry.py:139-140, uvicorn's own
lines (`INFO:     Application startup complete.`, no logger prefix).
"""

from __future__ import annotations

import re
from pathlib import Path

from deployer.engines.base import Docs, Engine, Install, Knowledge, Launch, LogFormat, Phase, Probe
from deployer.engines.vllm import memory, probe

READY_LINE = "Application startup complete."

# logger.py:28 _FORMAT, with the optional VLLM_LOGGING_PREFIX before it; older releases (<0.11) printed
# `INFO 11-30 23:40:00 [file.py:1] ` without the process tag.
LOG_PREFIX = re.compile(
    r"^(?:[^(\n]*?\((?P<tag>[A-Za-z][\w-]*) pid=\d+\) )?"
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]\n]*:\d+\] ?"
)

# What only a vLLM log has (registry.detect): its logger prefix with a vLLM process tag, the args dump, its argparse
# prog (`vllm serve` / `python -m vllm.entrypoints.openai.api_server` -> api_server.py), its entry module's path.
LOG_MARKERS = (
    re.compile(r"^\((?:APIServer|EngineCore|Worker|VllmWorker|ApiServer)[\w-]* pid=\d+\) "
               r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d", re.MULTILINE),
    # releases before 0.11 printed the same prefix without the process tag
    re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] ", re.MULTILINE),
    re.compile(r"non-default args: \{"),
    re.compile(r"^usage: (?:vllm|api_server\.py) ", re.MULTILINE),
    re.compile(r"^(?:vllm(?: serve)?|api_server\.py): error: ", re.MULTILINE),
    re.compile(r"/vllm/entrypoints/(?:openai/api_server|cli/main)\.py"),
)

HERE = Path(__file__).parent

VLLM = Engine(
    kind="vllm",
    launch=Launch(
        module="vllm.entrypoints.openai.api_server",
        template=HERE / "launch.sh.j2",
        # The api_server module ignores the positional model_tag (only `vllm serve` reads it): --model it is.
        model_flag="model",
        # 89 of vLLM 0.33.0's 94 boolean flags are --x/--no-x (several default to None or True): false must be
        # said. The 5 plain store_true ones (--headless, --grpc, --disable-log-stats, --aggregate-engine-logging,
        # --data-parallel-multi-port-external-lb) have no --no- form: leave them out rather than false.
        false_prefix="--no-",
        # arg_utils.py (0.33.0): --tensor-parallel-size/-tp, --pipeline-parallel-size/-pp
        gpu_flags=(("tensor_parallel_size",), ("pipeline_parallel_size",)),
        env_prefixes=("VLLM_",),
        # entrypoints/common/startup.py:51 redacts these in 0.33.0; older releases printed them in clear.
        secret_flags=frozenset({"api_key", "hf_token"}),
        # envs.py VLLM_API_KEY: the OpenAI server's auth middleware takes `args.api_key or envs.VLLM_API_KEY` (seen
        # in the api_server sources of the code index; the 0.32.0 CPU and 0.33.0 wheels were not at hand to check).
        # --hf-token has no variable of vLLM's own (HF_TOKEN is huggingface_hub's): it stays an argv word.
        secret_env=(("api_key", "VLLM_API_KEY"),),
        health_path="/health",
        # engine/arg_utils.py:1902 (0.32.0; 0.33.0 :1941) --shutdown-timeout, int, default 0 = abort what is in
        # flight; >0: the API server (entrypoints/launchers/launcher.py:267) and EngineCore (v1/engine/core.py:1632)
        # drain for that long ("[shutdown] EngineCore: draining in-flight requests")
        drain_flag="shutdown_timeout",
        # added by vllm-project/vllm#34730, first released in v0.18.0 (llm-d/llm-d#927: "Available in: vLLM
        # v0.18.0+"); an older vLLM rejects it as an unrecognized argument, so render leaves it out there
        drain_since="0.18.0",
    ),
    log=LogFormat(
        ready_line=READY_LINE,
        phases=(
            Phase("args", re.compile(r"non-default args: \{")),
            Phase("loading weights", re.compile(r"Starting to load model ")),
            # GPU: gpu_model_runner "Model loading took N GiB"; the CPU build (0.32.0) says only
            # default_loader.py:501 "Loading weights took N seconds" (the GPU build prints that line too, just
            # before)
            Phase("weights loaded", re.compile(r"Model loading took [0-9.]+ GiB|Loading weights took [0-9.]+ seconds")),
            # GPU: "Available KV cache memory: N GiB" (gpu_worker), "GPU KV cache size: N tokens"; CPU 0.32.0:
            # kv_cache_utils.py:2327 "CPU KV cache size: 2,097,152 tokens"
            Phase("allocating cache", re.compile(r"(Available KV cache memory:|KV cache size: [0-9,]+ tokens)")),
            Phase("capturing cuda graphs", re.compile(r"Capturing CUDA graphs|Graph capturing finished")),
            # 0.33.0 says "Starting vLLM server on http://...", releases before 0.11 "Starting vLLM API server"
            Phase("http up", re.compile(r"Starting vLLM (API )?server")),
            Phase("ready", re.compile(re.escape(READY_LINE))),
        ),
        # launcher.py:368 logs the parsed args that differ from the parser's defaults, not resolved values:
        # a flag the profile set to the default is absent from the dump, which is no drift.
        args_dump=re.compile(r"non-default args: (\{)"),
        args_dump_complete=False,
        # GPU 0.33.0: gpu_worker "Available KV cache memory: 30.25 GiB", kv_cache_utils "GPU KV cache size:
        # 1,234,560 tokens"; the CPU build 0.32.0: kv_cache_utils.py:2327 "CPU KV cache size: 2,097,152 tokens"
        kv_allocated=(re.compile(r"Available KV cache memory: (?P<gib>[0-9.]+) GiB"),
                      re.compile(r"[GC]PU KV cache size: (?P<tokens>[0-9,]+) tokens")),
        prefix=LOG_PREFIX,
        markers=LOG_MARKERS,
        cli_prog="vllm serve",
    ),
    knowledge=Knowledge(signatures=HERE / "signatures.yaml", metrics=HERE / "metrics.yaml",
                        releases=HERE / "releases.yaml"),
    install=Install(package="vllm", distributions=probe.DISTRIBUTIONS),
    probe=Probe(script=Path(probe.__file__)),
    memory=memory.plan,
    docs=Docs(image_example="vllm/vllm-openai:v0.33.0"),
)
