"""Follow-on constraints: a remedy that would walk into the next known startup check is completed, or passed over."""

from __future__ import annotations

import re
from pathlib import Path

from deployer.engines import engine_for
from deployer.diagnose.diagnosis import diagnose
from deployer.engines.followons import load_followons
from deployer.profile.model import Profile
from deployer.remedy.propose import propose, remedy_spec, resolve
from deployer.versions import version_in

CASES = Path(__file__).parent.parent / "cases" / "sglang"


def profile(args: dict[str, object] | None = None) -> Profile:
    return Profile.model_validate({"name": "t", "target": {"host": "gpu-box"},
                                   "engine": {"model_path": "Qwen/Qwen3.6-27B", "args": args or {}}})


def case(name: str, version: str | None) -> object:
    return diagnose((CASES / f"{name}.log").read_bytes().decode(), engine_version=version, engine=engine_for("sglang"))


def test_no_buffer_on_0523_brings_what_its_checks_need() -> None:
    """extra_buffer cannot run here -> no_buffer, which 0.5.23 only accepts without overlap and with page 1."""
    d = diagnose((CASES / "extra-buffer-unsupported-platform.log").read_bytes().decode(), engine_version="0.5.23", engine=engine_for("sglang"))
    c = propose(d, profile({"page_size": 16}), [])
    assert c is not None
    assert c.args == {"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True, "page_size": 1}
    assert "no_buffer do not support overlap schedule" in c.reason and "mamba_hook.py:159" in c.reason
    # already without overlap: nothing to add for that check
    c = propose(d, profile({"disable_overlap_schedule": True}), [])
    assert c is not None and c.args == {"mamba_radix_cache_strategy": "no_buffer"}


def test_seed_era_no_buffer_with_speculative_decoding_also_disables_the_radix_cache() -> None:
    d = diagnose((CASES / "extra-buffer-unsupported-platform-seed-era.log").read_bytes().decode(),
                 engine_version="0.5.10", engine=engine_for("sglang"))
    c = propose(d, profile({"mamba_scheduler_strategy": "extra_buffer", "speculative_algorithm": "NEXTN"}), [])
    assert c is not None
    assert c.args == {"mamba_scheduler_strategy": "no_buffer", "disable_radix_cache": True}
    c = propose(d, profile({"mamba_scheduler_strategy": "extra_buffer"}), [])    # no spec: no_buffer alone is fine
    assert c is not None and c.args == {"mamba_scheduler_strategy": "no_buffer"}


def test_an_option_that_would_undo_itself_is_passed_over() -> None:
    spec = remedy_spec([
        {"set_args": {"mamba_radix_cache_strategy": "extra_buffer_lazy", "disable_overlap_schedule": True}},
        {"set_args": {"mamba_radix_cache_strategy": "extra_buffer"}},
    ])
    c = resolve(spec, "", args={}, env={}, version="0.5.23", engine=engine_for("sglang"))
    assert c is not None and c.args == {"mamba_radix_cache_strategy": "extra_buffer"}
    c = resolve(spec, "", args={}, env={}, version=None, engine=engine_for("sglang"))          # unknown release: no ranged check applies
    assert c is not None and c.args["mamba_radix_cache_strategy"] == "extra_buffer_lazy"


def test_checks_hold_only_for_their_releases() -> None:
    spec = remedy_spec({"set_args": {"mamba_radix_cache_strategy": "no_buffer"}})
    assert resolve(spec, "", args={}, env={}, version="0.5.23", engine=engine_for("sglang")).args["disable_overlap_schedule"] is True  # type: ignore[union-attr]
    assert "disable_overlap_schedule" not in resolve(spec, "", args={}, env={}, version="0.5.10", engine=engine_for("sglang")).args  # type: ignore[union-attr]


def test_table_entries_name_their_source_and_releases() -> None:
    checks = load_followons(engine_for("sglang").knowledge)
    assert len(checks) >= 5
    for check in checks:
        version_in("0.5.23", check.versions)                       # a valid range
        assert re.search(r"\.py:\d+", check.source) and re.search(r"\(0\.5\.\d+", check.source), check.id
        assert check.fix or check.fix_env
