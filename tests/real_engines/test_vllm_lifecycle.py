"""Real vLLM 0.32.0 (CPU build) deployed by deployer over the real sshd: up -> phases -> ready -> a real chat
completion -> status -> logs -> restart -> down."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import MODEL, free_port, vllm_engine, write_real_profile
from lifecycle import assert_served_lifecycle, report_of, up_json


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
    assert_served_lifecycle(prof, home, port, str(MODEL), phases)
