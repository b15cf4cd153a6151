"""Knowledge that covers every supported vLLM release (issue 39): each release engines/vllm/releases.yaml lists is
read from its own wheel (`pip download --no-deps vllm==X`: ~340 MB, no GPU, nothing installed; tests/release_wheels.py)
and every signature of engines/vllm/signatures.yaml whose `versions` take the release must find its words (a literal
run of one of its patterns) in the release's source, unless the words are a library's (LIBRARY, said why).
RELEASE_WHEELS keeps the wheels across runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from deployer.engines.common import SIGNATURES_FILE as COMMON
from deployer.engines.registry import engine_for
from deployer.engines.releases import load_releases
from release_wheels import ReleaseText, fetch_wheel, missing_words

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.slow("downloads and reads every supported release's wheel (~340 MB each)")]

KNOWLEDGE = engine_for("vllm").knowledge
RELEASES = load_releases(KNOWLEDGE)
assert RELEASES is not None
SIGNATURES = yaml.safe_load(KNOWLEDGE.signatures.read_text())["signatures"] if KNOWLEDGE.signatures else []
# Engine-neutral signatures (engines/common/signatures.yaml) whose words are not a library's but written in each
# engine's own source alike (SGLang's model loader descends from vLLM's): checked against every release as the
# engine's own are. The common ones that are a library's words (safetensors, transformers, huggingface_hub, torch)
# are not in the engine's wheel: tests/unit/test_shared_library_signatures.py holds them to the real captures.
IN_ENGINE_SOURCE = ("model-weights-missing", "model-config-missing")
SIGNATURES += [s for s in yaml.safe_load(COMMON.read_text())["signatures"] if s["id"] in IN_ENGINE_SOURCE]

LIBRARY = {
    "unrecognized-arguments": "argparse's error",
    "invalid-argument-value": "argparse's error",
    "cuda-graph-capture-oom": "torch's OutOfMemoryError in the traceback",
    "weights-oom": "torch's OutOfMemoryError in the traceback (0.34.0 dropped vLLM's own 'Failed to load model' line)",
}
WORDS = {   # f-strings: the words as the source spells them
    "worker-killed": "died unexpectedly (exit code: ",
    "worker-sigill": "died unexpectedly (exit code: ",
    "worker-died-by-signal": "died unexpectedly (exit code: ",
    "worker-died": "died unexpectedly (exit code: ",
}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kept = os.environ.get("RELEASE_WHEELS")
    return Path(kept) if kept else tmp_path_factory.mktemp("wheels")


@pytest.mark.parametrize("version", RELEASES.releases)
def test_every_signature_finds_its_words_in_the_release(version: str, wheels: Path) -> None:
    text = ReleaseText(fetch_wheel("vllm", version, wheels), "vllm")
    missing = missing_words(text, version, SIGNATURES, LIBRARY, WORDS)
    assert not missing, f"vllm {version}'s source has not the words of: {', '.join(missing)} (a new wording: add a " \
                        "pattern; a message the release no longer has: narrow the signature's `versions`)"
