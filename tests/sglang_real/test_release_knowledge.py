"""Knowledge that covers every supported SGLang release (issue 39): each release engines/sglang/releases.yaml lists is
read from its own wheel (`pip download --no-deps sglang==X`: no GPU, nothing installed; tests/release_wheels.py)
and checked against what deployer knows of it:

- every signature of engines/sglang/signatures.yaml whose `versions` take the release finds its words (a literal
  run of one of its patterns) in the release's source, unless the words are a library's (LIBRARY, said why);
- every follow-on check (followons.yaml) finds its message in each release its `versions` take;
- every renames.yaml row holds: the old name defined before the rename or removal, the new name from `since`,
  the old option gone from `removed`;
- every flag the seed era's real parser has and 0.5.23's real parser does not is a rename or a documented
  removal in the table (the real parsers' tables: tests/standin/sglang/srt/flags_0_5_*.json).

Runs in the tier's 0.5.23 pass (the wheels, not the venv, are what it reads); RELEASE_WHEELS keeps the wheels.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from deployer.engines.followons import load_followons
from deployer.engines.common import SIGNATURES_FILE as COMMON
from deployer.engines.registry import engine_for
from deployer.engines.releases import load_releases
from deployer.engines.renames import load_renames
from deployer.flag_names import key_option
from deployer.versions import at_least, version_in
from release_wheels import ReleaseText, fetch_wheel, missing_words
from sglang_release import ROOT, only_release

pytestmark = [only_release("0.5.23"), pytest.mark.timeout(900),
              pytest.mark.slow("downloads and reads every supported release's wheel (~40 MB each)")]

KNOWLEDGE = engine_for("sglang").knowledge
RELEASES = load_releases(KNOWLEDGE)
assert RELEASES is not None
SIGNATURES = yaml.safe_load(KNOWLEDGE.signatures.read_text())["signatures"] if KNOWLEDGE.signatures else []
# Engine-neutral signatures (engines/common/signatures.yaml) whose words are not a library's but written in each
# engine's own source alike (SGLang's model loader descends from vLLM's): checked against every release as the
# engine's own are. The common ones that are a library's words (safetensors, transformers, huggingface_hub, torch)
# are not in the engine's wheel: tests/unit/test_shared_library_signatures.py holds them to the real captures.
IN_ENGINE_SOURCE = ("model-weights-missing",)
SIGNATURES += [s for s in yaml.safe_load(COMMON.read_text())["signatures"] if s["id"] in IN_ENGINE_SOURCE]
FLAG_TABLES = ROOT / "tests" / "standin" / "sglang" / "srt"
PARSER = ("srt/server_args.py", "srt/arg_groups/")

# Signatures whose words are not SGLang's own text but a library's (its exception message or traceback form)
LIBRARY = {
    "cuda-oom-loading-weights": "torch's CUDA out-of-memory error",
    "cuda-oom": "torch's CUDA out-of-memory error",
    "ambiguous-cuda-graph-bs": "argparse's ambiguous-option error",
    "ambiguous-option": "argparse's ambiguous-option error",
    "spec-num-steps-without-topk": "Python's TypeError for None > int",
    "dist-init-port-busy": "torch.distributed's TCPStore",
    "dist-init-clients-missing": "torch.distributed's TCPStore",
    "dist-init-unreachable": "torch.distributed's TCPStore",
}
# The words to look for where a pattern's own literal runs are not written so in the source (an f-string)
WORDS = {
    "watchdog-timeout": "watchdog timeout (",                      # f"... watchdog timeout ({self.watchdog_timeout=})"
    "model-arch-unsupported": "are not supported for now",          # f"Model architectures {arch} are not ..."
    "spec-topk-without-num-steps": "def _handle_eagle_family",      # a bare assert: its traceback names the function
}

_texts: dict[str, ReleaseText] = {}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kept = os.environ.get("RELEASE_WHEELS")
    return Path(kept) if kept else tmp_path_factory.mktemp("wheels")


def release(version: str, wheels: Path) -> ReleaseText:
    if version not in _texts:
        _texts[version] = ReleaseText(fetch_wheel("sglang", version, wheels), "sglang")
    return _texts[version]


def defined(text: ReleaseText, key: str) -> bool:
    """The flag is an option literal or a ServerArgs field in the release's parser sources."""
    field = re.compile(rf"^\s+{re.escape(key)}\s*:", re.MULTILINE)
    return any(f'"{key_option(key)}"' in body or f"'{key_option(key)}'" in body or field.search(body)
               for name, body in text.files.items() if name.startswith(tuple(f"sglang/{p}" for p in PARSER)))


def option_literal(text: ReleaseText, key: str) -> bool:
    return any(f'"{key_option(key)}"' in body or f"'{key_option(key)}'" in body for body in text.files.values())


@pytest.mark.parametrize("version", RELEASES.releases)
def test_every_signature_finds_its_words_in_the_release(version: str, wheels: Path) -> None:
    text = release(version, wheels)
    missing = missing_words(text, version, SIGNATURES, LIBRARY, WORDS)
    assert not missing, f"sglang {version}'s source has not the words of: {', '.join(missing)} (a new wording: add a " \
                        "pattern; a check the release no longer has: narrow the signature's `versions`)"


@pytest.mark.parametrize("version", RELEASES.releases)
def test_every_follow_on_check_finds_its_message_in_the_release(version: str, wheels: Path) -> None:
    text = release(version, wheels)
    missing = []
    for check in load_followons(KNOWLEDGE):
        if not version_in(version, check.versions):
            continue
        words = max(re.split(r"\bX\b|\.\.\.|\(|\)", check.text.strip("'\" ")), key=len).strip(" .")
        if not text.has(words):
            missing.append(f"{check.id} ({words!r})")
    assert not missing, f"sglang {version} has not the message of: {', '.join(missing)}"


@pytest.mark.parametrize("version", RELEASES.releases)
def test_every_renames_row_holds_for_the_release(version: str, wheels: Path) -> None:
    text = release(version, wheels)
    wrong = []
    for row in load_renames(KNOWLEDGE):
        gone_from = row.removed or row.since
        if row.kind == "env":
            if not at_least(version, gone_from) and not text.has(row.old):
                wrong.append(f"env {row.old} should be read before {gone_from}")
            continue
        if not at_least(version, gone_from) and not defined(text, row.old):
            wrong.append(f"{key_option(row.old)} should be defined before {gone_from}")
        if row.new is not None and at_least(version, row.since) and not defined(text, row.new):
            wrong.append(f"{key_option(row.new)} should be defined from {row.since}")
        if row.removed is not None and at_least(version, row.removed) and option_literal(text, row.old):
            wrong.append(f"{key_option(row.old)} should be no option from {row.removed}")
    assert not wrong, f"renames.yaml against sglang {version}: {'; '.join(wrong)}"


def parser_options(version: str) -> set[str]:
    data = json.loads((FLAG_TABLES / f"flags_{version.replace('.', '_')}.json").read_text())
    assert data["sglang_version"] == version
    return {o for action in data["actions"] for o in action["option_strings"] if o.startswith("--")}


def test_every_flag_the_seed_era_had_is_renamed_or_a_documented_removal_by_0523() -> None:
    gone = parser_options("0.5.10") - parser_options("0.5.23")
    rows = {key_option(r.old): r for r in load_renames(KNOWLEDGE) if r.kind == "arg"}
    unknown = sorted(o for o in gone if o not in rows)
    assert not unknown, f"flags of 0.5.10's parser that 0.5.23's has not, in no renames.yaml row: {unknown}"
    assert len(gone) >= 30      # the real tables: 32 flags
    for option in gone:
        row = rows[option]
        assert at_least("0.5.23", row.removed or row.since), f"{option}: 0.5.23 rejects it, the row says {row}"
