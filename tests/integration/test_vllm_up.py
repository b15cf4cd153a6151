"""vLLM end to end: `deploy up` of a vLLM profile on the test sshd with the stand-in vLLM (real supervisor, real
HTTP), drift from its `non-default args` dump, smoke, and a KV-cache-too-small failure healed from the message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import deploy, events, write_profile
from deployer.engines import engine_for

pytestmark = pytest.mark.integration

VLLM = {"kind": "vllm"}


def report_of(stdout: str) -> dict[str, Any]:
    evs = events(stdout)
    assert evs and evs[-1]["event"] == "report", stdout[-3000:]
    return evs[-1]


def test_vllm_up_reaches_ready_smoke_and_down(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "home"
    prof = write_profile(tmp_path, sshd, name="qwen3-vllm", extra={"engine": VLLM},
                         args={"max_model_len": 8192, "gpu_memory_utilization": 0.9, "api_key": "sk-vllm-secret-1"},
                         env={"STANDIN_VLLM_CLEAR_SECRETS": "1"})
    up = deploy("up", str(prof), "--json", home=home)
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    evs = events(up.stdout)
    phases = [e["phase"] for e in evs if e["event"] == "phase"]
    order = [p.name for p in engine_for("vllm").log.phases]
    assert phases[:2] == ["args", "loading weights"] and phases == sorted(phases, key=order.index), phases
    report = report_of(up.stdout)
    assert report["status"] == "ready" and report["drift"] == [], report
    # preflight ran the vLLM probe against the target's (stand-in) vllm and said what it cannot check: vLLM's
    # memory model needs the model's config.json, which the target does not have (test_preflight has one)
    warnings = " ".join(e.get("message", "") for e in evs if e["event"] in ("warning", "preflight"))
    assert "no memory estimate: no config.json" in warnings, warnings
    assert "sk-vllm-secret-1" not in up.stdout + up.stderr

    run_dir = Path(report["run_dir"])
    # the key in vLLM's own variable of the 0600 env file, no argv word (Launch.secret_env; docs/fleet-router.md)
    assert "api-key" not in (run_dir / "launch.sh").read_text() and "API_KEY" not in (run_dir / "launch.sh").read_text()
    assert "VLLM_API_KEY=sk-vllm-secret-1\n" in (run_dir / "env").read_text()
    log = (run_dir / "engine.log").read_text()
    assert "Starting vLLM server on http://127.0.0.1:" in log and "Application startup complete." in log
    assert log.index("Starting vLLM server") < log.index("Application startup complete.")

    smoke = deploy("smoke", str(prof), "--skip-preflight", "--json", "--keep", home=home)
    assert smoke.returncode == 0, smoke.stderr + smoke.stdout[-2000:]
    assert "stand-in vLLM" in report_of(smoke.stdout)["answer"]

    st = deploy("status", str(prof), "--json", home=home)
    row = json.loads(st.stdout)
    assert st.returncode == 0 and row["status"] == "ready" and row["healthy"] is True, st.stdout
    down = deploy("down", str(prof), home=home)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stderr


def test_vllm_drift_is_read_from_the_non_default_args_dump(tmp_path: Path, sshd: Any) -> None:
    """`1k` is parsed by vLLM as 1000: the dump says so and deployer reports it as drift."""
    home = tmp_path / "home"
    prof = write_profile(tmp_path, sshd, name="vllm-drift", extra={"engine": VLLM},
                         args={"max_model_len": "1k", "gpu_memory_utilization": 0.92})
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    drift = report_of(up.stdout)["drift"]
    # gpu_memory_utilization 0.92 is vLLM 0.33.0's default: absent from the dump, and no drift
    assert drift == ["asked max_model_len=1k, engine resolved 1000"], drift
    deploy("down", str(prof), home=home)


def test_kv_cache_too_small_heals_by_setting_max_model_len_from_the_message(tmp_path: Path, sshd: Any) -> None:
    """A 24 GB GPU: Qwen3-8B's 40960-token default context does not fit; vLLM says the estimated maximum model
    length, deployer sets max_model_len to it and the second attempt is ready."""
    home = tmp_path / "home"
    fixed = tmp_path / "fixed.yaml"
    prof = write_profile(tmp_path, sshd, name="vllm-kv", extra={"engine": VLLM},
                         args={"gpu_memory_utilization": 0.9}, env={"STANDIN_GPU_GB": "23.5"})
    up = deploy("up", str(prof), "--json", "--save-fixed", str(fixed), home=home)
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    report = report_of(up.stdout)
    first, second = report["attempts"]
    assert first["outcome"] == "crashed" and second["outcome"] == "ready"
    assert first["diagnosis"]["signature"] == "kv-cache-too-small-for-max-model-len"
    assert any("estimated maximum model length is 30000" in e for e in first["diagnosis"]["evidence"])
    assert first["change"]["args"] == {"max_model_len": 30000}
    assert yaml.safe_load(fixed.read_text())["engine"]["args"]["max_model_len"] == 30000
    deploy("down", str(prof), home=home)


def test_unknown_vllm_flag_is_caught_before_launch(tmp_path: Path, sshd: Any) -> None:
    """An SGLang flag in a vLLM profile: the target's own vLLM parser (through the probe) rejects it."""
    home = tmp_path / "home"
    prof = write_profile(tmp_path, sshd, name="vllm-badflag", extra={"engine": VLLM},
                         args={"mem_fraction_static": 0.8})
    up = deploy("up", str(prof), "--json", home=home)
    assert up.returncode == 2, up.stderr[-2000:]  # refused, never dropped (README: exit codes)
    text = up.stdout + up.stderr
    assert "mem_fraction_static" in text or "mem-fraction-static" in text, text[-2000:]
    assert "Traceback" not in up.stderr
