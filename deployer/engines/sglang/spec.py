"""SGLang as an `Engine`: how it is launched, what its startup log says, its knowledge tables, its probe."""

from __future__ import annotations

import re
from pathlib import Path

from deployer.engines.base import Docs, Engine, Install, Knowledge, Launch, LogFormat, MultiNode, Phase, Probe
from deployer.engines.sglang import memory, probe

READY_LINE = "The server is fired up and ready to roll!"

# What only an SGLang log has (registry.detect): its args dump, its argparse prog, its own install paths.
LOG_MARKERS = (
    re.compile(r"server_args=(?:ServerArgs\(|\{)"),
    re.compile(r"^usage: sglang serve ", re.MULTILINE),
    re.compile(r"^sglang serve: error: ", re.MULTILINE),
    re.compile(r"/sglang/(?:launch_server\.py|srt/)"),
)

HERE = Path(__file__).parent

SGLANG = Engine(
    kind="sglang",
    launch=Launch(
        module="sglang.launch_server",
        template=HERE / "launch.sh.j2",
        # server_args.py (0.5.10 and 0.5.23): --tp-size/--tensor-parallel-size, --pp-size/--pipeline-parallel-size
        gpu_flags=(("tp_size", "tensor_parallel_size"), ("pp_size", "pipeline_parallel_size")),
        # server_args.py: --nnodes, --node-rank, --dist-init-addr HOST:PORT (rank 0 listens there). NCCL and torch's
        # Gloo pick their interface from NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME (sgl-project/sglang#3514). Ranks
        # >= 1 serve only utils/common.py:3684 launch_dummy_health_check_server, which logs the follower line
        # (0.5.23).
        multinode=MultiNode(nnodes="--nnodes", node_rank="--node-rank", dist_init_addr="--dist-init-addr",
                            nic_env=("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"),
                            follower_ready_line="Dummy health check server started in background thread at",
                            peer_failures=frozenset({"peer-connection-closed", "nccl-watchdog-timeout",
                                                     "nccl-remote-error", "dist-init-clients-missing"})),
        env_prefixes=("SGLANG_", "SGL_"),
        # Every option of the 0.5.23 parser that takes a credential (its help: "API key of the server", "admin API
        # key", "password to decrypt the SSL keyfile"); tests/unit/test_secrets.py checks this over the real table.
        secret_flags=frozenset({"api_key", "admin_api_key", "ssl_keyfile_password"}),
        # SGLang has no environment variable for --api-key or --admin-api-key (checked in the installed 0.5.10 and
        # 0.5.23 wheels: server_args.py, arg_groups/, environ.py read none): argv only. So they (every secret flag)
        # reach its argv through render's shim, in memory, never in /proc/PID/cmdline (docs/security.md).
        secret_env=(),
        secret_argv_shim=True,
        health_path="/health",
    ),
    log=LogFormat(
        ready_line=READY_LINE,
        phases=(
            Phase("args", re.compile(r"server_args=(ServerArgs\(|\{)")),
            Phase("loading weights", re.compile(r"Load weight begin")),
            Phase("weights loaded", re.compile(r"Load weight end")),
            Phase("allocating cache", re.compile(r"(Mamba|KV) Cache is allocated")),
            Phase("capturing cuda graphs", re.compile(r"Capture .*cuda graph", re.IGNORECASE)),
            Phase("http up", re.compile(r"Uvicorn running on")),
            Phase("ready", re.compile(re.escape(READY_LINE))),
        ),
        args_dump=re.compile(r"server_args=(ServerArgs\(|\{)"),
        markers=LOG_MARKERS,
        cli_prog="sglang serve",
        # mem_cache/memory_pool.py (0.5.x, GPU and the CPU engine alike): "KV Cache is allocated. dtype:
        # torch.bfloat16, #tokens: 8192, K size: 0.00 GB, V size: 0.00 GB" (its GB is 1024**3 bytes)
        kv_allocated=(re.compile(r"KV Cache is allocated\. .*?#tokens: (?P<tokens>[0-9,]+), "
                                 r"K size: (?P<k_gb>[0-9.]+) GB, V size: (?P<v_gb>[0-9.]+) GB"),),
    ),
    knowledge=Knowledge(
        signatures=HERE / "signatures.yaml",
        renames=HERE / "renames.yaml",
        followons=HERE / "followons.yaml",
        metrics=HERE / "metrics.yaml",
        releases=HERE / "releases.yaml",
        # arg_groups/speculative_hook.py (0.5.23): "NEXTN aliases EAGLE"; the resolved args say EAGLE
        value_aliases={"speculative_algorithm": {"NEXTN": "EAGLE"}},
    ),
    install=Install(package="sglang", distributions=probe.DISTRIBUTIONS),
    probe=Probe(script=Path(probe.__file__)),
    memory=memory.plan,
    docs=Docs(image_example="lmsysorg/sglang:v0.5.23"),
)
