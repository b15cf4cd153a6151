"""Against real vLLM 0.33.0 code on the CPU: the stand-in's flag table, the probe, and preflight over SSH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.preflight.flags import parse_probe_output
from deployer.preflight.checks import run_preflight
from deployer.profile.model import Profile
from deployer.remote.base import Remote
from deployer.remote.connect import connect

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("VLLM_VENV", Path.home() / ".cache" / "deployer" / "vllm-venv"))
STANDIN = ROOT / "tests" / "standin"

PROBE = ROOT / "deployer" / "engines" / "vllm" / "probe.py"
TABLE = STANDIN / "vllm" / "entrypoints" / "openai" / "flags_0_33_0.json"
REAL_ENV = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}


def _probe(python: str, env: dict[str, str], *argv: str) -> dict[str, Any]:
    out = subprocess.run([python, str(PROBE), *argv], capture_output=True, text=True, env=env, timeout=600)
    data = parse_probe_output(out.stdout)
    assert data is not None, out.stdout[-2000:] + out.stderr[-2000:]
    return data


@pytest.fixture(scope="module")
def real_probe() -> dict[str, Any]:
    return _probe(str(VENV / "bin" / "python"), REAL_ENV, "--flags", "--resolve", "--model", "Qwen/Qwen3-8B",
                  "--max_model_len", "4k", "--api-key", "sk-real-1", "--no-enable-prefix-caching")


def test_committed_flag_table_is_the_real_parsers(tmp_path: Path) -> None:
    """tests/standin's table regenerated from the real parser now: identical, so the stand-in is not made up."""
    out = tmp_path / "flags.json"
    subprocess.run([str(VENV / "bin" / "python"), str(ROOT / "tests/standin/tools/gen_vllm_flags.py"), "--out",
                    str(out)], check=True, env=REAL_ENV, timeout=600, capture_output=True)
    assert json.loads(out.read_text()) == json.loads(TABLE.read_text())


def test_probe_sees_the_same_flags_on_real_vllm_and_the_standin(real_probe: dict[str, Any]) -> None:
    env = {**os.environ, "PYTHONPATH": str(STANDIN)}
    standin = _probe(sys.executable, env, "--flags", "--resolve", "--model", "Qwen/Qwen3-8B", "--max_model_len", "4k",
                     "--api-key", "sk-real-1", "--no-enable-prefix-caching")
    assert real_probe["version"] == standin["version"] == "0.33.0"

    def table(data: dict[str, Any]) -> dict[str, Any]:
        return {f["dest"]: (f["options"], f["takes_value"], f["choices"], f["nargs"]) for f in data["flags"]}

    assert len(real_probe["flags"]) > 300 and table(real_probe) == table(standin)
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in real_probe["env_names"]
    # the same parse: human-readable ints, the api key redacted, a hidden --no-enable-x form
    assert real_probe["resolve"] == standin["resolve"]
    assert real_probe["resolve"]["resolved"] == {"api_key": "***", "model": "Qwen/Qwen3-8B", "max_model_len": 4000,
                                                 "enable_prefix_caching": False}


def test_unknown_flag_error_line_is_the_real_one() -> None:
    argv = ("--resolve", "--model", "Qwen/Qwen3-8B", "--mem-fraction-static", "0.8")
    real = _probe(str(VENV / "bin" / "python"), REAL_ENV, *argv)["resolve"]
    standin = _probe(sys.executable, {**os.environ, "PYTHONPATH": str(STANDIN)}, *argv)["resolve"]
    # "0.8" is taken by the positional model_tag, so only the flag is unrecognized (real argparse behaviour)
    assert real == standin == {"ok": False, "supported": True, "stage": "parse",
                               "error": "probe.py: error: unrecognized arguments: --mem-fraction-static"}


@pytest.fixture(scope="module")
def remote(vllm_host: Any) -> Iterator[Remote]:
    r = connect(vllm_host.spec())
    try:
        yield r
    finally:
        r.close()


def test_preflight_checks_a_vllm_profile_against_the_targets_real_parser(vllm_host: Any, remote: Remote,
                                                                          tmp_path: Path) -> None:
    def profile(args: dict[str, Any]) -> Profile:
        return Profile.model_validate({
            "name": "real-vllm", "target": vllm_host.target(tmp_path / "work"),
            "engine": {"kind": "vllm", "python": "vllm-python", "model_path": "Qwen/Qwen3-8B", "port": 8000,
                       "args": args}})

    bad = run_preflight(remote, profile({"mem_fraction_static": 0.8}), cache_dir=tmp_path / "cache")
    assert bad.engine_version == "0.33.0"
    assert any("mem_fraction_static" in p or "mem-fraction-static" in p for p in bad.problems), bad.problems
    good = run_preflight(remote, profile({"max_model_len": "4k", "gpu_memory_utilization": 0.9}),
                         cache_dir=tmp_path / "cache")
    assert not good.problems, good.problems
    assert good.resolved is not None and good.resolved["max_model_len"] == 4000


def test_the_memory_plan_uses_the_real_parsers_resolution(vllm_host: Any, remote: Remote, tmp_path: Path) -> None:
    """vLLM's own parser turns `4k` into 4000 in the dry resolution; the plan (model config on the target, GPUs from
    the stand-in nvidia-smi) sizes the KV cache for that, not for the model's 40960."""
    model = ROOT / "tests" / "fixtures" / "models" / "qwen3-8b"
    prof = Profile.model_validate({
        "name": "real-vllm", "target": vllm_host.target(tmp_path / "work"),
        "engine": {"kind": "vllm", "python": "vllm-python", "model_path": str(model), "port": 8000,
                   "args": {"max_model_len": "4k", "gpu_memory_utilization": 0.9}}})
    report = run_preflight(remote, prof, cache_dir=tmp_path / "cache")
    assert report.resolved is not None and report.resolved["max_model_len"] == 4000, report.resolution
    assert report.memory is not None and report.memory.fits, report.problems
    rows = dict(report.memory.rows())
    assert rows["max_model_len"] == "4000" and rows["KV blocks x block size"].endswith("(2359296 bytes each)")
