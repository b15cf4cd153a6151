"""Issue 26: what `status` reads of a running engine (deployer.operate.serving): /metrics and nvidia-smi through the
remote, the previous scrape kept locally for the interval's rates; `top`'s rows from each kind's status report; the
stand-in engines' /metrics checked against the real captures they replay; `kept_open` connections."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from deployer.deployments.reports import FleetStatus, HostStatus, NodeStatus
from deployer.operate.rows import NodeFacts, StatusRow
from deployer.deployments.top import TopReport
from deployer.engines import engine_for
from deployer.observe.prometheus import parse
from deployer.operate import serving
from deployer.output.top import table
from deployer.remote import connect as connect_mod
from deployer.remote.base import EndpointUnreachable, HttpReply, Result

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "standin"))
import standin_metrics  # noqa: E402  (the stand-ins' module, stdlib only)

CAPTURES = ROOT / "tests" / "cases" / "metrics"
GPUS = "0, 70123, 143771\n1, 12, 143771\n"


@dataclass
class Target:
    """A remote that answers /health, /metrics (the given texts, one per request) and nvidia-smi."""

    texts: list[str | None]
    gpus: str | None = GPUS
    label: str = "gpu-box"
    asked: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def request(self, method: str, port: int, path: str, **_: Any) -> HttpReply:
        with self.lock:
            self.asked.append(path)
        if path == "/health":
            return HttpReply(200, b"", {})
        if not self.texts:
            raise EndpointUnreachable("nothing listening")
        text = self.texts.pop(0)
        return HttpReply(404, b"{}", {}) if text is None else HttpReply(200, text.encode(), {})

    def run(self, cmd: str, **_: Any) -> Result:
        with self.lock:
            self.asked.append("nvidia-smi")
        return Result(cmd, 0 if self.gpus is not None else 1, self.gpus or "", "")


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path))
    return tmp_path


def clock(*times: float) -> Any:
    """time.time for the scrapes: one value per scrape (the last one kept)."""
    left = list(times)
    return lambda: left.pop(0) if len(left) > 1 else left[0]


WHERE = serving.Endpoint(8000, "127.0.0.1", "/health", "/w/demo/runs/1", gpus=[0])


def test_first_look_has_no_interval_the_second_covers_the_time_between(monkeypatch: pytest.MonkeyPatch) -> None:
    vllm = CAPTURES / "vllm-0.32.0"
    target = Target([(vllm / "before.prom").read_text(), (vllm / "after.prom").read_text()])
    monkeypatch.setattr(serving.time, "time", clock(100.0, 110.0))
    first = serving.look(target, engine_for("vllm"), WHERE)  # type: ignore[arg-type]
    assert first.healthy and sorted(target.asked) == ["/health", "/metrics", "nvidia-smi"]
    m = first.metrics
    assert m is not None and m["interval_s"] is None and m["generation_tokens_per_s"] is None
    assert m["gpu_memory"] == [{"index": 0, "used_mib": 70123, "total_mib": 143771}]  # the profile's GPU only
    second = serving.look(target, engine_for("vllm"), WHERE).metrics  # type: ignore[arg-type]
    assert second is not None and second["interval_s"] == 10.0
    # the capture's own counters: every token generated between its before and after scrapes, over 10 s
    gen = [s.value for s in parse((vllm / "after.prom").read_text()).samples("vllm:generation_tokens_total")]
    assert second["generation_tokens_per_s"] == pytest.approx(sum(gen) / 10.0) and sum(gen) > 0
    assert second["e2e_latency"]["window"] == "interval" and second["e2e_latency"]["count"] > 0


def test_a_kept_scrape_too_old_starts_no_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (CAPTURES / "vllm-0.32.0" / "before.prom").read_text()
    target = Target([text, text])
    monkeypatch.setattr(serving.time, "time", clock(1.0, serving.PREVIOUS_MAX_AGE_S + 2.0))
    serving.look(target, engine_for("vllm"), WHERE)  # type: ignore[arg-type]
    later = serving.look(target, engine_for("vllm"), WHERE).metrics  # type: ignore[arg-type]
    assert later is not None and later["interval_s"] is None and later["e2e_latency"]["window"] == "since_start"


def test_no_metrics_endpoint_says_which_flag_and_no_gpu_is_absent_not_zero() -> None:
    looked = serving.look(Target([None], gpus=None), engine_for("sglang"), WHERE)  # type: ignore[arg-type]
    assert looked.metrics == {"error": "/metrics answered HTTP 404; add `enable_metrics: true` to engine.args "
                                       "(SGLang serves /metrics only with --enable-metrics)", "gpu_memory": None}
    gone = serving.look(Target([]), engine_for("vllm"), WHERE).metrics  # type: ignore[arg-type]
    assert gone is not None and gone["error"] == "nothing listening"
    quiet = serving.look(Target([]), engine_for("vllm"), WHERE, with_metrics=False)  # type: ignore[arg-type]
    assert quiet.healthy and quiet.metrics is None


@pytest.mark.parametrize("kind, capture, replay", [("vllm", "vllm-0.32.0/before.prom", standin_metrics.vllm),
                                                    ("sglang", "sglang-0.5.23/after.prom", standin_metrics.sglang)])
def test_the_standins_metrics_are_the_real_capture_advanced(kind: str, capture: str, replay: Any) -> None:
    """Every family, type and series of the real capture, nothing else; a completion advances its counters."""
    real = parse((CAPTURES / capture).read_text())
    served = replay()
    for _ in range(2):
        served.started()
        served.finished()
    mine = parse(served.text())
    assert {n: f.type for n, f in mine.families.items()} == {n: f.type for n, f in real.families.items()}
    assert {n: [(s.name, s.labels) for s in f.samples] for n, f in mine.families.items()} == \
        {n: [(s.name, s.labels) for s in f.samples] for n, f in real.families.items()}
    prefix = f"{kind}:"
    grown = {s.name for f in mine.families.values() for s, r in zip(f.samples, real.families[f.name].samples)
             if s.value != r.value}
    assert {f"{prefix}prompt_tokens_total", f"{prefix}generation_tokens_total",
            f"{prefix}e2e_request_latency_seconds_count"} <= grown, grown


def _row(**extra: Any) -> dict[str, Any]:
    return {"name": "demo", "host": "gpu-box", "status": "ready", "healthy": True, "restarts": 1,
            "metrics": {"requests_running": 2.0, "requests_waiting": None, "generation_tokens_per_s": 41.5,
                        "kv_cache_usage": 0.25, "time_to_first_token": {"p99_s": 0.12},
                        "e2e_latency": {"p99_s": 1.5}}, **extra}


def _status_row(**extra: Any) -> StatusRow:
    """A single host's / a node's status row as on-call types it (every key describe() writes)."""
    node = extra.pop("node", None)
    full = {"pid": 1, "uptime_s": 1.0, "attempt": 1, "content_hash": "c", "run_dir": "/r", "port": 1,
            "last_crash": None, "exit_code": None, "signal_name": None, "drift": [], "runs": 1, "diagnosis": None,
            "lock": None, "serving": True, **_row(**extra)}
    row = StatusRow.of(full)
    return row if node is None else row.replace(node=NodeFacts(node, "rank 0 (API)" if node == 0 else "dummy"))


def test_top_rows_for_each_kind_and_the_table() -> None:
    host = TopReport.of("demo", HostStatus([_status_row()]))
    nodes = TopReport.of("grp", NodeStatus([_status_row(node=0), _status_row(node=1, metrics=None)]))
    fleet = TopReport.of("fl", FleetStatus({"name": "fl", "replicas": [_row(member="r0", alias="node-0")],
                                            "router": _row(member="router", metrics=None)}, 0))
    assert [(r.deployment, r.member) for r in host.rows] == [("demo", "demo")]
    assert [(r.member, r.requests_running) for r in nodes.rows] == [("node 0", 2.0), ("node 1", None)]
    assert [(r.member, r.host) for r in fleet.rows] == [("r0", "node-0"), ("router", "gpu-box")]
    one = host.to_json()[0]
    assert one["kv_cache_usage"] == 0.25 and one["ttft_p99_s"] == 0.12 and one["requests_waiting"] is None
    lines = table(host.rows)
    assert lines[0].split()[:4] == ["DEPLOYMENT", "MEMBER", "HOST", "STATE"]
    assert lines[1].split() == ["demo", "demo", "gpu-box", "ready", "2", "-", "41.5", "25.0", "120ms", "1.50s",
                                "1"]


def test_kept_open_reuses_one_connection_per_target(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    class Conn:
        def __init__(self, host: str) -> None:
            self.host, self.closed = host, False

        def close(self) -> None:
            self.closed = True

    class Conv:
        def __init__(self, conn: Conn) -> None:
            self.conn, self.closed = conn, False

        @classmethod
        def open(cls, conn: Conn, wait: bool = True) -> Conv:
            return cls(conn)

        def close(self) -> None:
            self.closed = True

    def fake_connect(spec: Any) -> Conn:
        made.append(spec.host)
        return Conn(spec.host)

    monkeypatch.setattr(connect_mod, "connect", fake_connect)
    monkeypatch.setattr(connect_mod, "Conversation", Conv)
    a, b = connect_mod.TargetSpec(host="a"), connect_mod.TargetSpec(host="b")
    with connect_mod.kept_open():
        seen = []
        for spec in (a, b, a, a):
            with connect_mod.conversing(spec) as conv:
                seen.append(conv)
        assert made == ["a", "b"] and seen[0] is seen[2] is seen[3] and not seen[0].closed
    assert all(c.closed and c.conn.closed for c in seen)
    with connect_mod.conversing(a) as plain:  # outside: a connection per call, closed after it
        pass
    assert made == ["a", "b", "a"] and plain.closed
