"""The watch over the real sshd with the stand-in engine: a weight download drawn as tqdm bars (longer than the
stall timeout) reaches ready on attempt 1 and is shown; a frozen bar is still a stall; a hostile log line (8 MB,
no newline, OSC escapes) is bounded everywhere it is shown or stored."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import deploy, events, write_profile

pytestmark = pytest.mark.integration

DOWNLOAD = {"STANDIN_MODE": "download", "STANDIN_DOWNLOAD_S": "6", "STANDIN_DOWNLOAD_FILES": "3",
            "STANDIN_DOWNLOAD_GB": "54"}
SHORT_STALL = {"health": {"interval_s": 0.2, "stall_timeout_s": 1.5, "startup_timeout_s": 60}}


def test_a_download_longer_than_the_stall_timeout_reaches_ready_on_attempt_1(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "home"
    prof = write_profile(tmp_path, sshd, name="dl", env=DOWNLOAD, extra=SHORT_STALL)
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    evs = events(up.stdout)
    assert [a["outcome"] for a in evs[-1]["attempts"]] == ["ready"]
    phases = [e["phase"] for e in evs if e["event"] == "phase"]
    assert phases.index("loading weights") < phases.index("downloading") < phases.index("ready")
    downloads = [e for e in evs if e["event"] == "progress" and e.get("file")]
    files = sorted({e["file"] for e in downloads})
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert len(downloads) >= 6  # live: many updates, not one at the end
    done = [e for e in downloads if e["percent"] == 100]
    assert done and done[-1]["total_bytes"] == pytest.approx(18e9, rel=0.01)
    moving = [e for e in downloads if 0 < e["percent"] < 100]
    assert moving and all(e["rate_bytes_s"] and 0 < e["bytes"] < e["total_bytes"] for e in moving)

    # the same start for a person, with stderr not a terminal (a CI log): the download is shown, lines not wrapped
    again = deploy("up", str(prof), "--skip-preflight", "--force", home=home)
    assert again.returncode == 0, again.stderr
    shown = [ln for ln in again.stderr.splitlines() if "downloading" in ln]
    assert any("model-00001-of-00003.safetensors" in ln and "GB" in ln for ln in shown), again.stderr
    assert "attempt 1: ready" in again.stderr and "attempt 2" not in again.stderr
    deploy("down", str(prof), home=home)


@pytest.mark.parametrize("redraw", ["1", "0"])
def test_a_frozen_download_bar_is_still_a_stall(tmp_path: Path, sshd: Any, redraw: str) -> None:
    home = tmp_path / "home"
    env = {**DOWNLOAD, "STANDIN_MODE": "download_frozen", "STANDIN_FREEZE_AT": "0.3", "STANDIN_FREEZE_REDRAW": redraw}
    prof = write_profile(tmp_path, sshd, name=f"frozen{redraw}", env=env,
                         extra={**SHORT_STALL, "retry": {"max_attempts": 1, "backoff_s": 0.2}})
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=home)
    assert up.returncode == 5, up.stderr
    report = events(up.stdout)[-2]
    assert report["event"] == "report"
    attempt = report["attempts"][0]
    assert attempt["outcome"] == "hung" and "did not move" in attempt["detail"]
    assert attempt["diagnosis"]["signature"] == "hang"
    assert "model-00001-of-00003.safetensors" in attempt["diagnosis"]["summary"]
    assert json.loads(up.stdout.splitlines()[-1])["event"] == "error"
    deploy("down", str(prof), home=home)


def test_a_hostile_line_is_bounded_in_output_outcome_history_and_logs(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "home"
    hostile = tmp_path / "hostile.log"
    hostile.write_bytes(b"[2026-11-30 10:00:00] starting\n" + b"Z" * (8 << 20)
                        + b"\x1b]0;owned terminal title\x07\x1b]8;;http://evil.example/\x1b\\ LAST WORDS")  # no newline
    prof = write_profile(tmp_path, sshd, name="hostile",
                         env={"STANDIN_MODE": "fail_text", "STANDIN_FAIL_LOG": str(hostile), "STANDIN_EXIT": "1"},
                         extra={"retry": {"max_attempts": 2, "backoff_s": 0.2}})
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=home)
    assert up.returncode == 5, up.stderr[-2000:]
    assert len(up.stdout) + len(up.stderr) < 256 << 10, (len(up.stdout), len(up.stderr))
    assert json.loads(up.stdout.splitlines()[-1])["event"] == "error"
    human = deploy("up", str(prof), "--skip-preflight", home=home)
    assert human.returncode == 5 and len(human.stdout) + len(human.stderr) < 64 << 10
    assert "\x1b" not in human.stderr and "\x07" not in human.stderr
    runs = sorted((tmp_path / "work" / "hostile" / "runs").iterdir())
    assert runs and all((r / "outcome.json").stat().st_size < 64 << 10 for r in runs)
    db = sqlite3.connect(str(home / "history.sqlite3"))
    sizes = [len(d or "") for (d,) in db.execute("SELECT diagnosis FROM attempts WHERE deployment = 'hostile'")]
    db.close()
    assert sizes and max(sizes) < 64 << 10
    local = deploy("history", "hostile", "--local", home=home)
    assert local.returncode == 0 and len(local.stdout.splitlines()) == len(sizes), local.stderr

    logs = deploy("logs", str(prof), "-n", "5", home=home)
    assert logs.returncode == 0, logs.stderr
    last = logs.stdout.splitlines()[-1]
    assert last.endswith("LAST WORDS") and last.startswith("ZZZ") and " bytes cut] ... " in last
    assert len(logs.stdout) < 64 << 10 and "\x1b" not in logs.stdout and "\x07" not in logs.stdout


def test_a_download_that_prints_nothing_is_seen_in_the_hub_cache(tmp_path: Path, sshd: Any) -> None:
    """huggingface_hub turns its bars off when stderr is not a terminal (the supervisor's log file): the bytes
    growing in the hub cache are the progress then."""
    home = tmp_path / "home"
    hub = tmp_path / "hf-hub"
    prof = write_profile(tmp_path, sshd, name="quietdl", extra=SHORT_STALL,
                         env={**DOWNLOAD, "STANDIN_MODE": "download_quiet", "HF_HUB_CACHE": str(hub)})
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    evs = events(up.stdout)
    assert [a["outcome"] for a in evs[-1]["attempts"]] == ["ready"]
    cached = [e for e in evs if e["event"] == "progress" and e.get("source") == "hub cache"]
    assert cached and cached[0]["phase"] == "downloading" and cached[0]["file"] == "Qwen/Qwen3-8B"
    assert all(e["bytes"] > 0 and e["rate_bytes_s"] > 0 for e in cached)
    assert sorted(p.name for p in (hub / "models--Qwen--Qwen3-8B" / "blobs").iterdir())[0].endswith("5a1d0c3e")
    deploy("down", str(prof), home=home)


HANGS_AFTER_BIND_ERROR = """#!/bin/sh
# Real SGLang 0.5.23 when its port is taken (shared/real-engines.md): uvicorn's error, then it never exits.
echo "[2026-12-01 18:40:02] server_args=ServerArgs(model_path='m', port=$STANDIN_PORT)"
echo "[2026-12-01 18:40:20] ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', $STANDIN_PORT): address already in use"
trap 'exit 0' TERM
i=0
while [ $i -lt 3000 ]; do sleep 0.1; i=$((i+1)); done
"""


def test_an_engine_that_hangs_after_a_fatal_bind_error_is_given_up_on_in_seconds(tmp_path: Path, sshd: Any) -> None:
    """Real SGLang logs uvicorn's bind failure and hangs forever: deployer stops it after a few seconds (not at
    stall_timeout_s, here 60 s), says the port is taken (exit 4) and leaves nothing running."""
    home = tmp_path / "home"
    fake = tmp_path / "hanging-python"
    fake.write_text(HANGS_AFTER_BIND_ERROR)
    fake.chmod(0o755)
    prof = write_profile(tmp_path, sshd, name="bindhang",
                         extra={"health": {"interval_s": 0.2, "stall_timeout_s": 60, "startup_timeout_s": 120},
                                "retry": {"max_attempts": 3, "backoff_s": 0.2}})
    data = yaml.safe_load(prof.read_text())
    data["engine"]["python"] = str(fake)
    data["engine"]["env"]["STANDIN_PORT"] = str(data["engine"]["port"])
    prof.write_text(yaml.safe_dump(data))
    started = time.monotonic()
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=home)
    took = time.monotonic() - started
    assert up.returncode == 4, up.stderr + up.stdout[-3000:]
    assert took < 30, took
    assert f"port {data['engine']['port']}" in up.stderr and "could not bind" in up.stderr, up.stderr
    evs = events(up.stdout)
    assert [e["signature"] for e in evs if e["event"] == "diagnosis"] == ["port-in-use"], evs
    # it had its chance to exit (FATAL_GRACE_S) before one of the two that watch for it ended it: the watcher (a
    # `hung` event) or, racing it with the same grace, the run's supervisor (the engine then `exited`)
    hung = [e for e in evs if e["event"] == "hung"]
    if hung:
        assert hung[0]["stalled_s"] >= 5, hung
    else:
        ended = [e for e in evs if e["event"] == "exited"]
        said = (Path(json.loads(deploy("status", str(prof), "--json", home=home).stdout)["run_dir"])
                / "supervisor.log").read_text()
        assert ended and "engine printed a fatal error and did not exit within 5 s" in said, (ended, said)
        assert took >= 5, took
    st = json.loads(deploy("status", str(prof), "--json", home=home).stdout)
    assert st["status"] in ("stopped", "exited") and not st.get("healthy"), st
