"""The dashboard's typed values and sources (deployer/dashboard/model.py, source.py, shown.py): they read the CLI's
`--json` row shapes, log windows by byte offset, the throttle, what is shown, and the demo data."""

from __future__ import annotations

import json
from importlib.resources import as_file, files
from pathlib import Path
from typing import Any

from deployer.dashboard import (
    Attempt, DeploymentDetail, LogRequest, OverviewRow, StaticSource, Throttled,
)
from deployer.dashboard.source import MAX_LOG_BYTES, chunk_of, valid_key
from deployer.dashboard.shown import json_bytes, shown

def test_an_overview_row_reads_a_status_json_row() -> None:
    """`deploy status --json`'s row (operate/deployment.py `describe` + serving): its names, extra ones ignored."""
    status = {"name": "qwen", "host": "root@gpu", "status": "ready", "pid": 4242, "uptime_s": 12.5, "healthy": True,
              "attempt": 2, "content_hash": "abc", "run_dir": "/w/qwen/runs/2", "port": 30000, "restarts": 1,
              "last_crash": None, "exit_code": None, "signal_name": None, "drift": [], "runs": 2, "diagnosis": None,
              "lock": None, "serving": True}
    row = OverviewRow.from_json({**status, "key": "qwen@gpu", "engine": "sglang"})
    assert (row.name, row.host, row.status, row.serving, row.healthy) == ("qwen", "root@gpu", "ready", True, True)
    assert (row.uptime_s, row.restarts, row.attempt, row.port) == (12.5, 1, 2, 30000)
    assert row.tokens_per_s is None and row.p99_latency_ms is None and row.kv_usage_pct is None
    assert OverviewRow.from_json(row.to_json()) == row


def test_an_attempt_reads_a_history_json_row() -> None:
    """`deploy history --json`'s attempt row (operate/history.py), with the change a heal made."""
    history = {"kind": "attempt", "run_id": "20261201T1-1", "current": False, "attempt": 1, "up_id": "u1",
               "started_at": 1.5, "content_hash": "h", "outcome": "crashed", "detail": "exit 1",
               "diagnosis": {"signature": "cuda-oom", "summary": "OOM", "transient": False, "evidence": ["e"],
                             "traceback": "Traceback...", "remedy": None},
               "change": {"args": {"mem_fraction_static": 0.8, "gone": None}, "env": {}, "reason": "less",
                          "basis": {"mem_fraction_static": "engine resolved 0.9"}},
               "drift": ["asked a=1, engine resolved 2"], "restarts": 0}
    attempt = Attempt.from_json(history)
    assert attempt.healed and attempt.change is not None and attempt.change.args == {"mem_fraction_static": 0.8,
                                                                                     "gone": None}
    assert attempt.diagnosis is not None and attempt.diagnosis.signature == "cuda-oom"
    assert attempt.to_json()["healed"] is True
    assert not Attempt.from_json({**history, "change": None}).healed


def test_a_detail_round_trips_through_json() -> None:
    data = json.loads(files("deployer.dashboard").joinpath("demo/deployments/tiny-standin@box-a.json").read_text())
    detail = DeploymentDetail.from_json(data)
    assert DeploymentDetail.from_json(json.loads(json.dumps(detail.to_json()))) == detail
    assert [a.healed for a in detail.attempts] == [True, False]


def test_a_tail_starts_at_a_line_and_a_follow_waits_for_the_end_of_a_line() -> None:
    data = b"first line\nsecond line\nthird li"
    tail = chunk_of(data, LogRequest(offset=None, max_bytes=20))
    assert tail.lines == ("second line",) and tail.start == 11 and tail.end == 23 and tail.size == len(data)
    whole = chunk_of(data, LogRequest())
    assert whole.lines == ("first line", "second line") and whole.end == 23
    assert chunk_of(data, LogRequest(offset=23)).lines == ()
    assert chunk_of(data + b"ne\n", LogRequest(offset=23)).lines == ("third line",)
    assert chunk_of(b"a\rb\nc\r\n", LogRequest()).lines == ("a\rb", "c\r")  # \r is a redraw, not a line end


def test_a_line_longer_than_the_window_is_handed_on_rather_than_stalling() -> None:
    data = b"x" * 5000
    first = chunk_of(data, LogRequest(offset=0, max_bytes=1000))
    assert first.lines == ("x" * 1000,) and first.end == 1000
    assert chunk_of(b"x" * 10, LogRequest(offset=0, max_bytes=1000)).lines == ()  # short: wait for its end
    huge = chunk_of(b"y" * (MAX_LOG_BYTES + 10), LogRequest(offset=0, max_bytes=10 << 20))
    assert huge.end == MAX_LOG_BYTES  # whatever the page asks, one read is capped


def test_keys_that_could_leave_a_directory_are_refused(tmp_path: Path) -> None:
    assert valid_key("tiny-standin@box-a") and valid_key("chat.fleet-r0@gpu-1")
    for bad in ("../x", "a/b", "", ".hidden", "a..b", "x" * 200, "a b", "a\nb"):
        assert not valid_key(bad), bad
    (tmp_path / "secret.log").write_text("no\n")
    source = StaticSource([], log_dir=tmp_path / "logs")
    assert source.log("../secret", LogRequest()) is None


def test_a_directory_source_follows_its_log_files(tmp_path: Path) -> None:
    (tmp_path / "deployments").mkdir()
    (tmp_path / "logs").mkdir()
    row = {"key": "a@h", "name": "a", "host": "h", "status": "ready"}
    (tmp_path / "overview.json").write_text(json.dumps([row]))
    (tmp_path / "deployments" / "a@h.json").write_text(json.dumps(
        {"row": row, "attempts": [{"run_id": "r2", "outcome": "ready", "current": True}]}))
    (tmp_path / "logs" / "a@h.log").write_text("one\n")
    source = StaticSource.from_dir(tmp_path)
    assert [r.key for r in source.overview()] == ["a@h"]
    first = source.log("a@h", LogRequest())
    assert first is not None and first.lines == ("one",) and first.run_id == "r2"
    with (tmp_path / "logs" / "a@h.log").open("a") as log:
        log.write("two\n")
    more = source.log("a@h", LogRequest(offset=first.end))
    assert more is not None and more.lines == ("two",)
    assert source.detail("b@h") is None and source.log("b@h", LogRequest()) is None


class _Counting:
    def __init__(self) -> None:
        self.asked = 0

    def overview(self) -> list[OverviewRow]:
        self.asked += 1
        return [OverviewRow(key="k", name="n", host="h", status=f"s{self.asked}")]

    def detail(self, key: str) -> DeploymentDetail | None:
        self.asked += 1
        return None if key == "missing" else DeploymentDetail(row=OverviewRow(key=key, name="n", host="h", status="s"))

    def log(self, key: str, request: LogRequest) -> Any:
        self.asked += 1
        return None


def test_the_throttle_asks_the_source_at_most_once_per_interval() -> None:
    now = [0.0]
    inner = _Counting()
    source = Throttled(inner, min_interval_s=2.0, clock=lambda: now[0])
    assert source.overview()[0].status == "s1"
    now[0] = 1.9
    assert source.overview()[0].status == "s1" and inner.asked == 1
    source.detail("k")
    source.detail("k")
    assert inner.asked == 2  # a detail has its own slot
    source.detail("missing")
    source.detail("missing")
    assert inner.asked == 4  # nothing is remembered of a key that does not exist
    now[0] = 2.1
    assert source.overview()[0].status == "s5"
    source.log("k", LogRequest())
    source.log("k", LogRequest())
    assert inner.asked == 7  # offset reads go through


def test_shown_strips_and_masks_every_string_keys_included() -> None:
    from deployer.secrets import remember

    remember(["sekrit-value-42"])
    value = {"a\x1b[31m": ["x\x1b]0;t\x07y", {"k": "sekrit-value-42!"}], "n": 3, "none": None}
    assert shown(value) == {"a": ["xy", {"k": "***!"}], "n": 3, "none": None}
    assert json_bytes({"t": "<b>&</b>"}) == b'{"t":"\\u003cb\\u003e\\u0026\\u003c/b\\u003e"}'
    assert json.loads(json_bytes({"t": "<b>&</b>"})) == {"t": "<b>&</b>"}


def test_the_demo_data_is_complete() -> None:
    """Every demo row has its page and its log, so `--demo` shows no dead link."""
    demo = files("deployer.dashboard").joinpath("demo")
    with as_file(demo) as root:
        source = StaticSource.from_dir(Path(root))
        rows = source.overview()
        assert {r.kind for r in rows} == {"deployment", "replica", "node"}
        assert {r.engine for r in rows} >= {"stand-in", "vllm"}
        for row in rows[:2]:
            detail = source.detail(row.key)
            assert detail is not None and detail.row == row
            assert source.log(row.key, LogRequest()) is not None
