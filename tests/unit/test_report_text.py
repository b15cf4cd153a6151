"""The text of the read commands' reports (status of each kind, history, diagnose, ls, smoke), pinned line by line:
the golden file is what the registered text forms printed before the reports rendered themselves (`lines()`, issue
38), for reports that take every branch (a hung crash, a squatter, a pulled replica, a remedy, a live `ls`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from deployer.cli import show
from deployer.deployments.known import KnownReport
from deployer.deployments.reports import DiagnosisReport, FleetStatus, HistoryReport, HostStatus, NodeStatus
from deployer.operate.rows import HistoryEntry, NodeFacts, ShownDiagnosis, StatusRow
from deployer.output.text import text
from deployer.smoke import Answer, SmokeReport

GOLDEN = Path(__file__).with_name("report_text.golden")
NOW = 1796500000.0


def test_the_read_reports_print_the_text_they_always_printed(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setattr(time, "time", lambda: NOW)
    try:
        _print_every_report()
    finally:
        monkeypatch.undo()
        time.tzset()
    out = capsys.readouterr()
    assert out.err == ""
    assert out.out.splitlines() == GOLDEN.read_text().splitlines()


def test_only_what_depends_on_the_terminal_keeps_a_form_by_type() -> None:
    """Every other report gives its own lines: the forms registered by type are plan's (its width) and up's live
    report (its sink), once deployer.output.text_runs is imported."""
    import deployer.output.text_runs  # noqa: F401  (registers up's)

    assert sorted(t.__name__ for t in text.registry if t is not object) == ["PlanReport", "UpReport"]


def shown(report: Any) -> None:
    show.text(report)


def _print_every_report() -> None:
    def row(**kw: Any) -> StatusRow:
        base = dict(name="qwen", host="gpu-a", status="ready", pid=123, uptime_s=42.4, healthy=True, attempt=2,
                    content_hash="abcdef0123456789", run_dir="/w/qwen/runs/r2", port=30000, restarts=1,
                    last_crash={"at": NOW - 3700, "exit_code": None, "signal": 9, "signal_name": "SIGKILL",
                                "hung": {"at": NOW - 3700, "reason": "no engine step for 20s", "stacks": {"file": "stacks-1.txt", "method": "py-spy"}},
                                "diagnosis": {"signature": "oom", "summary": "out of memory", "hint": "lower it"}},
                    exit_code=None, signal_name=None, drift=["engine.args.x changed"], runs=2,
                    diagnosis=None, lock={"text": "held by u@h"}, serving=True,
                    metrics={"summary": "2 running, 0 waiting", "gpu_memory": [{"index": 0, "used_mib": 10, "total_mib": 80}]},
                    unhealthy={"reason": "timeout", "running": 0, "waiting": 0, "failures": 3},
                    engine="sglang", engine_version="0.5.23", model="Qwen/Qwen3-8B")
        base.update(kw)
        return StatusRow.of(base)

    r1 = row()
    r2 = row(name="b", unhealthy={"reason": "x", "failures": 1}, metrics={"off": True, "error": "metrics off"},
             last_crash={"at": NOW - 100, "exit_code": 3}, diagnosis={"signature": None, "summary": "s"}, lock=None, drift=[], engine=None)
    r3 = row(name="c", unhealthy={"holders": [1], "reason": "port held by nginx"}, metrics={"error": "refused"}, last_crash=None, uptime_s=None)
    shown(HostStatus([r1, r2, r3]))
    shown(HostStatus([]))
    n0 = r1.replace(node=NodeFacts(0, "head", first_crash=True))
    n1 = r2.replace(node=NodeFacts(1, "worker", last_crash_diagnosis=ShownDiagnosis.of({"signature": "nccl", "summary": "nccl timeout"})), diagnosis=None)
    shown(NodeStatus([n0, n1]))
    fleet = {"name": "f", "serving": False, "replicas": [
        {"member": "r0", "host": "gpu-a", "status": "ready", "healthy": True, "url": "http://a:1", "pid": 5, "content_hash": "x"*20, "restarts": 0,
         "metrics": {"summary": "1 running"}, "readiness": {"healthy_workers": 1, "total_workers": 2}},
        {"member": "r1", "host": "gpu-b", "alias": "b", "status": "down", "healthy": False, "url": "http://b:1", "error": "e" * 400,
         "in_router": False, "pulled": {"reason": "hung", "not_back": "gave up"}},
        {"member": "r2", "host": "gpu-c", "status": "ready", "healthy": False, "url": "http://c:1", "in_router": False}],
        "router": {"member": "router", "host": "gpu-a", "status": "ready", "healthy": True, "url": "http://a:2", "foreign_workers": ["http://evil:1"]}}
    shown(FleetStatus(fleet, 9))
    entries = [HistoryEntry(lock=True, started_at=NOW - 50, outcome="lock taken over", detail="from u@h"),
               HistoryEntry.of_attempt({"started_at": NOW - 40, "outcome": "ready", "run_id": "r2", "content_hash": "abcdef0123456789", "attempt": 2, "current": True,
                                        "diagnosis": {"signature": "oom", "summary": "s"}, "change": {"reason": "lowered mem"},
                                        "timeline": {"phases": [], "ready_s": None}, "hung": {"reason": "no step", "top": ["frame a", "frame b"]}}),
               HistoryEntry.of_attempt({"started_at": None, "outcome": None, "run_id": "r1", "attempt": 1, "deployment": "qwen", "host": "gpu-a"})]
    shown(HistoryReport(entries))
    shown(DiagnosisReport({"run_id": "r1", "failed_at": NOW - 8000, "now": {"run_id": "r2", "healthy": True},
        "engine": {"kind": "sglang", "how": "log"}, "signature": "oom", "summary": "oom!", "transient": False,
        "evidence": ["line 1", "line 2"], "hint": "do x", "remedy": {"reason": "why", "args": {"a_b": None, "c": True, "d": 0.5}, "env": {"E": None, "F": "1"}},
        "would_change": {"args": {"x": 1}}, "traceback": "Traceback\n  here"}))
    shown(DiagnosisReport({"run_id": "r1", "now": {"run_id": "r1", "healthy": False, "status": "crashloop"}, "signature": None, "transient": True}))
    shown(DiagnosisReport({}))
    known = [{"name": "qwen", "host": "gpu-a", "workdir": "/w", "version": "abcdef0123456789", "state": "up", "at": NOW - 200000, "live": {"status": "ready", "healthy": True}},
             {"name": "b", "host": "gpu-b", "workdir": "/ww", "state": "down", "live": {"error": "unreachable"}}]
    shown(KnownReport(known, live=True))
    shown(KnownReport(known))
    shown(KnownReport([]))
    shown(KnownReport([], nothing_found="looked"))
    sm = SmokeReport("one", "gpu-a")
    sm.phases["preflight"].status, sm.phases["preflight"].duration_s = "passed", 1.5
    sm.answer = Answer("qwen", "hello there " * 20, "content", 12.34, 1.0)
    shown(sm)
