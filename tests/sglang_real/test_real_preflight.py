"""Preflight against real SGLang 0.5.23 (parser, flag set, dry resolution) over the SSH test bed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deployer.preflight.flags import load_cached_flagset
from deployer.preflight.checks import PreflightReport, run_preflight
from deployer.profile.model import Profile
from deployer.remote.base import Remote

from sglang_release import only_release

pytestmark = only_release("0.5.23")

MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "models" / "qwen3-next-80b-a3b"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flag-cache")


def preflight(host: Any, remote: Remote, cache: Path, tmp_path: Path, args: dict[str, Any]) -> PreflightReport:
    profile = Profile.model_validate({
        "name": "real",
        "target": host.target(tmp_path / "work"),
        "engine": {"python": "sglang-python", "model_path": str(MODEL), "args": {"device": "cuda", **args}},
    })
    return run_preflight(remote, profile, cache_dir=cache)


def test_real_flag_set_is_introspected_and_cached(h200_host: Any, remote: Remote, cache: Path,
                                                  tmp_path: Path) -> None:
    report = preflight(h200_host, remote, cache, tmp_path, {})
    assert report.facts.engine_version == "0.5.23"
    flagset = load_cached_flagset(cache, "sglang", "0.5.23")
    assert flagset is not None and 500 <= len(flagset.flags) <= 600  # 531 options in 0.5.23
    assert flagset.has("mamba_radix_cache_strategy") and not flagset.has("mamba_scheduler_strategy")
    strategy = flagset.lookup("mamba_radix_cache_strategy")
    assert strategy is not None and strategy.choices == ("auto", "extra_buffer", "extra_buffer_lazy", "no_buffer")
    assert "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION" in flagset.env_names
    # the real Qwen3-Next-80B weights (162.7 GB) cannot fit one H200: the plan says so before launch
    assert report.memory is not None and not report.memory.fits
    assert any(p.startswith("memory: weights (151.5 GiB per GPU) leave no memory") for p in report.problems)


def test_old_mamba_flag_is_translated_and_resolution_reports_the_strategy(
        h200_host: Any, remote: Remote, cache: Path, tmp_path: Path) -> None:
    if load_cached_flagset(cache, "sglang", "0.5.23") is None:   # this test ran first in its worker (any order)
        assert not preflight(h200_host, remote, cache, tmp_path, {}).flags_cached
    report = preflight(h200_host, remote, cache, tmp_path, {"mamba_scheduler_strategy": "auto"})
    assert report.flags_cached  # the flag set probed once is read from the cache
    assert report.profile.engine.args == {"device": "cuda", "mamba_radix_cache_strategy": "auto"}
    assert any("--mamba-scheduler-strategy was renamed" in w for w in report.warnings)
    assert report.resolution == "done"
    assert any(o.startswith("engine will resolve mamba_radix_cache_strategy auto -> extra_buffer")
               for o in report.overrides), report.overrides
    assert any(o.startswith("engine will resolve mem_fraction_static unset -> 0.907") for o in report.overrides)


def test_without_overlap_the_engine_resolves_no_buffer(h200_host: Any, remote: Remote, cache: Path,
                                                       tmp_path: Path) -> None:
    report = preflight(h200_host, remote, cache, tmp_path, {"disable_overlap_schedule": True})
    assert any(o.startswith("engine will resolve mamba_radix_cache_strategy auto -> no_buffer")
               for o in report.overrides), report.overrides


def test_misspelt_flag_is_caught_before_launch(h200_host: Any, remote: Remote, cache: Path,
                                               tmp_path: Path) -> None:
    """Real SGLang 0.5.23's flag table: the one close flag respelt, loudly (the flag policy: never dropped); a flag
    with no close one is refused."""
    report = preflight(h200_host, remote, cache, tmp_path, {"mamba_radix_cache_stratgy": "auto"})
    assert any(w.startswith("unknown flag --mamba-radix-cache-stratgy for sglang 0.5.23; did you mean "
                            "--mamba-radix-cache-strategy? respelt") for w in report.warnings), report.warnings
    refused = preflight(h200_host, remote, cache, tmp_path, {"zzq_totally_unknown": 7})
    assert any("unknown flag --zzq-totally-unknown for sglang 0.5.23" in p and "refused" in p
               for p in refused.problems), refused.problems


def test_resolution_catches_an_invalid_combination(h200_host: Any, remote: Remote, cache: Path,
                                                   tmp_path: Path) -> None:
    report = preflight(h200_host, remote, cache, tmp_path, {"mamba_radix_cache_strategy": "no_buffer"})
    assert report.resolution.startswith("failed")
    assert any("no_buffer do not support overlap schedule" in p for p in report.problems), report.problems


def test_the_shipped_qwen36_profile_against_real_sglang(h200_host: Any, tmp_path: Path) -> None:
    """`deploy plan profiles/qwen36-mtp.yaml` (written for the mamba_scheduler_strategy era) on a 0.5.23 target."""
    import json
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    shipped = tmp_path / "shipped"  # `extends:` stays inside the profile's folder: the shipped files copied in
    shipped.mkdir()
    for name in ("qwen36-mtp.yaml", "base.yaml"):
        (shipped / name).write_bytes((repo / "profiles" / name).read_bytes())
    model = repo / "tests" / "fixtures" / "models" / "qwen36-27b-like"
    target = json.dumps(h200_host.target(tmp_path / "work"))
    (tmp_path / "p.yaml").write_text(f"extends: shipped/qwen36-mtp.yaml\nname: qwen36-mtp\ntarget: {target}\n"
                                     f"engine: {{python: sglang-python, model_path: {model}, "
                                     f"args: {{device: cuda}}}}\n")
    proc = subprocess.run([sys.executable, "-m", "deployer.cli", "plan", str(tmp_path / "p.yaml"), "--json"],
                          capture_output=True, text=True, timeout=300, cwd=str(repo),
                          env={"PATH": os.environ["PATH"], "HF_TOKEN": "hf_test", "DEPLOYER_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["facts"]["engine_version"] == "0.5.23"  # base.yaml's HF env makes the target print warnings
    assert plan["engine_args"]["mamba_radix_cache_strategy"] == "extra_buffer"
    assert "mamba_scheduler_strategy" not in plan["engine_args"]
    assert any("SGLANG_ENABLE_SPEC_V2" in w for w in plan["warnings"])
    assert any(o.startswith("engine will resolve speculative_algorithm NEXTN -> EAGLE") for o in plan["overrides"])
    memory = plan["memory"]
    assert memory["mfs_source"] == "engine resolved" and memory["mem_fraction_static"] < 0.9  # ViT headroom
