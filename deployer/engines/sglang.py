"""SGLang engine knowledge: how it is launched, what its startup log says, where its data files are."""

from __future__ import annotations

import re

from deployer.engines.base import EngineSpec, Phase

READY_LINE = "The server is fired up and ready to roll!"

SGLANG = EngineSpec(
    kind="sglang",
    launch_module="sglang.launch_server",
    template="sglang.sh.j2",
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
    health_path="/health",
    signatures_file="sglang_signatures.yaml",
    renames_file="sglang_renames.yaml",
    # arg_groups/speculative_hook.py (0.5.23): "NEXTN aliases EAGLE"; the resolved args say EAGLE
    value_aliases={"speculative_algorithm": {"NEXTN": "EAGLE"}},
    package="sglang",
    args_dump=re.compile(r"server_args=(ServerArgs\(|\{)"),
    memory_plan=True,
    env_prefixes=("SGLANG_", "SGL_"),
)
