"""Readiness that means a token, end to end over SSH with the stand-in engine (issue 26, item 4): a start whose
engine answers /health but generates nothing is not ready and says why; after ready, the supervisor's one-token
probe ends an idle engine whose core died (restart policy) with its diagnosis, and marks a loaded one unhealthy
without restarting it. The core's death is the stand-in's STANDIN_DEAD_CORE_FILE (tests/standin/standin_core.py)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, events, write_profile
from test_oncall import oncall
from test_stays_up import state_json, status_row, wait_row

pytestmark = pytest.mark.integration

NO_TOKEN = "the engine's HTTP server answers but generates nothing"
FAST = {"backoff_s": [0.2, 0.4], "window_s": 60, "grace_s": 2}
PROBE = {"probe_interval_s": 0.3, "probe_failures": 2, "probe_timeout_s": 0.6, "probe_exit_grace_s": 1.0}


def _profile(tmp_path: Path, sshd: Any, name: str, dead: Path, **env: str) -> Path:
    return write_profile(tmp_path, sshd, name=name, args={"enable_metrics": True},
                         env={"STANDIN_DEAD_CORE_FILE": str(dead), "SGLANG_HEALTH_CHECK_TIMEOUT": "1", **env},
                         extra={"restart": FAST, "health": PROBE})


def test_health_without_a_token_is_not_ready(tmp_path: Path, sshd: Any) -> None:
    """vLLM's /health answers 200 while its engine core is gone (vllm#16259): only a token makes it ready. The
    probe asks for the name the engine serves (--served-model-name), with its API key."""
    dead = tmp_path / "dead-core"
    prof = write_profile(tmp_path, sshd, name="nt", env={"STANDIN_DEAD_CORE_FILE": str(dead)},
                         args={"served_model_name": "tiny-served", "api_key": "sk-probe-1"},
                         extra={"engine": {"kind": "vllm"}, "health": {**PROBE, "startup_timeout_s": 4},
                                "retry": {"max_attempts": 1}})
    up = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h")
    assert up.returncode == 0, up.stdout + up.stderr
    dead.touch()   # dead from the start: /health 200, completions hang
    up = deploy("up", str(prof), "--skip-preflight", "--force", "--json", home=tmp_path / "h")
    said = up.stdout + up.stderr
    assert up.returncode == 5, said  # launch failed: no token within startup_timeout_s, one attempt
    shown = [e["line"] for e in events(up.stdout)
             if e.get("event") == "progress" and "generated token" in e.get("line", "")]
    assert shown and shown[0].startswith("/health answers; waiting for a generated token: no answer to a "
                                         "one-token completion after"), said
    assert f"/health answers but no token came back ({NO_TOKEN})" in said, said
    # the version brought back generates nothing either (the same dead core): it is not taken for ready
    assert "is serving again" not in said, said
    dead.unlink()
    deploy("down", str(prof), home=tmp_path / "h")


def test_an_idle_engine_that_generates_nothing_is_a_crash_and_restarted(tmp_path: Path, sshd: Any) -> None:
    """SGLang (the stand-in's default kind): its /health generates a token itself, so with the core dead it answers
    503 after SGLANG_HEALTH_CHECK_TIMEOUT (the real knob, 1 s here), while the gauges say idle and the engine never
    exits: a frozen scheduler. The probes make the crash once that has gone on for probe_exit_grace_s."""
    dead = tmp_path / "dead-core"
    prof = _profile(tmp_path, sshd, "idle", dead)
    assert deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h").returncode == 0
    first = status_row(sshd, tmp_path, "idle")[1]
    assert first["healthy"] and first["unhealthy"] is None
    dead.touch()
    crashed = wait_row(sshd, tmp_path, "idle", lambda r: (state_json(r).get("last_crash") or {}).get("probe_dead"),
                       "ended by the probe")
    dead.unlink()
    back = wait_row(sshd, tmp_path, "idle", lambda r: r["status"] == "ready" and r["restarts"] == 1 and r["healthy"],
                    "restarted and generating")
    assert back["pid"] != first["pid"]
    probe_dead = state_json(crashed)["last_crash"]["probe_dead"]
    assert probe_dead["failures"] >= 2 and "no answer to a one-token completion" in probe_dead["reason"]
    assert probe_dead["health"] == 503, probe_dead
    diagnosis = back["last_crash"]["diagnosis"]
    assert diagnosis["signature"] == "no-token" and NO_TOKEN in diagnosis["summary"], diagnosis
    assert "/health answered 503, and the engine never exited on its own" in str(diagnosis["evidence"]), diagnosis
    text = oncall(sshd, tmp_path, "status", "idle")
    assert NO_TOKEN in text.stdout, text.stdout
    assert deploy("down", str(prof), home=tmp_path / "h").returncode == 0


def test_a_loaded_engine_that_fails_the_probe_is_unhealthy_never_restarted(tmp_path: Path, sshd: Any) -> None:
    dead = tmp_path / "dead-core"
    # in flight long enough for the `status` calls below to see it running on a loaded box before the core dies
    prof = _profile(tmp_path, sshd, "busy", dead, STANDIN_CHAT_DELAY_S="12")
    assert deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h").returncode == 0
    first = status_row(sshd, tmp_path, "busy")[1]
    chat = json.dumps({"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    client = ("import sys, urllib.request; urllib.request.urlopen(urllib.request.Request("
              f"'http://127.0.0.1:{first['port']}/v1/chat/completions', data=sys.argv[1].encode(), "
              "headers={'content-type': 'application/json'}), timeout=120).read()")
    sshd_cmd = f"python3 -c {shlex.quote(client)} {shlex.quote(chat)}"
    request = subprocess.Popen(["ssh", "-F", str(sshd.ssh_config), "deployer-test", sshd_cmd],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_row(sshd, tmp_path, "busy", lambda r: (r["metrics"] or {}).get("requests_running") == 1,
                 "a request in flight")
        dead.touch()   # the core dies with the request running: it stays counted
        row = wait_row(sshd, tmp_path, "busy", lambda r: (r["unhealthy"] or {}).get("running") == 1, "unhealthy")
        code, row = status_row(sshd, tmp_path, "busy")
        assert row["status"] == "ready" and not row["healthy"] and code == 6, row
        # far more failed probes than probe_failures: under load, never a crash
        wait_row(sshd, tmp_path, "busy", lambda r: r["unhealthy"]["since"] < state_json(r)["updated_at"] - 3,
                 "unhealthy for 3 s")
        state = state_json(row)
        assert state["restarts"] == 0 and state["pid"] == first["pid"] and state["status"] == "ready"
        text = oncall(sshd, tmp_path, "status", "busy").stdout
        assert "unhealthy: no token from the one-token probe:" in text and "under load: not restarted" in text, text
    finally:
        if dead.exists():
            dead.unlink()
        request.wait(timeout=60)
    assert request.returncode == 0
    healthy = wait_row(sshd, tmp_path, "busy", lambda r: r["healthy"] and r["unhealthy"] is None, "healthy again")
    assert healthy["restarts"] == 0 and healthy["pid"] == first["pid"]
    assert deploy("down", str(prof), home=tmp_path / "h").returncode == 0
