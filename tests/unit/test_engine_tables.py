"""Every table a diagnosis or remedy reads is the named engine's: a vLLM log never meets SGLang's renames,
follow-ons or signatures through the public entry points (diagnose, Diagnosis.to_json, propose, resolve)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from deployer.diagnose.diagnosis import diagnose
from deployer.diagnose.signatures import load_signatures
from deployer.engines import engine_for
from deployer.engines import kinds
from deployer.engines.followons import load_followons
from deployer.errors import ProfileError
from deployer.export.k8s import ExportOptions, export_k8s
from deployer.profile.model import DEFAULT_ENGINE_KIND, Profile
from deployer.remedy.propose import RemedySpec, did_you_mean, known_renames, propose, rename_history, resolve

VLLM_CASES = Path(__file__).parent.parent / "cases" / "vllm"
# SGLang renamed this flag in 0.5.x (engines/sglang/renames.yaml); vLLM never had either name.
UNKNOWN = "api_server.py: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer"


def _profile(kind: str, args: dict[str, Any]) -> Profile:
    return Profile.model_validate({"name": "t", "target": {"host": "gpu-box"},
                                  "engine": {"kind": kind, "model_path": "Qwen/Qwen3-8B", "args": args}})


def _unknown_flags_remedy() -> RemedySpec:
    """SGLang's remedy for argparse's rejection: rename (from the engine's table), respell, else drop."""
    spec = next(s.remedy for s in load_signatures(engine_for("sglang")) if s.id == "unrecognized-arguments")
    assert spec is not None
    return spec


def test_the_diagnosis_carries_its_engine_and_to_json_resolves_with_its_tables() -> None:
    text = (VLLM_CASES / "kv-cache-too-small.log").read_bytes().decode()
    as_vllm = diagnose(text, exit_code=1, engine=engine_for("vllm"))
    assert as_vllm.engine_kind == "vllm"
    assert as_vllm.to_json()["remedy"]["args"] == {"max_model_len": 384}   # the real capture's estimate
    assert diagnose(text, exit_code=1, engine=engine_for("sglang")).signature != as_vllm.signature


def test_a_diagnosis_of_no_engine_offers_no_remedy_rather_than_guessing_one() -> None:
    text = (VLLM_CASES / "kv-cache-too-small.log").read_bytes().decode()
    anonymous = dataclasses.replace(diagnose(text, exit_code=1, engine=engine_for("vllm")), engine_kind=None)
    assert anonymous.remedy is not None and anonymous.to_json()["remedy"] is None


@pytest.mark.parametrize("kind, expected", [
    ("sglang", {"mamba_scheduler_strategy": None, "mamba_radix_cache_strategy": "extra_buffer"}),
    ("vllm", None),   # no vLLM rename: refused (never dropped), and never SGLang's new name
])
def test_unknown_flags_are_renamed_only_by_the_profiles_own_engine(kind: str,
                                                                   expected: dict[str, Any] | None) -> None:
    args = {"mamba_scheduler_strategy": "extra_buffer"}
    change = resolve(_unknown_flags_remedy(), UNKNOWN, args=args, env={}, engine=engine_for(kind))
    assert (None if change is None else dict(change.args)) == expected
    diag = dataclasses.replace(diagnose(UNKNOWN + "\n", exit_code=2, engine=engine_for("vllm")), remedy=_unknown_flags_remedy())
    proposed = propose(diag, _profile(kind, args), [])
    assert (None if proposed is None else dict(proposed.args)) == expected


def test_rename_tables_are_per_engine() -> None:
    assert known_renames(engine_for("sglang"))["mamba_scheduler_strategy"] == "mamba_radix_cache_strategy"
    assert "mamba_scheduler_strategy" not in known_renames(engine_for("vllm"))
    assert "mamba_scheduler_strategy" not in rename_history(engine_for("vllm"))
    assert did_you_mean("--mamba-scheduler-strategy", [], engine_for("sglang")) == ["mamba_radix_cache_strategy"]
    assert did_you_mean("--mamba-scheduler-strategy", [], engine_for("vllm")) == []
    assert load_followons(engine_for("sglang").knowledge) and not load_followons(engine_for("vllm").knowledge)


def test_the_default_engine_is_the_profile_models_one() -> None:
    """A profile without engine.kind is SGLang's: that default lives once, in the profile model; no Engine (and
    nothing in the registry) marks one."""
    assert DEFAULT_ENGINE_KIND in kinds()
    assert not any(hasattr(engine_for(kind), "default") for kind in kinds())
    bare = Profile.model_validate({"name": "t", "target": {"host": "gpu-box"}, "engine": {"model_path": "m"}})
    assert bare.engine.kind == DEFAULT_ENGINE_KIND == "sglang"


def test_the_export_names_an_image_of_the_profiles_engine() -> None:
    for kind in kinds():
        with pytest.raises(ProfileError, match=re.escape(engine_for(kind).docs.image_example)):
            export_k8s(_profile(kind, {}), ExportOptions(image=None))


def test_only_the_engines_own_package_names_it() -> None:
    """Engine knowledge lives in deployer/engines/<kind>/: generic modules never name an engine (the engines
    package's docstring lists the packages; the profile model holds the one default, DEFAULT_ENGINE_KIND)."""
    root = Path(__file__).resolve().parents[2] / "deployer"
    for kind in kinds():
        named = {p.relative_to(root).as_posix() for p in root.rglob("*.py")
                 if kind in p.read_text(encoding="utf-8").lower()}
        assert {p for p in named if not p.startswith(f"engines/{kind}/")} <= {"engines/__init__.py", "profile/model.py"}, kind


def test_the_engines_model_flag_is_not_an_arg() -> None:
    with pytest.raises(ValueError, match=r"set engine.model_path instead of args.model \(the vllm flag"):
        _profile("vllm", {"model": "Qwen/Qwen3-8B"})
    with pytest.raises(ValueError, match="set engine.model_path instead of args.model_path"):
        _profile("sglang", {"model_path": "Qwen/Qwen3-8B"})
