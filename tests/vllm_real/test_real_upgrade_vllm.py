"""`deploy upgrade` on real vLLM code (issue 39): a profile on the real-engine tier's vLLM 0.32.0 (the CPU build that
serves) moved to the parser tier's 0.33.0, both releases' own parsers and resolutions on one test bed: every flag
is kept (no renames table row fires between them), each value the two resolutions give differently is shown with
both releases' steps, and the memory plan on both.

The 0.32.0 venv is REAL_VLLM_VENV, else the one beside VLLM_VENV named like the Makefile's (`real-vllm-venv`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from realtier import engine_host
from sshbed import SSHD, free_port

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow("two real vLLM releases' parsers and dry resolutions")]
ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("VLLM_VENV", Path.home() / ".cache" / "deployer" / "vllm-venv"))   # as conftest.py
OLD_VENV = Path(os.environ.get("REAL_VLLM_VENV", VENV.parent / "real-vllm-venv"))


@pytest.fixture(scope="module")
def two_releases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    """The bed with `vllm-python` (0.33.0, the parser tier's) and `vllm-python-old` (0.32.0, the CPU build)."""
    assert (OLD_VENV / "bin" / "python").exists(), f"no real vLLM venv at {OLD_VENV} (scripts/build-real-vllm-venv.sh" \
                                                   f" {OLD_VENV}; or set REAL_VLLM_VENV)"
    for bed in engine_host(tmp_path_factory.mktemp("sshd-vllm-upgrade"), "vllm-python", "VLLM_TARGET_DEVICE=cpu",
                           VENV):
        old = bed.bin_dir / "vllm-python-old"
        old.write_text(f'#!/bin/sh\nexec {OLD_VENV / "bin" / "python"} "$@"\n')
        old.chmod(0o755)
        yield bed


def test_a_vllm_profile_moves_from_0320_to_0330_with_both_real_parsers(two_releases: SSHD, tmp_path: Path) -> None:
    model = ROOT / "tests" / "fixtures" / "models" / "qwen3-8b"
    profile = tmp_path / "v.yaml"
    profile.write_text(yaml.safe_dump({
        "name": "v", "target": two_releases.target(tmp_path / "work"),
        "engine": {"kind": "vllm", "python": "vllm-python-old", "model_path": str(model), "port": free_port(),
                   "args": {"max_model_len": "4k", "gpu_memory_utilization": 0.9, "enforce_eager": True}}}))
    ran = subprocess.run([sys.executable, "-m", "deployer.cli", "upgrade", str(profile), "--engine", "vllm==0.33.0",
                          "--python", "vllm-python", "--json"], capture_output=True, text=True, timeout=800, cwd=ROOT,
                         env={**os.environ, "DEPLOYER_HOME": str(tmp_path / "home")})
    assert ran.returncode == 0, ran.stderr[-3000:]
    plan = json.loads(ran.stdout.splitlines()[-1])
    assert (plan["from"], plan["to"], plan["ok"]) == ("0.32.0", "0.33.0", True), plan
    assert not [c for c in plan["changes"] if c["what"] in ("refused", "removed", "renamed")], plan["changes"]
    assert plan["engine_args"] == {"max_model_len": "4k", "gpu_memory_utilization": 0.9, "enforce_eager": True}
    assert all("dry resolution on both releases" in c["source"] for c in plan["changes"] if c["what"] == "resolves")
    rows = {m["row"]: m for m in plan["memory"]}
    assert rows["max_model_len"]["from"] == rows["max_model_len"]["to"] == "4000", rows
