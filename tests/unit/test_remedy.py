"""remedy: concrete changes from signature data, for a given profile, never the same one twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deployer.diagnose.diagnosis import Diagnosis, diagnose
from deployer.profile.model import Profile
from deployer.remedy import Change, known_renames, propose, remedy_spec, resolve

CASES = Path(__file__).parent.parent / "cases" / "sglang"


def profile(args: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> Profile:
    return Profile.model_validate({
        "name": "t",
        "target": {"host": "gpu-box"},
        "engine": {"model_path": "Qwen/Qwen3.6-27B", "args": args or {}, "env": env or {}},
    })


def case(name: str, **kw: Any) -> Diagnosis:
    d = diagnose((CASES / f"{name}.log").read_bytes().decode(), **kw)
    assert d.signature is not None
    return d


def heal(d: Diagnosis, prof: Profile, limit: int = 20) -> list[Change]:
    """Propose and apply until nothing applies; the list of changes made."""
    tried: list[Change] = []
    for _ in range(limit):
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


def test_capture_failed_prefers_message_values_then_steps_then_halves_batch() -> None:
    d = case("capture-cuda-graph-failed")
    steps = heal(d, profile())
    mfs = [c.args["mem_fraction_static"] for c in steps if "mem_fraction_static" in c.args]
    assert mfs == [0.8, 0.7, 0.65, 0.6]
    bs = [c.args["cuda_graph_max_bs_decode"] for c in steps if "cuda_graph_max_bs_decode" in c.args]
    assert bs == [128, 64, 32, 16, 8]
    assert all(isinstance(b, int) for b in bs)


def test_capture_failed_from_profile_value() -> None:
    d = case("capture-cuda-graph-failed")
    c = propose(d, profile({"mem_fraction_static": 0.75}), [])
    assert c is not None and c.args == {"mem_fraction_static": 0.7}
    c = propose(d, profile({"mem_fraction_static": 0.68}), [])
    assert c is not None and c.args == {"mem_fraction_static": 0.63}
    c = propose(d, profile({"mem_fraction_static": 0.6, "cuda_graph_max_bs_decode": 8}), [])
    assert c is None                                      # both at their bounds


def test_tried_change_is_not_repeated() -> None:
    d = case("capture-cuda-graph-failed")
    prof = profile()
    first = propose(d, prof, [])
    assert first is not None
    second = propose(d, prof, [first])                    # same profile: the next option, not the same again
    assert second is not None and second.key() != first.key()
    assert second.args == {"cuda_graph_max_bs_decode": 128}


def test_raise_mfs_reads_engine_value_and_clamps() -> None:
    d = case("kv-cache-not-enough-memory")
    c = propose(d, profile(), [])
    assert c is not None and c.args == {"mem_fraction_static": 0.937}    # 0.907 from the message + 0.03
    c = propose(d, profile({"mem_fraction_static": 0.94}), [])
    assert c is not None and c.args == {"mem_fraction_static": 0.95}
    assert propose(d, profile({"mem_fraction_static": 0.95}), []) is None


def test_weights_leave_no_kv_cache_prefers_named_value_only_upwards() -> None:
    d = case("weights-leave-no-kv-cache")
    c = propose(d, profile({"mem_fraction_static": 0.5}), [])
    assert c is not None and c.args == {"mem_fraction_static": 0.612}
    c = propose(d, profile({"mem_fraction_static": 0.7}), [])
    assert c is not None and c.args == {"mem_fraction_static": 0.73}


def test_unrecognized_flag_is_renamed_via_table() -> None:
    assert known_renames().get("mamba_scheduler_strategy") == "mamba_radix_cache_strategy"
    d = case("unrecognized-arguments")
    c = propose(d, profile({"mamba_scheduler_strategy": "extra_buffer"}), [])
    assert c is not None
    assert c.args == {"mamba_scheduler_strategy": None, "mamba_radix_cache_strategy": "extra_buffer"}
    patched = profile({"mamba_scheduler_strategy": "extra_buffer"}).patched(args=c.args)
    assert patched.engine.args == {"mamba_radix_cache_strategy": "extra_buffer"}
    assert propose(case("unrecognized-arguments-unknown"), profile({"enable_beta_spec": True}), []) is None


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
    c = propose(case("context-length-too-long"), profile({"context_length": 131072}), [])
    assert c is not None and c.args == {"context_length": 65536}


def test_change_identity() -> None:
    a = Change(args={"a": 1, "b": None}, env={"X": "1"}, reason="r1")
    b = Change(args={"b": None, "a": 1}, env={"X": "1"}, reason="r2")
    assert a.key() == b.key() and a.key() != Change(args={"a": 2}).key()
    assert a.to_json() == {"args": {"a": 1, "b": None}, "env": {"X": "1"}, "reason": "r1"}


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
        c = resolve(spec, "", args=args, env={}, tried=tried)
        if c is None:
            break
        new = c.args["mem_fraction_static"]
        assert low - 1e-9 <= new < args["mem_fraction_static"]
        tried.append(c)
        args = {"mem_fraction_static": new}
    else:
        raise AssertionError("never stopped")


def test_did_you_mean() -> None:
    from deployer.remedy import did_you_mean

    assert did_you_mean("--mamba-scheduler-strategy", []) == ["mamba_radix_cache_strategy"]
    assert did_you_mean("--mem-fraction-statc", ["--mem-fraction-static", "--tp-size"]) == ["mem_fraction_static"]
    assert did_you_mean("--enable-beta-spec", ["--tp-size"]) == []
