"""Preflight over a real sshd: facts from the stand-in nvidia-smi, flags of the stand-in SGLang, memory plan."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.preflight.flags import load_cached_flagset
from deployer.preflight.facts import gather_facts
from deployer.preflight.checks import run_preflight
from deployer.preflight.known import for_target, known_version
from deployer.render.bundle import render
from deployer.profile.model import Profile
from deployer.remote.base import Remote
from deployer.remote.connect import connect
from sshbed import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "standin"
MODELS = ROOT / "tests" / "fixtures" / "models"


@pytest.fixture()
def bed(fresh_sshd: Any) -> Iterator[Any]:
    """A private sshd whose PATH has the stand-in nvidia-smi (so tests may change its GPUs)."""
    os.symlink(STANDIN / "bin" / "nvidia-smi", fresh_sshd.bin_dir / "nvidia-smi")
    yield fresh_sshd


@pytest.fixture()
def remote(bed: Any) -> Iterator[Remote]:
    r = connect(bed.spec())
    try:
        yield r
    finally:
        r.close()


class Counting:
    """A Remote that counts round trips."""

    def __init__(self, inner: Remote) -> None:
        self.inner, self.runs = inner, 0

    def run(self, cmd: str, **kw: Any) -> Any:
        self.runs += 1
        return self.inner.run(cmd, **kw)


def gpus_file(tmp_path: Path, gpus: list[dict[str, Any]]) -> str:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"gpus": gpus}))
    return str(path)


_ENGINE_PORTS: dict[Path, int] = {}


def engine_port(tmp_path: Path) -> int:
    """The engine port of this test's profiles: free on the target, the same for every profile of the test (the
    probe's cache is keyed by the arguments, the port among them)."""
    return _ENGINE_PORTS.setdefault(tmp_path, free_port())


def profile(tmp_path: Path, bed: Any, *, args: dict[str, Any] | None = None, env: dict[str, str] | None = None,
            model: str | None = None, python: str = "python3", port: int | None = None) -> Profile:
    return Profile.model_validate({
        "name": "pf",
        "target": bed.target(tmp_path / "work"),
        "engine": {"python": python, "model_path": model or str(MODELS / "qwen36-27b-like"),
                   "port": port or engine_port(tmp_path), "args": args or {},
                   "env": {"PYTHONPATH": str(STANDIN), **(env or {})}},
    })


def test_facts_in_one_round_trip(tmp_path: Path, bed: Any, remote: Remote) -> None:
    gpus = gpus_file(tmp_path, [
        {"name": "NVIDIA H200", "memory_total": 143771, "memory_used": 81000,
         "apps": [{"pid": 4242, "process_name": "python3", "used_memory": 80990}]},
        {"name": "NVIDIA H200", "memory_total": 143771, "memory_used": 1}])
    prof = profile(tmp_path, bed, env={"STANDIN_GPUS_FILE": gpus})
    counting = Counting(remote)
    facts = gather_facts(counting, prof)  # type: ignore[arg-type]
    assert counting.runs == 1
    assert [(g.index, g.total_mib, g.free_mib) for g in facts.gpus] == [(0, 143771, 62771), (1, 143771, 143770)]
    assert [(p.pid, p.used_mib, p.gpu_uuid) for p in facts.processes] == [(4242, 80990, facts.gpus[0].uuid)]
    assert facts.engine_version == "0.5.23" and facts.python_version and facts.python_version.startswith("3.")
    assert facts.disk_free_bytes and facts.disk_free_bytes > 0 and facts.port_free is True
    assert facts.model is not None and facts.model.weight_bytes == 51_000_000_000
    assert facts.model.config and facts.model.config["model_type"] == "qwen3_5"
    assert facts.flag_probe and len(facts.flag_probe["flags"]) > 10  # cache was empty: flags came along
    assert facts.problems == []


def test_missing_nvidia_smi_and_python_are_problems(tmp_path: Path, bed: Any, remote: Remote) -> None:
    (bed.bin_dir / "nvidia-smi").unlink()
    facts = gather_facts(remote, profile(tmp_path, bed, python="/nonexistent/python3"))
    assert "no NVIDIA driver / nvidia-smi on the target" in facts.problems
    assert any("engine python '/nonexistent/python3' not found" in p for p in facts.problems)
    assert facts.engine_version is None


def test_busy_port_is_a_problem(tmp_path: Path, bed: Any, remote: Remote) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        facts = gather_facts(remote, profile(tmp_path, bed, port=port))
    assert facts.port_free is False
    assert f"port {port} is already in use on the target" in facts.problems


def test_preflight_translates_checks_and_caches(tmp_path: Path, bed: Any, remote: Remote) -> None:
    cache = tmp_path / "cache"
    prof = profile(tmp_path, bed, args={"mamba_scheduler_strategy": "extra_buffer", "mem_frac": 0.85,
                                        "tp_size": 1},
                   env={"SGLANG_ENABLE_SPEC_V2": "1"})
    report = run_preflight(remote, prof, cache_dir=cache)
    args = report.profile.engine.args
    assert "mamba_radix_cache_strategy" in args and "mamba_scheduler_strategy" not in args
    assert args.get("mem_fraction_static") == 0.85 and "mem_frac" not in args
    assert any("mem-frac" in w and "prefix" in w for w in report.warnings)
    assert any("SGLANG_ENABLE_SPEC_V2" in w for w in report.warnings)
    assert load_cached_flagset(cache, "sglang", "0.5.23") is not None
    assert report.memory is not None and report.memory.gpu_total_mib == 143771
    text = report.render_text()
    assert "memory plan" in text and "mamba-radix-cache-strategy" in text

    start = time.monotonic()
    counting = Counting(remote)
    again = run_preflight(counting, prof, cache_dir=cache)  # type: ignore[arg-type]
    assert counting.runs == 2  # facts, then the dry resolution
    assert again.flags_cached and again.facts.flag_probe is None  # no introspection the second time
    assert again.profile.engine.args == report.profile.engine.args
    assert time.monotonic() - start < 30


def test_render_after_a_preflight_shows_what_up_launches(tmp_path: Path, bed: Any, remote: Remote) -> None:
    """A preflight records the target's engine version locally: `render` then translates as `up` does."""
    cache = tmp_path / "cache"
    prof = profile(tmp_path, bed, args={"mamba_scheduler_strategy": "extra_buffer", "tp_size": 1})
    assert known_version(prof, [cache]).version is None
    report = run_preflight(remote, prof, cache_dir=cache)
    fit = for_target(prof, [cache])
    assert fit.version.known and fit.version.version == "0.5.23" and "the last preflight against" in fit.version.basis
    assert render(fit.profile).argv == render(report.profile).argv
    assert "--mamba-radix-cache-strategy" in render(fit.profile).argv


def test_misspelt_flag_is_respelt_and_an_unknown_one_a_problem(tmp_path: Path, bed: Any, remote: Remote) -> None:
    report = run_preflight(remote, profile(tmp_path, bed, args={"mem_fraction_statc": 0.8}),
                           cache_dir=tmp_path / "c")
    assert report.ok and report.profile.engine.args == {"mem_fraction_static": 0.8}
    assert any("did you mean --mem-fraction-static? respelt as --mem-fraction-static" in w for w in report.warnings)
    report = run_preflight(remote, profile(tmp_path, bed, args={"zzq_totally_unknown": 7}), cache_dir=tmp_path / "c")
    assert any(p.startswith("unknown flag --zzq-totally-unknown for sglang 0.5.23") for p in report.problems)
    assert not report.ok and json.loads(json.dumps(report.to_json()))["ok"] is False
    assert report.refusal() is not None and report.refusal().exit_code == 2  # type: ignore[union-attr]


def test_memory_plan_from_a_local_model_config(tmp_path: Path, bed: Any, remote: Remote) -> None:
    gpus = gpus_file(tmp_path, [{"name": "NVIDIA H200", "memory_total": 143771, "memory_used": 100000}])
    prof = profile(tmp_path, bed, model="/nowhere/on/target", env={"STANDIN_GPUS_FILE": gpus})
    report = run_preflight(remote, prof, cache_dir=tmp_path / "c", model_config=MODELS / "qwen36-27b-like")
    assert report.memory is not None and not report.memory.fits
    assert any(p.startswith("memory: weights") for p in report.problems)


def vllm_profile(tmp_path: Path, bed: Any, args: dict[str, Any], gpus: str) -> Profile:
    return Profile.model_validate({
        "name": "pf-vllm", "target": bed.target(tmp_path / "work"),
        "engine": {"kind": "vllm", "python": "python3", "model_path": str(MODELS / "qwen3-8b"), "port": engine_port(tmp_path),
                   "args": args, "env": {"PYTHONPATH": str(STANDIN), "STANDIN_GPUS_FILE": gpus}},
    })


def test_vllm_memory_plan_from_the_targets_facts(tmp_path: Path, bed: Any, remote: Remote) -> None:
    """The stand-in nvidia-smi's GPUs and the model's config.json on the target feed vLLM's own memory model."""
    gpus = gpus_file(tmp_path, [{"name": "NVIDIA H200", "memory_total": 143771, "memory_used": 700}])
    ok = run_preflight(remote, vllm_profile(tmp_path, bed, {"max_model_len": 32768, "gpu_memory_utilization": 0.9},
                                            gpus), cache_dir=tmp_path / "c")
    assert ok.memory is not None and ok.memory.fits, ok.warnings
    rows = dict(ok.memory.rows())
    assert rows["max_model_len"] == "32768" and rows["GPU memory (total / free)"] == "143771 MiB / 143071 MiB"
    assert "KV blocks x block size" in ok.render_text() and ok.to_json()["memory"]["kv_tokens"] > 32768
    assert not any("no memory plan" in w for w in ok.warnings)

    small = run_preflight(remote, vllm_profile(tmp_path, bed, {"gpu_memory_utilization": 0.14}, gpus),
                          cache_dir=tmp_path / "c")
    assert small.memory is not None and not small.memory.fits and not small.ok
    assert any(p.startswith("memory: one request of max_model_len 40960 needs 5.62 GiB") for p in small.problems)
    assert small.memory.suggestions[0].startswith("max_model_len ")


def test_the_probe_is_cached_on_the_target_by_engine_install_gpus_and_args(tmp_path: Path, bed: Any,
                                                                          remote: Remote) -> None:
    """A second laptop's preflight (empty local cache) reads the flag table and the dry resolution the target kept;
    changing the engine install (a file in its package) or the args runs the probe again."""
    engine = tmp_path / "engine"
    shutil.copytree(STANDIN / "sglang", engine / "sglang", ignore=shutil.ignore_patterns("__pycache__"))
    probes = tmp_path / "xdg"
    args = {"mem_fraction_static": 0.8, "tp_size": 1}

    def preflight(laptop: str, **changes: Any) -> Any:
        prof = profile(tmp_path, bed, args={**args, **changes}, env={"XDG_CACHE_HOME": str(probes)})
        prof = prof.patched(env={**prof.engine.env, "PYTHONPATH": str(engine)})
        return run_preflight(remote, prof, cache_dir=tmp_path / laptop)

    first = preflight("laptop-1")
    assert not first.facts.flags_from_target_cache and not first.resolution_cached and first.resolution == "done"
    kept = sorted(p.name.split("-")[0] for p in (probes / "deployer" / "probes").iterdir())
    assert kept == ["flags", "resolve"]
    second = preflight("laptop-2")
    assert second.facts.flags_from_target_cache and second.resolution_cached
    assert second.flag_names == first.flag_names and second.overrides == first.overrides
    assert second.resolved == first.resolved and "(cached on the target)" in second.render_text()
    assert not preflight("laptop-3", mem_fraction_static=0.7).resolution_cached  # other args: resolved anew

    server_args = engine / "sglang" / "srt" / "server_args.py"
    os.utime(server_args, ns=(time.time_ns(), time.time_ns()))  # the install changed (an upgrade, an edit)
    changed = preflight("laptop-4")
    assert not changed.facts.flags_from_target_cache and not changed.resolution_cached
    assert changed.resolution == "done"


def test_a_resolution_with_secret_args_is_never_kept_on_the_target(tmp_path: Path, bed: Any, remote: Remote) -> None:
    probes = tmp_path / "xdg"
    prof = profile(tmp_path, bed, args={"api_key": "sk-secret-in-the-args-123"}, env={"XDG_CACHE_HOME": str(probes)})
    for _ in range(2):
        report = run_preflight(remote, prof, cache_dir=tmp_path / "cache")
        assert report.resolution == "done" and not report.resolution_cached
    for path in (probes / "deployer" / "probes").iterdir():
        assert not path.name.startswith("resolve-")
        assert b"sk-secret-in-the-args-123" not in path.read_bytes()
