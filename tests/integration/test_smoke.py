"""`deploy smoke` end to end: real sshd, real supervisor, stand-in engine, real HTTP through the SSH tunnel.

Each test runs the real CLI in a fresh interpreter and reads what CI would read: the exit code, the JUnit file
(parsed with xml.etree) and the final JSON object.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, events, write_profile

pytestmark = pytest.mark.integration

PHASES = ["preflight", "push", "start", "ready", "request", "stop"]
def smoke(*argv: str, home: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return deploy("smoke", *argv, home=home, timeout=timeout)


def junit_cases(path: Path) -> tuple[ET.Element, dict[str, ET.Element]]:
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    assert suite is not None
    cases = {c.get("name", ""): c for c in suite.findall("testcase")}
    assert list(cases) == PHASES
    return suite, cases


def outcome_of(case: ET.Element) -> str:
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            return tag
    return "passed"


def report_of(stdout: str) -> dict[str, Any]:
    evs = events(stdout)
    if evs and evs[-1]["event"] == "error":  # a failed --json run ends with its error event, after the report
        evs = evs[:-1]
    assert evs and evs[-1]["event"] == "report", stdout[-2000:]
    return evs[-1]


def status_of(prof: Path, home: Path) -> dict[str, Any]:
    st = deploy("status", str(prof), "--json", home=home)
    data: dict[str, Any] = json.loads(st.stdout)
    assert (st.returncode == 0) == data["serving"] and st.returncode in (0, 5, 6, 8), st.stderr  # README codes
    return data


def test_ok_keep_already_running_then_stop(tmp_path: Path, sshd: Any) -> None:
    home, xml = tmp_path / "home", tmp_path / "smoke.xml"
    prof = write_profile(tmp_path, sshd, name="smoke-ok")
    kept = smoke(str(prof), "--skip-preflight", "--keep", "--json", "--junit", str(xml), home=home)
    assert kept.returncode == 0, kept.stderr + kept.stdout
    suite, cases = junit_cases(xml)
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("6", "0", "0")
    assert [outcome_of(c) for c in cases.values()] == ["passed"] * 5 + ["skipped"]
    assert all(float(c.get("time", "-1")) >= 0 for c in cases.values())
    report = report_of(kept.stdout)
    assert [p["status"] for p in report["phases"]] == ["passed"] * 5 + ["skipped"]
    assert report["model"] == "Qwen/Qwen3-8B" and "stand-in" in report["answer"] and report["latency_ms"] > 0
    assert any(e["event"] == "smoke_phase" for e in events(kept.stdout)[:-1])   # NDJSON progress before it
    assert status_of(prof, home)["healthy"] is True                          # --keep: still serving

    # The same version already healthy: nothing redeployed, the request still made, and not ours to stop.
    again = smoke(str(prof), "--skip-preflight", "--json", home=home)
    assert again.returncode == 0, again.stderr
    statuses = {p["name"]: p["status"] for p in report_of(again.stdout)["phases"]}
    assert statuses == {"preflight": "passed", "push": "skipped", "start": "skipped", "ready": "skipped",
                        "request": "passed", "stop": "skipped"}
    assert status_of(prof, home)["healthy"] is True

    forced = smoke(str(prof), "--skip-preflight", "--force", "--junit", str(xml), home=home)
    assert forced.returncode == 0, forced.stderr
    assert [outcome_of(c) for c in junit_cases(xml)[1].values()] == ["passed"] * 6
    assert "smoke smoke-ok" in forced.stdout and "answer (Qwen/Qwen3-8B" in forced.stdout
    after = status_of(prof, home)
    assert after["healthy"] is False and after["status"] in ("stopped", "exited")


def test_launch_failure_is_charged_to_start(tmp_path: Path, sshd: Any) -> None:
    home, xml = tmp_path / "home", tmp_path / "smoke.xml"
    prof = write_profile(tmp_path, sshd, name="smoke-crash", env={"STANDIN_MODE": "crash"})
    res = smoke(str(prof), "--skip-preflight", "--json", "--junit", str(xml), home=home)
    assert res.returncode == 5, res.stderr + res.stdout
    assert res.stderr.strip().splitlines()[-1].startswith("error: smoke-crash: engine killed by SIGKILL")
    _, cases = junit_cases(xml)
    assert [outcome_of(c) for c in cases.values()] == ["passed", "passed", "failure", "skipped", "skipped",
                                                        "skipped"]
    failure = cases["start"].find("failure")
    assert failure is not None and failure.get("type") == "LaunchFailed"
    assert "unexpected fused kernel state" in failure.get("message", "")
    body = failure.text or ""
    assert "first traceback of the last attempt:" in body and "engine.log tail" in body
    assert "Load weight begin" in body                                        # the real log tail
    phases = {p["name"]: p for p in report_of(res.stdout)["phases"]}
    assert phases["start"]["status"] == "failed" and "unexpected fused kernel state" in phases["start"]["details"]
    assert phases["ready"]["details"].startswith("not reached")


def test_request_failure_is_unhealthy(tmp_path: Path, sshd: Any) -> None:
    """Ready, then dead before the request (--settle): exit 6, request failed, stop still runs.

    The stand-in has no knob for an empty completion; an engine that dies after warm-up is the unhealthy
    case it can play today.
    """
    home, xml = tmp_path / "home", tmp_path / "smoke.xml"
    prof = write_profile(tmp_path, sshd, name="smoke-sick",
                         env={"STANDIN_MODE": "crash_after_ready", "STANDIN_CRASH_AFTER_S": "1"},
                         extra={"health": {"interval_s": 0.1}})
    res = smoke(str(prof), "--skip-preflight", "--settle", "3", "--junit", str(xml), home=home)
    assert res.returncode == 6, res.stderr + res.stdout
    assert res.stderr.strip().splitlines()[-1].startswith("error: no token from a one-token completion on port ")
    _, cases = junit_cases(xml)
    assert [outcome_of(c) for c in cases.values()] == ["passed"] * 4 + ["failure", "passed"]
    failure = cases["request"].find("failure")
    assert failure is not None and failure.get("type") == "Unhealthy"
    assert "engine.log tail" in (failure.text or "")


def test_a_server_that_answers_but_generates_nothing_fails_the_smoke(tmp_path: Path, sshd: Any) -> None:
    """Ready (a token came back), then its engine core dies during --settle: /health still answers 200 (the vLLM
    stand-in, as vllm#16259), but the smoke's one-token probe gets no token: exit 6, the request phase failed."""
    home, dead = tmp_path / "home", tmp_path / "dead-core"
    prof = write_profile(tmp_path, sshd, name="smoke-core", env={"STANDIN_DEAD_CORE_FILE": str(dead)},
                         extra={"engine": {"kind": "vllm"}, "health": {"probe_timeout_s": 1, "probe_interval_s": 0}})
    outcome = tmp_path / "work" / "smoke-core" / "current" / "outcome.json"

    def kill_core_once_ready() -> None:
        for _ in range(600):   # bounded: 60 s
            if outcome.exists():
                dead.touch()
                return
            time.sleep(0.1)
    killer = threading.Thread(target=kill_core_once_ready, daemon=True)
    killer.start()
    try:
        res = smoke(str(prof), "--skip-preflight", "--settle", "4", home=home)
    finally:
        killer.join(timeout=70)
        dead.unlink(missing_ok=True)
    assert res.returncode == 6, res.stderr + res.stdout
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no token from a one-token completion on port ") and \
        "no answer to a one-token completion after" in last, last


@pytest.mark.parametrize("knob,needle", [({"STANDIN_CHAT_TEXT": ""}, "empty"),
                                         ({"STANDIN_CHAT_STATUS": "500"}, "500")])
def test_empty_or_failing_answer_is_unhealthy(tmp_path: Path, sshd: Any, knob: dict[str, str], needle: str) -> None:
    home, xml = tmp_path / "home", tmp_path / "smoke.xml"
    prof = write_profile(tmp_path, sshd, name="smoke-answer", env=knob)
    res = smoke(str(prof), "--skip-preflight", "--json", "--junit", str(xml), home=home)
    assert res.returncode == 6, res.stderr + res.stdout[-2000:]
    assert needle in res.stderr.strip().splitlines()[-1]
    _, cases = junit_cases(xml)
    assert [outcome_of(c) for c in cases.values()] == ["passed"] * 4 + ["failure", "passed"]
    assert status_of(prof, home)["status"] == "stopped"


def test_bad_profile_exit_2_and_junit_still_written(tmp_path: Path, sshd: Any) -> None:
    home, xml = tmp_path / "home", tmp_path / "out" / "smoke.xml"
    prof = write_profile(tmp_path, sshd, name="smoke-bad", extra={"helth": {"interval_s": 1}})
    res = smoke(str(prof), "--json", "--junit", str(xml), home=home)
    assert res.returncode == 2, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "helth" in res.stderr
    suite, cases = junit_cases(xml)
    assert (suite.get("failures"), suite.get("skipped")) == ("1", "5")
    failure = cases["preflight"].find("failure")
    assert failure is not None and "bad profile" in failure.get("message", "") and failure.get("type") == \
        "ProfileError"
    report = report_of(res.stdout)
    assert report["exit_code"] == 2 and report["ok"] is False and report["name"] == "smoke-bad"
