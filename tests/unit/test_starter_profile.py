"""profiles/starter.yaml, the README's first deployment: a small public model on one GPU, reachable only through
an SSH port forward, valid with no secret set, every flag one that SGLang 0.5.23's real parser knows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployer.export.prometheus import metrics_switch
from deployer.profile.loader import load_profile
from deployer.render.bundle import render

REPO = Path(__file__).resolve().parents[2]
FLAG_TABLE = REPO / "tests" / "standin" / "sglang" / "srt" / "flags_0_5_23.json"  # generated from the real parser


def test_starter_needs_no_secret_and_uses_one_gpu_on_loopback() -> None:
    prof = load_profile(REPO / "profiles" / "starter.yaml", environ={})
    assert prof.name == "starter" and prof.engine.kind == "sglang"
    assert prof.engine.gpus == [0] and prof.engine.args.get("tp_size", 1) == 1
    assert prof.engine.host == "127.0.0.1"  # never public by default: README shows ssh -L and the 0.0.0.0 way
    assert prof.engine.model_path == "Qwen/Qwen3-0.6B"
    assert "HF_TOKEN" not in prof.engine.env


def test_starter_flags_are_real_sglang_flags() -> None:
    table = json.loads(FLAG_TABLE.read_text())
    dests = {a["dest"] for a in table["actions"]}
    prof = load_profile(REPO / "profiles" / "starter.yaml", environ={})
    assert set(prof.engine.args) <= dests, set(prof.engine.args) - dests
    argv = [str(w) for w in render(prof).argv]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "30000"


EXAMPLES = sorted(p.name for p in (REPO / "profiles").glob("*.yaml") if p.name != "base.yaml")


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_profile_turns_its_engines_metrics_on(name: str) -> None:
    """status, top and the dashboard show the engine's /metrics: SGLang serves them only with enable_metrics, vLLM
    unless disable_log_stats (the engines' metrics.yaml `switch`)."""
    prof = load_profile(REPO / "profiles" / name, environ={"HF_TOKEN": "x", "SGLANG_API_KEY": "x"})
    switch = metrics_switch(prof)
    assert switch is None or switch.serves(prof.engine.args), (name, switch and switch.fix)
