"""Flag checks: renames both ways, unknown flags with "did you mean", prefixes, choices, env, cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deployer.engines import engine_for
from deployer.engines.renames import load_renames
from deployer.preflight.flags import (
    Flag,
    FlagSet,
    cached_versions,
    check_flags,
    default_cache_dir,
    load_cached_flagset,
    parse_probe_output,
    save_flagset,
)
from deployer.profile.model import Profile
from deployer.versions import at_least

STRATEGIES = ("auto", "extra_buffer", "extra_buffer_lazy", "no_buffer")


def flagset(version: str = "0.5.23", *, old_names: bool = False) -> FlagSet:
    mamba = "--mamba-scheduler-strategy" if old_names else "--mamba-radix-cache-strategy"
    flags = [
        Flag(("--model-path", "--model"), "model_path"),
        Flag(("--mem-fraction-static",), "mem_fraction_static"),
        Flag((mamba,), mamba[2:].replace("-", "_"), choices=STRATEGIES),
        Flag(("--cuda-graph-max-bs-decode",), "cuda_graph_max_bs_decode"),
        Flag(("--cuda-graph-max-bs-prefill",), "cuda_graph_max_bs_prefill"),
        Flag(("--disable-overlap-schedule",), "disable_overlap_schedule", nargs=0, takes_value=False),
        Flag(("--disable-cuda-graph",), "disable_cuda_graph", nargs=0, takes_value=False, deprecated=True),
        Flag(("--tp-size", "--tp"), "tp_size"),
        Flag(("--lora-paths",), "lora_paths", nargs="*"),
    ]
    if old_names:
        flags.append(Flag(("--cuda-graph-max-bs",), "cuda_graph_max_bs"))
    env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"} | ({"SGLANG_ENABLE_SPEC_V2"} if old_names else set())
    return FlagSet("sglang", version, tuple(flags), frozenset(env))


def prof(args: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> Profile:
    return Profile.model_validate({"name": "p", "target": {"host": "local"},
                                   "engine": {"model_path": "/m", "args": args or {}, "env": env or {}}})


RENAMES = load_renames(engine_for("sglang").knowledge)


def test_rename_table_is_data_with_versions() -> None:
    by_old = {r.old: r for r in RENAMES}
    mamba = by_old["mamba_scheduler_strategy"]
    assert (mamba.new, mamba.kind, mamba.since, mamba.removed) == ("mamba_radix_cache_strategy", "arg", "0.5.14",
                                                                   "0.5.20")
    assert "#27418" in mamba.source
    assert by_old["SGLANG_ENABLE_SPEC_V2"].new is None and by_old["SGLANG_ENABLE_SPEC_V2"].kind == "env"


def test_old_mamba_name_is_translated_for_a_new_engine() -> None:
    report = check_flags(prof({"mamba_scheduler_strategy": "extra_buffer", "tp_size": 1}), flagset(), RENAMES)
    assert report.ok
    assert list(report.profile.engine.args) == ["mamba_radix_cache_strategy", "tp_size"]
    assert report.profile.engine.args["mamba_radix_cache_strategy"] == "extra_buffer"
    assert any("renamed --mamba-radix-cache-strategy in sglang 0.5.14" in w for w in report.warnings)


def test_new_mamba_name_is_translated_back_for_an_old_engine() -> None:
    report = check_flags(prof({"mamba_radix_cache_strategy": "no_buffer"}), flagset("0.5.10", old_names=True),
                         RENAMES)
    assert report.ok and report.profile.engine.args == {"mamba_scheduler_strategy": "no_buffer"}
    assert any("does not exist before sglang 0.5.14" in w for w in report.warnings)


def test_cuda_graph_max_bs_becomes_decode() -> None:
    report = check_flags(prof({"cuda_graph_max_bs": 16}), flagset(), RENAMES)
    assert report.ok and report.profile.engine.args == {"cuda_graph_max_bs_decode": 16}


def test_ambiguous_prefix_without_rename_is_an_error() -> None:
    report = check_flags(prof({"cuda_graph_max": 16}), flagset(), RENAMES)
    assert report.errors == ["--cuda-graph-max is ambiguous in sglang 0.5.23: could be "
                             "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"]


def test_unique_prefix_is_written_in_full_with_a_warning() -> None:
    report = check_flags(prof({"mem_frac": 0.8}), flagset(), RENAMES)
    assert report.ok and report.profile.engine.args == {"mem_fraction_static": 0.8}
    assert any("--mem-frac is only a prefix of --mem-fraction-static" in w for w in report.warnings)


def test_a_typo_with_one_close_flag_is_respelt_loudly() -> None:
    report = check_flags(prof({"mem_fraction_statik": 0.8, "tp_size": 1}), flagset(), RENAMES)
    assert report.ok and report.profile.engine.args == {"mem_fraction_static": 0.8, "tp_size": 1}
    assert report.respelt == {"mem_fraction_statik": "mem_fraction_static"}
    (line,) = [w for w in report.warnings if "statik" in w]
    assert line == ("unknown flag --mem-fraction-statik for sglang 0.5.23; did you mean --mem-fraction-static? "
                    "respelt as --mem-fraction-static (the one close flag; --save-fixed writes it)")
    assert report.keyed[line] == "mem_fraction_statik"


def test_an_unknown_flag_is_never_dropped_but_refused_naming_the_closest() -> None:
    """Issue 24: `zzq_totally_unknown: 7` was dropped and the deploy went on. Now it is an error that names it."""
    report = check_flags(prof({"zzq_totally_unknown": 7, "tp_size": 1}), flagset(), RENAMES)
    assert report.errors == [
        "unknown flag --zzq-totally-unknown for sglang 0.5.23 (no flag of it is close); refused: deployer never "
        "drops a flag that is neither a documented rename nor a documented removal"]
    assert report.unknown == {"zzq_totally_unknown": report.errors[0]}
    assert report.keyed[report.errors[0]] == "zzq_totally_unknown"
    assert report.profile.engine.args == {"zzq_totally_unknown": 7, "tp_size": 1}   # never dropped
    near = check_flags(prof({"lora_pathz_dir": ["a"]}), flagset(), RENAMES)
    assert near.errors[0].startswith("unknown flag --lora-pathz-dir for sglang 0.5.23 (did you mean --lora-paths? "
                                     "it is not close enough to respell); refused")


def test_two_close_flags_are_not_guessed_between() -> None:
    """Only a single close flag is respelt; with several, the flag is refused and the message names them."""
    fs = FlagSet("sglang", "0.5.23", (Flag(("--max-prefill-tokens",), "max_prefill_tokens"),
                                      Flag(("--max-prefill-token",), "max_prefill_token")))
    report = check_flags(prof({"max_prefil_tokens": 1}), fs, RENAMES)
    assert report.errors == [
        "unknown flag --max-prefil-tokens for sglang 0.5.23 (closest: --max-prefill-tokens, --max-prefill-token); "
        "refused: deployer never drops a flag that is neither a documented rename nor a documented removal"]
    assert report.unknown == {"max_prefil_tokens": report.errors[0]} and not report.respelt


def test_a_documented_removal_is_dropped_with_its_source() -> None:
    from deployer.engines.renames import Rename

    retired = [*RENAMES, Rename(old="enable_beta_spec", new=None, kind="arg", since="0.5.20", removed="0.5.20",
                                source="PR #1 (test)")]
    report = check_flags(prof({"enable_beta_spec": True, "tp_size": 1}), flagset(), retired)
    assert report.ok and report.profile.engine.args == {"tp_size": 1}
    assert report.warnings == ["dropped --enable-beta-spec: removed in sglang 0.5.20 (PR #1 (test)), a documented "
                               "removal; the target has 0.5.23"]
    older = check_flags(prof({"enable_beta_spec": True}), flagset("0.5.13"), retired)
    assert not older.ok   # not removed yet in 0.5.13 (and this table has no such flag): refused, not dropped


def test_choices_and_value_shapes() -> None:
    report = check_flags(prof({"mamba_radix_cache_strategy": "extra_bufer", "disable_overlap_schedule": "yes",
                               "tp_size": True, "lora_paths": True}), flagset(), RENAMES)
    assert report.errors == [
        "--mamba-radix-cache-strategy extra_bufer: not one of auto, extra_buffer, extra_buffer_lazy, no_buffer; "
        "did you mean extra_buffer?",
        "--disable-overlap-schedule takes no value (write disable_overlap_schedule: true), got 'yes'",
        "--tp-size needs a value, got true",
    ]


def test_deprecated_flag_warns() -> None:
    report = check_flags(prof({"disable_cuda_graph": True}), flagset(), RENAMES)
    assert report.ok and report.warnings == ["--disable-cuda-graph is deprecated in sglang 0.5.23"]


def test_retired_env_warns_by_version() -> None:
    env = {"SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}
    new = check_flags(prof(env=env), flagset(), RENAMES)
    assert new.ok and len(new.warnings) == 1 and "SGLANG_ENABLE_SPEC_V2 is not read by sglang 0.5.23" in new.warnings[0]
    old = check_flags(prof(env={"SGLANG_ENABLE_SPEC_V2": "1"}), flagset("0.5.10", old_names=True), RENAMES)
    assert not any("SGLANG_ENABLE_SPEC_V2" in w for w in old.warnings)


def test_env_name_not_in_the_engine_source_warns() -> None:
    report = check_flags(prof(env={"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATIO": "0", "HF_HOME": "/x"}), flagset(),
                         RENAMES)
    assert report.warnings == ["env SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATIO is not read anywhere in sglang 0.5.23; "
                               "did you mean SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION?"]


def test_cache_round_trip(tmp_path: Path) -> None:
    fs = flagset()
    assert load_cached_flagset(tmp_path, "sglang", "0.5.23") is None
    save_flagset(tmp_path, fs)
    again = load_cached_flagset(tmp_path, "sglang", "0.5.23")
    assert again == fs and cached_versions(tmp_path, "sglang") == ["0.5.23"]
    assert load_cached_flagset(tmp_path, "sglang", "0.5.22") is None


def test_default_cache_dir_follows_deployer_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / "cache"


def test_probe_output_is_found_after_engine_logs() -> None:
    out = "[2026-11-29 10:00:00] noise\nDEPLOYER_PROBE_JSON {\"sglang_version\": \"0.5.23\"}\n"
    assert parse_probe_output(out) == {"sglang_version": "0.5.23"}
    assert parse_probe_output("no marker") is None


def test_versions_order() -> None:
    assert at_least("0.5.23", "0.5.14") and at_least("0.5.14.post1", "0.5.14") and not at_least("0.5.9", "0.5.14")
