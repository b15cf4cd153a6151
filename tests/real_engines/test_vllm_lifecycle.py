"""Real vLLM 0.32.0 (CPU build) deployed by deployer over the real sshd: up -> phases -> ready -> a real chat
completion -> status -> logs -> restart -> down."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import MODEL, free_port, vllm_engine, write_real_profile
from deploy_helpers import deploy
from dashboard_row import assert_dashboard_shows
from lifecycle import assert_served_lifecycle, phases_of, report_of, standin_twin, status_row, up_json


def test_real_vllm_up_serves_then_status_logs_restart_down(tmp_path: Path, host: Any) -> None:
    home, port = tmp_path / "home", free_port()
    prof = write_real_profile(tmp_path, host, "tiny-vllm", vllm_engine(port, tmp_path))
    code, evs, said = up_json(prof, home)
    assert code == 0, said
    phases = [e["phase"] for e in evs if e["event"] == "phase"]
    # vLLM 0.32.0's CPU startup as deployer reads it (no CUDA graphs on a CPU; --enforce-eager)
    assert phases == ["args", "loading weights", "weights loaded", "allocating cache", "http up", "ready"], phases
    report = report_of("\n".join(__import__("json").dumps(e) for e in evs))
    assert report["status"] == "ready" and report["drift"] == [], report
    preflight = " ".join(e.get("message", "") for e in evs if e["event"] in ("warning", "preflight", "problem"))
    assert "cannot introspect" not in preflight and "could not introspect" not in preflight, preflight
    _, row = status_row(prof, home)
    assert_dashboard_shows(prof, home, "tiny-vllm", "vllm", phases, "Application startup complete.",
                           Path(row["run_dir"]))
    assert_served_lifecycle(prof, home, port, str(MODEL), phases)

    # the fast tier's stand-in vLLM, same profile: deployer must read the same startup from it
    twin, code, twin_evs, said = standin_twin(prof, home, "tiny-vllm-standin",
                                              env={"STANDIN_STEP_S": "0", "STANDIN_READY_DELAY_S": "0"})
    assert code == 0, said
    assert phases_of(twin_evs) == phases_of(evs), (phases_of(twin_evs), phases_of(evs))
    assert deploy("down", str(twin), home=home, timeout=60).returncode == 0
