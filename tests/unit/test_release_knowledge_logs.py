"""Issue 39's knowledge fixes on logs (synthetic, saying so: built from the texts of the releases' wheels, see
tests/sglang_real/test_release_knowledge.py and tests/vllm_real/test_vllm_release_knowledge.py for the wheels themselves):
vLLM's data-parallel engine-core prefix `(EngineCore_DP0 pid=N)`, 0.34.0's wording of the no-cache-blocks error,
the signatures' release ranges, and a library's error (transformers' trust_remote_code) recognised the same for both
engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.diagnose.diagnosis import diagnose, first_traceback
from deployer.engines import engine_for
from deployer.engines.releases import load_releases

CASES = Path(__file__).resolve().parents[1] / "cases" / "vllm"


def as_data_parallel(name: str) -> str:
    """A real vLLM 0.32.0 CPU capture with its engine core's prefix as a data-parallel engine core prints it."""
    text = (CASES / name).read_bytes().decode("utf-8")
    assert "(EngineCore pid=" in text
    return text.replace("(EngineCore pid=", "(EngineCore_DP0 pid=")


def test_the_data_parallel_engine_core_prefix_is_read_like_the_plain_one() -> None:
    d = diagnose(as_data_parallel("kv-cache-too-small.log"), exit_code=1, engine=engine_for("vllm"),
                 engine_version="0.31.0")
    assert d.signature == "kv-cache-too-small-for-max-model-len"
    assert d.to_json()["remedy"]["args"] == {"max_model_len": 384}
    # the prefix is the logger's (its tag names the process), not part of the error text
    tb = first_traceback(as_data_parallel("kv-cache-too-small.log"), engine_for("vllm").log.prefix)
    assert tb is not None and tb.rank == "EngineCore_DP0" and tb.exception.startswith("ValueError: To serve")


def test_the_0340_wording_of_no_cache_blocks_is_known() -> None:
    text = (CASES / "no-memory-for-cache-blocks.log").read_bytes().decode("utf-8").replace(
        "Try increasing `gpu_memory_utilization` when initializing the engine (this flag also controls CPU memory "
        "reservation on the CPU backend, despite its name).", "Raise --gpu-memory-utilization.")
    assert "Try increasing" not in text
    d = diagnose(text, exit_code=1, engine=engine_for("vllm"), engine_version="0.34.0")
    assert d.signature == "no-memory-for-cache-blocks"


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_transformers_trust_remote_code_is_one_signature_for_every_engine(kind: str) -> None:
    text = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nValueError: The repository "
            "for Qwen/Q contains custom code which must be executed to correctly load the model. You can inspect "
            "the repository content at https://hf.co/Qwen/Q.\nPlease pass the argument `trust_remote_code=True` "
            "to allow custom code to be run.\n")
    d = diagnose(text, exit_code=1, engine=engine_for(kind))
    assert d.signature == "trust-remote-code"


def test_a_signature_is_not_matched_on_a_release_outside_its_range() -> None:
    seed = ("Traceback (most recent call last):\n  File \"s.py\", line 1, in f\nValueError: Speculative decoding for "
            "EAGLE is not compatible with radix cache when using --mamba-scheduler-strategy no_buffer. To use radix "
            "cache with speculative decoding, please use --mamba-scheduler-strategy extra_buffer and set "
            "SGLANG_ENABLE_SPEC_V2=1.\n")
    assert diagnose(seed, exit_code=1, engine=engine_for("sglang"), engine_version="0.5.13").signature == \
        "mamba-spec-needs-extra-buffer"
    assert diagnose(seed, exit_code=1, engine=engine_for("sglang"), engine_version="0.5.14").signature != \
        "mamba-spec-needs-extra-buffer"


def test_each_engine_declares_the_releases_it_covers() -> None:
    sglang, vllm = (load_releases(engine_for(k).knowledge) for k in ("sglang", "vllm"))
    assert sglang is not None and vllm is not None
    assert sglang.releases[0] == "0.5.10" and sglang.releases[-1] == "0.5.23" and len(sglang.releases) == 18
    assert all(sglang.supports(v) for v in sglang.releases) and not sglang.supports("0.5.24")
    assert vllm.releases == ("0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0") and not vllm.supports("0.29.0")
    assert not vllm.supports("unknown")
