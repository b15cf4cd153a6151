"""Failures raised by a library both engines share (safetensors, transformers, huggingface_hub, torch) are one
engine-neutral signature (engines/common/signatures.yaml), recognised the same for vLLM and SGLang (issue 39):
the real CPU captures of the same failure from each engine (tests/cases/{vllm,sglang}/, capture_real.py) get the
same diagnosis, and no engine's own file claims a library's text."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.diagnose.diagnosis import diagnose
from deployer.diagnose.signatures import common_signatures, engine_signatures
from deployer.engines import engine_for

CASES = Path(__file__).parent.parent / "cases"

# the same failure captured from each engine: (vLLM case, SGLang case) -> the common signature both must get
PAIRS: dict[tuple[str, str], str] = {
    ("corrupt-weights", "corrupt-weights"): "weights-file-damaged",
    ("truncated-weights", "truncated-weights"): "weights-file-damaged",
    ("truncated-bin-weights", "truncated-bin-weights"): "weights-checkpoint-damaged",
    ("config-not-json", "config-not-json"): "model-config-not-json",
    ("missing-weights", "missing-weights"): "model-weights-missing",
    ("missing-config", "missing-config"): "model-config-missing",
    ("bad-model-path", "real-bad-model-path"): "hf-repo-not-found",
    ("hf-offline-not-cached", "real-hf-offline-not-cached"): "hf-offline-not-cached",
    ("ipc-path-too-long", "ipc-path-too-long"): "ipc-path-too-long",
}

# texts a shared library raises: an engine's own signature must not match them (they belong to engines/common)
LIBRARY_TEXTS = [
    "safetensors._safetensors_rust.SafetensorError: Error while deserializing header: invalid header length",
    "safetensors_rust.SafetensorError: Error while deserializing header: incomplete metadata, file not fully covered",
    "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
    "'/nonexistent/tiny-llama'. Use `repo_type` argument if needed.",
    "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the "
    "cached files.",
    "ValueError: The repository x/y contains custom code which must be executed to correctly load the model.",
    'zmq.error.ZMQError: ipc path "/tmp/a/b" is longer than 107 characters (sizeof(sockaddr_un.sun_path)).',
    "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory. This is an "
    "internal miniz error.",
]


def _expected(engine: str) -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = yaml.safe_load((CASES / engine / "expected.yaml").read_text(encoding="utf-8"))
    return data


def _diagnosis(engine: str, name: str, *, neutral: bool = False) -> Any:
    exp = _expected(engine)[name]
    text = (CASES / engine / f"{name}.log").read_bytes().decode("utf-8")
    return diagnose(text, exit_code=exp.get("exit_code"), signal=exp.get("signal"),
                    engine=None if neutral else engine_for(engine))


@pytest.mark.parametrize("pair", sorted(PAIRS), ids="/".join)
def test_the_same_failure_gets_the_same_common_signature_from_both_engines(pair: tuple[str, str]) -> None:
    vllm_case, sglang_case = pair
    for engine, name in (("vllm", vllm_case), ("sglang", sglang_case)):
        assert _expected(engine)[name]["provenance"]["kind"] == "real CPU capture", (engine, name)
    got = {engine: _diagnosis(engine, name) for engine, name in (("vllm", vllm_case), ("sglang", sglang_case))}
    assert got["vllm"].signature == got["sglang"].signature == PAIRS[pair], {k: v.summary for k, v in got.items()}
    assert PAIRS[pair] in {s.id for s in common_signatures()}
    # the same answer without the engine's own file: nothing engine-specific is needed to recognise it
    for engine, name in (("vllm", vllm_case), ("sglang", sglang_case)):
        assert _diagnosis(engine, name, neutral=True).signature == PAIRS[pair], (engine, name)


@pytest.mark.parametrize("text", LIBRARY_TEXTS, ids=lambda t: t[:40])
def test_no_engine_claims_a_shared_librarys_text(text: str) -> None:
    assert any(s.search(text) for s in common_signatures()), text
    for kind in ("vllm", "sglang"):
        claimed = [s.id for s in engine_signatures(engine_for(kind)) if s.search(text)]
        assert not claimed, (kind, claimed)


def test_the_damaged_weights_summary_names_the_librarys_reason() -> None:
    for engine in ("vllm", "sglang"):
        for name, reason in (("corrupt-weights", "invalid header length"),
                             ("truncated-weights", "incomplete metadata, file not fully covered")):
            d = _diagnosis(engine, name)
            assert reason in d.summary, (engine, name, d.summary)
            assert d.hint and re.search(r"download", d.hint), d.hint
        checkpoint = _diagnosis(engine, "truncated-bin-weights")
        assert "(failed finding central directory)" in checkpoint.summary and "*.bin" in checkpoint.summary, \
            (engine, checkpoint.summary)
