"""The seed era on real code: SGLang 0.5.10 (the first release that raises the seed's radix-cache error).

The shipped qwen36-mtp profile without its fix (no extra_buffer, no SGLANG_ENABLE_SPEC_V2) is diagnosed from the
real release's own resolution and healed before anything is launched; plan reports 0.5.10's own resolution
(prepare_server_args; it has no resolve_once) and its memory rules.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from deployer.errors import PreflightFailed
from deployer.preflight.flags import load_cached_flagset
from deployer.runner.before_launch import BeforeLaunch
from deployer.runner.up import UpOptions, UpReport
from deployer.preflight.checks import run_preflight
from deployer.profile.model import Profile
from deployer.profile.loader import load
from deployer.remedy.propose import Change
from deployer.remote.base import Remote
from deployer.watch.watcher import Event
from sglang_release import ROOT, SEED_ERA, only_release

pytestmark = only_release(SEED_ERA)
QWEN36 = ROOT / "tests" / "fixtures" / "models" / "qwen36-27b-like"


def shipped_without_fix(host: Any, tmp_path: Path) -> Profile:
    """profiles/qwen36-mtp.yaml as shipped, on the test bed, minus the seed's fix."""
    shipped = load(ROOT / "profiles" / "qwen36-mtp.yaml", overrides=[], host=None, environ={"HF_TOKEN": "hf_test"})
    engine = shipped.engine.model_copy(update={"python": "sglang-python", "model_path": str(QWEN36)})
    target = Profile.model_validate({"name": "t", "target": host.target(tmp_path / "work"),
                                     "engine": {"model_path": "x"}}).target
    profile = shipped.model_copy(update={"engine": engine, "target": target})
    profile = profile.patched(args={"mamba_scheduler_strategy": None, "device": "cuda"},
                              env={"SGLANG_ENABLE_SPEC_V2": None, "HF_HOME": None, "HF_HUB_ENABLE_HF_TRANSFER": None})
    assert "mamba_scheduler_strategy" not in profile.engine.args
    return profile


def test_seed_scenario_heals_before_launch_on_real_seed_era_code(h200_host: Any, remote: Remote,
                                                                tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path / "home"))
    profile = shipped_without_fix(h200_host, tmp_path)
    events: list[Event] = []
    tried: list[Change] = []
    report = UpReport(name=profile.name, host="h200", status="failed")
    healed, version, dry = BeforeLaunch(UpOptions(heal=True), report, events.append, tried).checked(
        remote, profile, own_port=False)
    notes: list[dict[str, Any]] = [n.to_json() for n in report.before_launch]
    assert version == SEED_ERA
    # the real 0.5.10 resolution raised the seed's error; the remedy is exactly the seed's fix
    assert [n["signature"] for n in notes] == ["mamba-spec-needs-extra-buffer"]
    assert "is not compatible with radix cache when using --mamba-scheduler-strategy no_buffer" in \
        notes[0]["evidence"][0]
    assert notes[0]["change"]["args"] == {"mamba_scheduler_strategy": "extra_buffer"}
    assert notes[0]["change"]["env"] == {"SGLANG_ENABLE_SPEC_V2": "1"}
    assert healed.engine.args["mamba_scheduler_strategy"] == "extra_buffer"
    assert healed.engine.env["SGLANG_ENABLE_SPEC_V2"] == "1"
    # and the real release accepts the healed args: its own resolution of them is what remedies start from
    assert dry is not None and dry.resolved["mamba_scheduler_strategy"] == "extra_buffer"
    assert dry.resolved["speculative_algorithm"] == "EAGLE"
    assert dry.resolved["disable_overlap_schedule"] is False        # SGLANG_ENABLE_SPEC_V2=1 keeps overlap on
    assert round(dry.resolved["mem_fraction_static"], 3) == 0.812    # 0.5.10's own formula + VLM reduction


def test_without_healing_the_seed_error_stops_before_launch(h200_host: Any, remote: Remote, tmp_path: Path,
                                                            monkeypatch: Any) -> None:
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path / "home"))
    with pytest.raises(PreflightFailed) as failed:
        BeforeLaunch(UpOptions(heal=False), UpReport(name="seed", host="h200", status="failed"), lambda e: None,
                     []).checked(remote, shipped_without_fix(h200_host, tmp_path), own_port=False)
    assert "speculative decoding on a hybrid Mamba model needs" in str(failed.value)


def test_plan_on_the_seed_era_reports_its_own_resolution_and_memory_rules(h200_host: Any, remote: Remote,
                                                                         tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    profile = Profile.model_validate({
        "name": "seed", "target": h200_host.target(tmp_path / "work"),
        "engine": {"python": "sglang-python", "model_path": str(QWEN36), "args": {"device": "cuda"}},
    })
    report = run_preflight(remote, profile, cache_dir=cache)
    assert report.facts.engine_version == SEED_ERA
    flagset = load_cached_flagset(cache, "sglang", SEED_ERA)
    assert flagset is not None and 330 <= len(flagset.flags) <= 380          # 354 options in 0.5.10
    assert flagset.has("mamba_scheduler_strategy") and not flagset.has("mamba_radix_cache_strategy")
    assert report.resolution == "done", report.resolution                    # not "not supported"
    # 0.5.10 turns `auto` into no_buffer (0.5.23 would pick extra_buffer here)
    assert any(o.startswith("engine will resolve mamba_scheduler_strategy auto -> no_buffer")
               for o in report.overrides), report.overrides
    assert report.memory is not None
    assert report.memory.mfs_source == "engine resolved"
    assert report.memory.mamba_strategy == "no_buffer" and report.memory.slots_per_request == 3
    assert report.resolved is not None
    assert report.memory.mem_fraction_static == pytest.approx(report.resolved["mem_fraction_static"])


def test_a_newer_flag_on_the_seed_era_is_written_with_its_old_name(h200_host: Any, remote: Remote,
                                                                   tmp_path: Path) -> None:
    profile = Profile.model_validate({
        "name": "seed", "target": h200_host.target(tmp_path / "work"),
        "engine": {"python": "sglang-python", "model_path": str(QWEN36),
                   "args": {"device": "cuda", "mamba_radix_cache_strategy": "extra_buffer"}},
    })
    report = run_preflight(remote, profile, cache_dir=tmp_path / "cache")
    assert report.profile.engine.args == {"device": "cuda", "mamba_scheduler_strategy": "extra_buffer"}
    assert report.resolution == "done", report.resolution
    assert os.path.basename(str(report.facts.engine_version)) == SEED_ERA
