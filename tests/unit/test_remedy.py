"""remedy: concrete changes from signature data, for a given profile, never the same one twice."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deployer.engines import engine_for
from deployer.diagnose.diagnosis import Diagnosis, diagnose
from deployer.profile.model import Profile
from deployer.remedy.effective import DRY_RESOLUTION, EngineValues
from deployer.remedy.propose import Change, known_renames, propose, refused_flags, remedy_spec, resolve

CASES = Path(__file__).parent.parent / "cases" / "sglang"


def profile(args: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> Profile:
    return Profile.model_validate({
        "name": "t",
        "target": {"host": "gpu-box"},
        "engine": {"model_path": "Qwen/Qwen3.6-27B", "args": args or {}, "env": env or {}},
    })


def case(name: str, **kw: Any) -> Diagnosis:
    d = diagnose((CASES / f"{name}.log").read_bytes().decode(), **{"engine": engine_for("sglang"), **kw})
    assert d.signature is not None
    return d


def heal(d: Diagnosis, prof: Profile, limit: int = 20) -> list[Change]:
    """Propose and apply until nothing applies; the list of changes made.

    Like the engine, each new attempt dumps the args it ran with: the log's dump with the profile's values.
    """
    tried: list[Change] = []
    for _ in range(limit):
        if d.engine_args is not None:
            d = dataclasses.replace(d, engine_args={**d.engine_args, **prof.engine.args})
        change = propose(d, prof, tried)
        if change is None:
            return tried
        assert change.key() not in {c.key() for c in tried}
        tried.append(change)
        prof = prof.patched(args=change.args, env=change.env)
    raise AssertionError("remedy did not stop")


def test_scenario_sets_strategy_and_env_then_stops() -> None:
    d = case("mamba-spec-needs-extra-buffer")
    prof = profile({"speculative_algorithm": "NEXTN"})
    change = propose(d, prof, [])
    assert change is not None
    assert change.args == {"mamba_scheduler_strategy": "extra_buffer"}
    assert change.env == {"SGLANG_ENABLE_SPEC_V2": "1"}
    assert change.reason == "mamba_scheduler_strategy: (engine default) -> extra_buffer; SGLANG_ENABLE_SPEC_V2=1"
    fixed = prof.patched(args=change.args, env=change.env)
    assert fixed.engine.args["mamba_scheduler_strategy"] == "extra_buffer"
    assert propose(d, fixed, [change]) is None
    assert propose(d, fixed, []) is None                 # already has both: a no-op


def test_partial_noop_keeps_only_the_missing_part() -> None:
    d = case("mamba-spec-needs-extra-buffer")
    change = propose(d, profile({"mamba_scheduler_strategy": "extra_buffer"}), [])
    assert change is not None and change.args == {} and change.env == {"SGLANG_ENABLE_SPEC_V2": "1"}
    change = propose(d, profile({"mamba_scheduler_strategy": "no_buffer"}, {"SGLANG_ENABLE_SPEC_V2": "1"}), [])
    assert change is not None and change.args == {"mamba_scheduler_strategy": "extra_buffer"} and change.env == {}


def test_capture_failed_every_lowering_is_below_the_engine_resolved_value() -> None:
    """The issue's measurement: no mfs in the profile, the engine resolved 0.771, graph capture ran out of memory.

    SGLang suggests "0.8 or 0.7": 0.8 would raise it, so 0.7 first, then steps down, then smaller graphs."""
    d = case("capture-cuda-graph-failed")
    assert d.engine_args is not None and d.engine_args["mem_fraction_static"] == 0.771
    first = propose(d, profile(), [])
    assert first is not None and first.args == {"mem_fraction_static": 0.7}
    assert first.reason == "mem_fraction_static: engine resolved 0.771 -> 0.7"
    assert first.basis == {"mem_fraction_static": "engine resolved 0.771"}
    steps = heal(d, profile())
    mfs = [c.args["mem_fraction_static"] for c in steps if "mem_fraction_static" in c.args]
    assert mfs == [0.7, 0.65, 0.6]
    assert all(m < 0.771 for m in mfs)
    bs = [c.args["cuda_graph_max_bs_decode"] for c in steps if "cuda_graph_max_bs_decode" in c.args]
    assert bs == [24, 12, 8]                # from the engine's resolved cuda_graph_max_bs_decode (48)
    assert all(isinstance(b, int) for b in bs)


def test_lowering_from_each_source_of_the_effective_value() -> None:
    d = case("capture-cuda-graph-failed")
    no_dump = dataclasses.replace(d, engine_args=None)
    c = propose(no_dump, profile({"mem_fraction_static": 0.75}), [])
    assert c is not None and c.args == {"mem_fraction_static": 0.7} and c.basis == {"mem_fraction_static": "profile 0.75"}
    c = propose(no_dump, profile({"mem_fraction_static": 0.68}), [])
    assert c is not None and c.args == {"mem_fraction_static": 0.63}
    dry = EngineValues().then(DRY_RESOLUTION, {"mem_fraction_static": 0.812}).then("profile", {})
    c = propose(no_dump, profile(), [], dry)
    assert c is not None and c.args == {"mem_fraction_static": 0.8}
    assert c.reason == "mem_fraction_static: dry resolution 0.812 -> 0.8"
    c = propose(no_dump, profile(), [])
    assert c is not None and c.basis == {"mem_fraction_static": "documented default 0.88"}
    c = propose(no_dump, profile({"mem_fraction_static": 0.6, "cuda_graph_max_bs_decode": 8}), [])
    assert c is None                                      # both at their bounds


def test_tried_change_is_not_repeated() -> None:
    d = case("capture-cuda-graph-failed")
    prof = profile()
    first = propose(d, prof, [])
    assert first is not None
    second = propose(d, prof, [first])                    # same profile: the next option, not the same again
    assert second is not None and second.key() != first.key()
    assert second.args == {"cuda_graph_max_bs_decode": 24}   # half the engine's resolved 48


def test_oom_below_the_old_default_heals_with_every_value_below_the_effective_one() -> None:
    """Done-when: an OOM whose effective value (0.771) is below the old default (0.88)."""
    d = dataclasses.replace(case("cuda-oom"), engine_args={"mem_fraction_static": 0.771})
    steps = heal(d, profile())
    tried = [c.args["mem_fraction_static"] for c in steps]
    assert tried and tried[0] == 0.721 and all(v < 0.771 for v in tried)
    assert tried == sorted(tried, reverse=True) and tried[-1] >= 0.6


def test_oom_numbers_size_the_lowering() -> None:
    """torch says how much was missing: the lowering frees at least that share of the GPU, plus a margin."""
    text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has a total capacity " \
           "of 139.81 GiB of which 1.50 GiB is free."
    d = dataclasses.replace(case("cuda-oom"), evidence=[text], engine_args={"mem_fraction_static": 0.907})
    c = propose(d, profile(), [])
    # (12 - 1.5) / 139.81 = 0.075 (+0.01 margin -> 0.09) is more than the 0.05 step
    assert c is not None and c.args == {"mem_fraction_static": 0.817}


def test_raise_moves_past_the_effective_value_by_a_meaningful_step() -> None:
    d = case("kv-cache-not-enough-memory")
    c = propose(d, profile(), [])
    assert c is not None and c.args == {"mem_fraction_static": 0.937}    # 0.907 from the message + 0.03
    assert c.basis == {"mem_fraction_static": "engine message 0.907"}
    d = case("mamba-cache-too-small")                                    # no value in its message: the dump's
    c = propose(d, profile({"mem_fraction_static": 0.8}), [])
    assert c is not None and c.args == {"mem_fraction_static": 0.937}
    assert c.reason.startswith("mem_fraction_static: engine resolved 0.907 -> 0.937")
    at_top = dataclasses.replace(d, engine_args={**(d.engine_args or {}), "mem_fraction_static": 0.94})
    c = propose(at_top, profile(), [])
    assert c is not None and c.args == {"mem_fraction_static": 0.95}
    c = propose(dataclasses.replace(d, engine_args={**(d.engine_args or {}), "mem_fraction_static": 0.95}),
                profile(), [])
    assert c is not None and c.args == {"mamba_ssm_dtype": "bfloat16"}   # no more memory: a smaller state


def test_weights_leave_no_kv_cache_goes_past_the_minimum_it_names() -> None:
    d = case("weights-leave-no-kv-cache")          # under 0.771 (engine resolved), "raise above 0.812"
    c = propose(d, profile(), [])
    assert c is not None and c.args == {"mem_fraction_static": 0.842}
    assert c.args["mem_fraction_static"] > 0.812 and c.basis == {"mem_fraction_static": "engine message 0.771"}
    c = propose(d, profile({"mem_fraction_static": 0.7}), [])       # the engine's value wins over the profile's
    assert c is not None and c.args == {"mem_fraction_static": 0.842}


def test_numbers_that_rule_out_a_suggestion_get_another() -> None:
    """Too small to serve one request (4 slots, 5 per request): fewer requests cannot help; memory can."""
    d = case("mamba-cache-too-small")
    c = propose(d, profile({"max_running_requests": 48}), [])
    assert c is not None and "max_running_requests" not in c.args and c.args == {"mem_fraction_static": 0.937}
    fits = d.evidence[0].replace("max_mamba_cache_size=4,", "max_mamba_cache_size=40,")
    c = propose(dataclasses.replace(d, evidence=[fits]), profile({"max_running_requests": 48}), [])
    assert c is not None and c.args == {"max_running_requests": 24}    # 40 slots / 5: fewer requests do fit
    # One request's state (181.25 MB) is more than the whole Mamba pool (0.12 GB x 0.47): raise memory instead.
    d = case("mamba-cache-not-enough-memory")
    c = propose(d, profile(), [])
    assert c is not None and c.args == {"mem_fraction_static": 0.937}
    roomy = d.evidence[0].replace("total_rest_memory=0.12 GB", "total_rest_memory=4.00 GB")
    c = propose(dataclasses.replace(d, evidence=[roomy]), profile(), [])
    assert c is not None and c.args == {"max_running_requests": 24}


def test_unrecognized_flag_is_renamed_via_table() -> None:
    assert known_renames(engine_for("sglang")).get("mamba_scheduler_strategy") == "mamba_radix_cache_strategy"
    d = case("unrecognized-arguments")             # real 0.5.23 output
    c = propose(d, profile({"mamba_scheduler_strategy": "extra_buffer"}), [])
    assert c is not None
    assert c.args == {"mamba_scheduler_strategy": None, "mamba_radix_cache_strategy": "extra_buffer"}
    patched = profile({"mamba_scheduler_strategy": "extra_buffer"}).patched(args=c.args)
    assert patched.engine.args == {"mamba_radix_cache_strategy": "extra_buffer"}


def test_removals_and_renames_are_explicit_in_diagnose_json() -> None:
    out = case("unrecognized-arguments", engine_version="0.5.23").to_json()["remedy"]
    assert out["args"] == {"mamba_scheduler_strategy": None, "mamba_radix_cache_strategy": "extra_buffer"}
    out = case("unrecognized-arguments-typo", engine_version="0.5.23").to_json()["remedy"]
    assert out["args"] == {"mem_fraction_statc": None, "mem_fraction_static": 0.8}
    assert "did you mean --mem-fraction-static? respelt (the one close flag)" in out["reason"]


def test_a_flag_that_is_no_rename_no_removal_and_no_typo_is_never_dropped() -> None:
    """Issue 24: the remedy used to drop `--enable-beta-spec` ("dropped ...: this engine version does not have it")
    and `up` went on. Neither `diagnose --json`'s preview nor a heal drops it now, even next to a rename."""
    assert case("unrecognized-arguments-unknown", engine_version="0.5.23").to_json()["remedy"] is None
    assert propose(case("unrecognized-arguments-unknown"), profile({"enable_beta_spec": True, "tp_size": 1}),
                   []) is None
    d = case("unrecognized-arguments-unknown", engine_version="0.5.23")
    assert refused_flags("unrecognized arguments: (.*)$", d.message_text(), engine_for("sglang"), "0.5.23") == [
        "unknown flag --enable-beta-spec for sglang 0.5.23 (closest: --enable-trace, --enable-metrics, --enable-eplb); "
        "refused: deployer never drops a flag that is neither a documented rename nor a documented removal"]


def test_a_removal_documented_by_the_wheels_is_dropped_beside_a_rename() -> None:
    """Issue 39: --stream-output left SGLang's parser in 0.5.20 (renames.yaml, checked against each wheel): next to
    a rename, the heal drops it loudly and carries the other flag's value."""
    out = case("unrecognized-arguments-several", engine_version="0.5.23").to_json()["remedy"]
    assert out["args"] == {"mamba_scheduler_strategy": None, "mamba_radix_cache_strategy": "extra_buffer",
                           "stream_output": None}


@pytest.fixture()
def fresh_rename_caches() -> Iterator[None]:
    """propose.known_renames and rename_history cache the table per engine: a test that swaps the table must
    neither read the real one from the cache nor leave its own there (red once in a full run: every later rename
    test of that xdist worker saw this test's table)."""
    from deployer.remedy import propose as remedy

    for cached in (remedy.known_renames, remedy.rename_history):
        cached.cache_clear()
    yield
    for cached in (remedy.known_renames, remedy.rename_history):
        cached.cache_clear()


def test_a_documented_removal_is_dropped_by_the_heal(monkeypatch: pytest.MonkeyPatch,
                                                     fresh_rename_caches: None) -> None:
    from deployer.remedy import propose as remedy
    from deployer.engines.renames import Rename

    table = [Rename(old="enable_beta_spec", new=None, kind="arg", since="0.5.20", removed="0.5.20",
                    source="PR #1 (test)")]
    monkeypatch.setattr(remedy, "load_renames", lambda engine: table)
    c = propose(case("unrecognized-arguments-unknown", engine_version="0.5.23"),
                profile({"enable_beta_spec": True}), [])
    assert c is not None and c.args == {"enable_beta_spec": None}
    assert "dropped --enable-beta-spec: removed in sglang 0.5.20 (PR #1 (test)), a documented removal" in c.reason
    assert propose(case("unrecognized-arguments-unknown", engine_version="0.5.13"),
                   profile({"enable_beta_spec": True}), []) is None   # not removed yet there: refused


def test_a_typo_is_respelt_for_a_profile() -> None:
    c = propose(case("unrecognized-arguments-typo"), profile({"mem_fraction_statc": 0.75}), [])
    assert c is not None and c.args == {"mem_fraction_statc": None, "mem_fraction_static": 0.75}


def test_ambiguous_cuda_graph_flag_renamed() -> None:
    d = case("ambiguous-cuda-graph-bs")
    c = propose(d, profile({"cuda_graph_max_bs": 64}), [])
    assert c is not None and c.args == {"cuda_graph_max_bs": None, "cuda_graph_max_bs_decode": 64}
    assert propose(d, profile(), []) is None              # nothing to rename in this profile


def test_alternative_flag_names_follow_the_profile() -> None:
    d = case("extra-buffer-unsupported-model")
    c = propose(d, profile({"mamba_scheduler_strategy": "extra_buffer"}), [])
    assert c is not None and c.args == {"mamba_scheduler_strategy": "no_buffer"}
    c = propose(d, profile(), [])
    assert c is not None and c.args == {"mamba_radix_cache_strategy": "no_buffer"}


def test_unset_args_and_noop_detection() -> None:
    d = case("spec-topk-without-num-steps")
    c = propose(d, profile({"speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4, "tp_size": 1}), [])
    assert c is not None and c.args == {"speculative_eagle_topk": None, "speculative_num_draft_tokens": None}
    assert "(removed)" in c.reason
    assert propose(case("trust-remote-code"), profile({"trust_remote_code": True}), []) is None
    assert propose(case("model-arch-unsupported"), profile(), []) is None   # hint only


def test_context_length_taken_from_message() -> None:
    c = propose(case("context-length-too-long"), profile({"context_length": 10000000}), [])
    assert c is not None and c.args == {"context_length": 262144}


def test_change_identity() -> None:
    a = Change(args={"a": 1, "b": None}, env={"X": "1"}, reason="r1")
    b = Change(args={"b": None, "a": 1}, env={"X": "1"}, reason="r2")
    assert a.key() == b.key() and a.key() != Change(args={"a": 2}).key()
    assert a.to_json() == {"args": {"a": 1, "b": None}, "env": {"X": "1"}, "reason": "r1", "basis": {}}


def test_spec_validation() -> None:
    with pytest.raises(ValueError):
        remedy_spec({"step_arg": {"arg": "x", "default": 1}})            # neither by nor factor
    with pytest.raises(ValueError):
        remedy_spec({"set_argz": {}})                                    # unknown key


@settings(max_examples=60, deadline=None)
@given(
    start=st.floats(min_value=0.3, max_value=0.99),
    by=st.sampled_from([-0.05, -0.03, -0.1]),
    low=st.floats(min_value=0.3, max_value=0.8),
)
def test_numeric_steps_stay_in_bounds_and_end(start: float, by: float, low: float) -> None:
    spec = remedy_spec({"step_arg": {"arg": "mem_fraction_static", "by": by, "min": low, "default": 0.88}})
    args: dict[str, Any] = {"mem_fraction_static": round(start, 3)}
    tried: list[Change] = []
    for _ in range(100):
        c = resolve(spec, "", args=args, env={}, tried=tried, engine=engine_for("sglang"))
        if c is None:
            break
        new = c.args["mem_fraction_static"]
        assert low - 1e-9 <= new < args["mem_fraction_static"]
        tried.append(c)
        args = {"mem_fraction_static": new}
    else:
        raise AssertionError("never stopped")


def test_did_you_mean() -> None:
    from deployer.remedy.propose import did_you_mean

    assert did_you_mean("--mamba-scheduler-strategy", [], engine_for("sglang")) == ["mamba_radix_cache_strategy"]
    assert did_you_mean("--mem-fraction-statc", ["--mem-fraction-static", "--tp-size"], engine_for("sglang")) == ["mem_fraction_static"]
    assert did_you_mean("--enable-beta-spec", ["--tp-size"], engine_for("sglang")) == []
