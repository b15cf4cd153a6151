"""`deploy plan`'s memory picture end to end (issue 26, item 5): real sshd, the stand-in engine and its stand-in
nvidia-smi (one H200). Before a start: the per-GPU bar fitted to COLUMNS, in letters when piped, and the same
numbers in `plan --json`; after a start: what the engine's log says it allocated for its KV cache beside the
estimate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import REPO, deploy, write_profile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
MODEL = REPO / "tests" / "fixtures" / "models" / "qwen3-8b"


def test_the_plan_draws_each_gpus_budget_and_after_a_start_what_the_engine_allocated(
        tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "home"
    prof = write_profile(tmp_path, sshd, name="planmem", model=str(MODEL))
    before = deploy("plan", str(prof), home=home, env={"COLUMNS": "72"})
    assert before.returncode == 0, before.stderr
    lines = before.stdout.splitlines()
    at = lines.index("memory per GPU:")
    assert lines[at + 1] == "  GPU 0 NVIDIA H200: 140.4 GiB"
    drawn = lines[at + 2]
    assert len(drawn) == 72 and drawn.startswith("  [W") and drawn.endswith("]"), drawn
    assert set(drawn.strip()[1:-1]) <= set("WKMA.") and "K" in drawn and "A" in drawn
    assert "W weights 15." in lines[at + 3] and all(len(line) <= 72 for line in lines[at:]), lines[at:]
    assert "KV cache the engine allocated" not in before.stdout          # nothing started yet

    as_json = json.loads(deploy("plan", str(prof), "--json", home=home).stdout)
    (gpu,) = as_json["memory"]["budget"]
    assert gpu["gpu"] == 0 and gpu["name"] == "NVIDIA H200" and gpu["total_mib"] == 143771
    parts = gpu["weights_mib"] + gpu["kv_cache_mib"] + gpu["mamba_state_mib"] + gpu["activations_graphs_mib"]
    assert gpu["headroom_mib"] == pytest.approx(gpu["total_mib"] - parts, abs=0.5)
    assert as_json["memory"]["kv_estimate"]["kv_tokens"] == as_json["memory"]["kv_tokens"]
    assert as_json["allocated"] is None

    up = deploy("up", str(prof), "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        after = deploy("plan", str(prof), home=home, env={"COLUMNS": "100"})
        assert after.returncode == 0, after.stderr
        shown = after.stdout
        assert "KV cache the engine allocated (run " in shown and "deployer's estimate: " in shown, shown
        assert "from: KV Cache is allocated. dtype: torch.bfloat16, #tokens: " in shown
        data = json.loads(deploy("plan", str(prof), "--json", home=home).stdout)
        allocated = data["allocated"]
        assert allocated["kv_tokens"] > 0 and allocated["kv_cache_mib"] > 0 and allocated["run_id"]
        assert allocated["line"].startswith("KV Cache is allocated.")
    finally:
        deploy("down", str(prof), home=home)
