"""Issue 39 (item 2): the canary's verdict (deployer.deployments.fleet.canary_judge) from metric samples, each gate alone, the
profile's `rollout:` section, and what refuses a canary before anything is touched.

The samples: the stand-in engines' /metrics (tests/standin/standin_metrics.py), which replays a real SGLang 0.5.23
and vLLM 0.32.0 capture advanced per completion, read at a window's start and end exactly as the rollout reads a
replica (deployer.observe.serving); a "worse release" is the same stand-in with STANDIN_SLOWER_X or
STANDIN_FAIL_EVERY set.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from deployer.engines import engine_for
from deployer.errors import PartlyFailed, ProfileError
from deployer.deployments.fleet import canary as canary_mod
from deployer.deployments.fleet import canary_batch
from deployer.deployments.fleet.canary import CanaryPlan, canary_roller, check_canary
from deployer.deployments.fleet.canary_judge import WindowNumbers, judge
from deployer.deployments.fleet.canary_metrics import Read, measure
from deployer.deployments.fleet.canary_record import verdict_entry
from deployer.deployments.fleet.report import FleetReport, ReplicaResult
from deployer.deployments.fleet.router import Worker
from deployer.deployments.fleet.members import fleet_of
from deployer.observe.names import load_metric_names
from deployer.observe.prometheus import Scrape, parse
from deployer.observe.serving import ServingMetrics
from deployer.deployments.fleet.report import report_lines
from deployer.profile.model import Canary, Profile, Rollout
from deployer.remote.base import HttpReply, Remote
from deployer.runner.fanout import TaggedSink
from deployer.runner.report import UpOptions

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "standin"))
import standin_metrics  # noqa: E402  (the stand-ins' module, stdlib only)

GATES = Canary(window_s=5, min_requests=10)


def _window(kind: str, replica: int, requests: int, monkeypatch: pytest.MonkeyPatch, *, slower: float = 1.0,
            fail_every: int = 0, window_s: float = 5.0) -> WindowNumbers:
    """One stand-in replica's numbers over a window in which it served `requests` chat completions."""
    monkeypatch.setenv("STANDIN_SLOWER_X", str(slower))
    replay = standin_metrics.sglang() if kind == "sglang" else standin_metrics.vllm()
    before = Scrape(1000.0, parse(replay.text()))
    for i in range(1, requests + 1):
        if fail_every and i % fail_every == 0:
            replay.failed()
            continue
        replay.started()
        replay.finished()
    after = Scrape(1000.0 + window_s, parse(replay.text()))
    path = engine_for(kind).knowledge.metrics
    assert path is not None
    return WindowNumbers.of(replica, ServingMetrics.from_scrapes(load_metric_names(path), after, before))


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_the_same_release_is_promoted(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    canary = _window(kind, 0, 40, monkeypatch)
    others = [_window(kind, 1, 40, monkeypatch), _window(kind, 2, 38, monkeypatch)]
    verdict = judge(canary, others, GATES, 5.0)
    assert verdict.decision == "promote", verdict.checks
    checks = {c.name: c for c in verdict.checks}
    assert checks["traffic"].passed and checks["traffic"].canary == 40 and checks["traffic"].baseline == 78
    assert checks["ttft_p99"].passed and checks["itl_p99"].passed and checks["tokens_per_s"].passed
    assert checks["itl_p99"].value == pytest.approx(1.0)
    assert checks["tokens_per_s"].canary == pytest.approx(40 * 10 / 5.0)          # 10 tokens each, over 5 s
    assert "every gate passed" in verdict.summary() and "promoted" in verdict.summary()


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_three_times_slower_per_token_is_rolled_back_on_its_itl(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    canary = _window(kind, 0, 40, monkeypatch, slower=3.0)
    others = [_window(kind, 1, 40, monkeypatch)]
    verdict = judge(canary, others, GATES, 5.0)
    assert verdict.decision == "roll-back"
    itl = next(c for c in verdict.checks if c.name == "itl_p99")
    assert itl.passed is False and itl.value is not None and itl.value > GATES.max_p99_ratio, itl
    assert itl.canary is not None and itl.baseline is not None and itl.canary > 2 * itl.baseline
    assert any("itl_p99: FAILED" in r and "rollout.canary.max_p99_ratio" in r for r in verdict.reasons)


def test_one_answer_in_five_failing_is_rolled_back_on_its_error_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    canary = _window("sglang", 0, 50, monkeypatch, fail_every=5)
    others = [_window("sglang", 1, 50, monkeypatch)]
    assert canary.errors == 10 and canary.requests == 50 and others[0].errors == 0
    verdict = judge(canary, others, GATES, 5.0)
    error = next(c for c in verdict.checks if c.name == "error_rate")
    assert verdict.decision == "roll-back" and error.passed is False
    assert error.canary == pytest.approx(0.2) and error.baseline == 0 and error.value == pytest.approx(0.2)


def test_an_error_rate_within_the_delta_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    canary = _window("sglang", 0, 100, monkeypatch, fail_every=50)         # 2%
    others = [_window("sglang", 1, 100, monkeypatch, fail_every=100)]       # 1%
    loose = judge(canary, others, Canary(min_requests=10, max_error_rate_delta=0.02), 5.0)
    strict = judge(canary, others, Canary(min_requests=10, max_error_rate_delta=0.005), 5.0)
    assert loose.decision == "promote" and strict.decision == "roll-back"


def _numbers(replica: int = 0, requests: float = 100, errors: float | None = 0, ttft: float | None = 0.1,
             itl: float | None = 0.01, tps: float | None = 100.0) -> WindowNumbers:
    return WindowNumbers(replica, requests, errors, ttft, itl, tps)


@pytest.mark.parametrize("canary, others, failing", [
    (_numbers(ttft=0.16), [_numbers(1)], "ttft_p99"),                          # x1.6 > x1.5
    (_numbers(itl=0.016), [_numbers(1)], "itl_p99"),
    (_numbers(tps=79.0), [_numbers(1)], "tokens_per_s"),                       # x0.79 < x0.8
    (_numbers(errors=3), [_numbers(1, errors=1)], "error_rate"),               # +2 points > +1
    (_numbers(requests=9), [_numbers(1)], "traffic"),                          # the canary saw too little
    (_numbers(), [_numbers(1, requests=4), _numbers(2, requests=5)], "traffic"),   # so did the others, together
    (_numbers(), [], "traffic"),                                               # nobody to compare with
])
def test_each_gate_alone_rolls_back(canary: WindowNumbers, others: list[WindowNumbers], failing: str) -> None:
    verdict = judge(canary, others, GATES, 5.0)
    assert verdict.decision == "roll-back"
    assert [c.name for c in verdict.checks if c.passed is False] == [failing], verdict.checks


@pytest.mark.parametrize("canary, others", [
    (_numbers(ttft=0.15), [_numbers(1)]),                                      # exactly at the limit
    (_numbers(tps=80.0), [_numbers(1)]),
    (_numbers(errors=2), [_numbers(1, errors=1)]),                              # +1 point
    (_numbers(requests=10), [_numbers(1, requests=4), _numbers(2, requests=6)]),
])
def test_at_the_limits_it_is_promoted(canary: WindowNumbers, others: list[WindowNumbers]) -> None:
    verdict = judge(canary, others, GATES, 5.0)
    assert verdict.decision == "promote", verdict.checks


def test_the_baseline_is_the_median_p99_and_the_mean_throughput() -> None:
    others = [_numbers(1, ttft=0.1, tps=100), _numbers(2, ttft=0.2, tps=50), _numbers(3, ttft=0.9, tps=150)]
    checks = {c.name: c for c in judge(_numbers(ttft=0.25, tps=100), others, GATES, 5.0).checks}
    assert checks["ttft_p99"].baseline == pytest.approx(0.2) and checks["ttft_p99"].passed   # x1.25 of the median
    assert checks["tokens_per_s"].baseline == pytest.approx(100.0)


def test_a_quantity_not_exposed_is_not_compared_and_does_not_decide() -> None:
    verdict = judge(_numbers(errors=None, ttft=None), [_numbers(1, errors=None)], GATES, 5.0)
    checks = {c.name: c for c in verdict.checks}
    assert checks["error_rate"].passed is None and "not exposed" in checks["error_rate"].note
    assert checks["ttft_p99"].passed is None and "the canary" in checks["ttft_p99"].note
    assert verdict.decision == "promote"


def test_the_verdict_keeps_every_number_for_history() -> None:
    verdict = judge(_numbers(itl=0.03), [_numbers(1)], GATES, 5.0)
    itl = next(c for c in verdict.checks if c.name == "itl_p99")
    assert (itl.canary, itl.baseline, itl.limit) == (0.03, 0.01, 1.5) and itl.value == pytest.approx(3.0)
    assert "canary 0.03s, the others 0.01s: x3.00, at most x1.5" in itl.line()
    assert verdict.summary().startswith("canary r0 rolled back after 5s: itl_p99: FAILED")


# -- the profile's rollout section ---------------------------------------------------------------------------

def _fleet(**extra: Any) -> Profile:
    data: dict[str, Any] = {"name": "f", "replicas": [{"host": "a"}, {"host": "b", "engine_port": 31000}],
                            "engine": {"kind": "sglang", "model_path": "m"}, "router": {"port": 9000}, **extra}
    return Profile.model_validate(data)


def test_the_rollout_section_has_defaults_and_takes_the_profiles_values() -> None:
    assert _fleet().rollout is None and "rollout" not in _fleet().model_dump()   # records stay as they were
    default = Rollout()
    assert default.max_unavailable == 1 and default.canary.window_s == 60 and default.canary.max_p99_ratio == 1.5
    given = _fleet(rollout={"max_unavailable": 2, "canary": {"window_s": 3, "min_requests": 5,
                                                             "max_error_rate_delta": 0.05,
                                                             "min_tokens_per_s_ratio": 0.5}}).rollout
    assert given is not None
    assert given.max_unavailable == 2 and given.canary.window_s == 3 and given.canary.min_requests == 5
    assert given.canary.max_error_rate_delta == 0.05 and given.canary.min_tokens_per_s_ratio == 0.5


def test_a_replicas_own_profile_carries_no_rollout() -> None:
    """Each replica's run records its own profile: without the fleet's `rollout` (a key an earlier release's
    strict reading of that record would refuse)."""
    fleet = fleet_of(_fleet(rollout={"max_unavailable": 2}), lambda _t: "127.0.0.1")
    assert all("rollout" not in r.profile.model_dump(mode="json") for r in fleet.replicas)
    assert fleet.profile.model_dump(mode="json")["rollout"]["max_unavailable"] == 2


@pytest.mark.parametrize("bad", [{"max_unavailable": 0}, {"canary": {"window_s": 0}},
                                 {"canary": {"max_p99_ratio": 0.5}}, {"canary": {"min_tokens_per_s_ratio": 2}},
                                 {"canary": {"windows": 3}}])
def test_a_bad_rollout_value_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _fleet(rollout=bad)


def test_a_canary_needs_a_router_and_two_replicas() -> None:
    def address(_target: Any) -> str:
        return "127.0.0.1"

    check_canary(fleet_of(_fleet(), address))
    no_router = _fleet()
    no_router.router = None
    with pytest.raises(ProfileError, match="needs a router"):
        check_canary(fleet_of(no_router, address))
    one = _fleet(replicas=[{"host": "a"}])
    with pytest.raises(ProfileError, match="at least two replicas"):
        check_canary(fleet_of(one, address))


def test_the_report_shows_the_verdict_and_every_gate_with_its_numbers() -> None:
    report = FleetReport("f", mode="canary", outcome="rolled-back")
    report.canary = judge(_numbers(itl=0.03), [_numbers(1)], GATES, 5.0)
    report.notes.append(report.canary.headline())
    data = json.loads(json.dumps(report.to_json()))
    assert data["canary"]["decision"] == "roll-back" and data["outcome"] == "rolled-back"
    lines = report_lines(data)
    assert "  canary r0 rolled back after 5s: itl_p99 failed" in lines
    assert any(line.startswith("    itl_p99: FAILED (canary 0.03s, the others 0.01s: x3.00") for line in lines), lines
    assert any(line.startswith("    ttft_p99: ok (") for line in lines), lines


def test_after_a_roll_back_the_summary_counts_every_replica_that_serves() -> None:
    """The canary's old version back and a replica never reached (left running) both serve: the line says so."""
    report = FleetReport("f", status="partial", mode="canary", outcome="rolled-back")
    report.replicas = [
        ReplicaResult(0, "a", "r0", "http://a:1", "rolled-back", restored={"status": "ready"}),
        ReplicaResult(1, "b", "r1", "http://b:1", "left-running"),
        ReplicaResult(2, "c", "r2", "http://c:1", "failed"),
    ]
    lines = report_lines(json.loads(json.dumps(report.to_json())))
    assert "f: partial (2 of 3 replicas serving)" in lines, lines


def test_history_keeps_the_numbers_or_why_there_were_none() -> None:
    verdict = judge(_numbers(itl=0.03), [_numbers(1)], GATES, 5.0)
    entry = json.loads(json.dumps(verdict_entry("f", verdict, None, 0)))
    assert entry["kind"] == "canary-verdict" and entry["decision"] == "roll-back" and entry["canary"] == 0
    itl = next(c for c in entry["numbers"]["checks"] if c["name"] == "itl_p99")
    assert (itl["canary"], itl["baseline"], itl["passed"]) == (0.03, 0.01, False)
    assert entry["numbers"]["baseline"][0]["itl_p99_s"] == 0.01
    none = verdict_entry("f", None, "/metrics of r0 answered HTTP 404; add `enable_metrics: true`", 0)
    assert none["decision"] == "roll-back" and none["numbers"] is None and "HTTP 404" in none["reasons"][0]


class _Host:
    """A remote whose engines answer /metrics with the given stand-in replay, or with an HTTP status."""

    def __init__(self, answers: dict[int, Any]) -> None:
        self.answers = answers        # port -> a standin_metrics.Replay, or an HTTP status
        self.asked: list[tuple[str, int, str]] = []

    def request(self, method: str, port: int, path: str, **_kw: Any) -> HttpReply:
        self.asked.append((method, port, path))
        found = self.answers[port]
        if isinstance(found, int):
            return HttpReply(found, b"", {})
        found.started()
        found.finished()
        return HttpReply(200, found.text().encode(), {})


def test_the_window_reads_each_replica_twice_and_says_why_one_has_no_numbers() -> None:
    fleet = fleet_of(_fleet(replicas=[{"host": "a"}, {"host": "b", "engine_port": 31000},
                                      {"host": "c", "engine_port": 32000}]), lambda _t: "127.0.0.1")
    host = _Host({30000: standin_metrics.sglang(), 31000: standin_metrics.sglang(), 32000: 404})
    slept: list[float] = []
    reads = measure(fleet.replicas, lambda _m: cast(Remote, host), 3.0, slept.append)
    assert slept == [3.0] and [a[2] for a in host.asked] == ["/metrics"] * 5   # the third: once, then not again
    assert reads[0].numbers is not None and reads[0].numbers.requests == 1       # one completion in between
    assert reads[2].numbers is None and reads[2].problem is not None
    assert "HTTP 404" in reads[2].problem and "enable_metrics: true" in reads[2].problem   # the fix, from metrics.yaml


def test_a_batch_is_taken_out_only_while_every_other_replica_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """max_unavailable 2 of 3: r1 and r2 leave together only while r0 serves; r0 unhealthy: both are left
    running (exit 6, why), nothing is removed from the router and nothing replaced."""
    fleet = fleet_of(_fleet(replicas=[{"host": "a"}, {"host": "b", "engine_port": 31000},
                                      {"host": "c", "engine_port": 32000}]), lambda _t: "127.0.0.1")
    r0, r1, r2 = fleet.replicas
    removed: list[str] = []
    monkeypatch.setattr(canary_batch, "workers", lambda _remote, _router: {
        r.url: Worker(f"w{r.index}", r.url, r.index != 0, "ready") for r in fleet.replicas})
    monkeypatch.setattr(canary_batch, "remove_worker", lambda _remote, _router, url: removed.append(url))

    def replace(_member: Any, _emit: Any) -> Any:
        raise AssertionError("nothing may be replaced")

    out = canary_batch.roll_batch(fleet, [r1, r2], TaggedSink(lambda _e: None), replace, cast(Remote, None), None)
    assert removed == [] and {i: (r.status, r.exit_code) for i, r in out.items()} == {
        1: ("left-running", 6), 2: ("left-running", 6)}
    assert "only 0 other replicas serve: taking 2 out would leave fewer than 1 serving" in (out[1].error or "")


class _Scripted:
    """The rollout's steps against a scripted fleet: the router's workers, each replace, the window's numbers."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fleet: Any, numbers: dict[int, WindowNumbers]) -> None:
        self.steps: list[str] = []
        self.measured: list[int] = []
        self.written: list[dict[str, Any]] = []
        monkeypatch.setattr(canary_mod, "workers", lambda _remote, _router: {
            r.url: Worker(f"w{r.index}", r.url, True, "ready") for r in fleet.replicas})
        monkeypatch.setattr(canary_mod, "roll_one", self.roll_one)
        monkeypatch.setattr(canary_mod, "measure", self.measure)
        monkeypatch.setattr(canary_mod, "record", lambda _r, _w, _f, entry, _l: self.written.append(entry))
        self.numbers = numbers
        self.fail: set[int] = set()

    def roll_one(self, _fleet: Any, replica: Any, _sink: Any, replace: Any, *_rest: Any) -> ReplicaResult:
        self.steps.append(f"{replace.__name__} r{replica.index}")
        if replica.index in self.fail:
            return ReplicaResult(replica.index, replica.host, replica.name, replica.url, "failed", error="crashed")
        return ReplicaResult(replica.index, replica.host, replica.name, replica.url, "ready")

    def measure(self, members: list[Any], _connect: Any, _window: float) -> list[Read]:
        self.measured = [m.index for m in members]
        return [Read(m, self.numbers.get(m.index)) for m in members]


def new(_member: Any, _emit: Any) -> Any:
    return None


def back(_member: Any, _emit: Any) -> Any:
    return None


@pytest.mark.parametrize("slow, steps, outcome", [
    (False, ["new r1", "new r2"], "promoted"),
    (True, ["new r1", "back r1"], "rolled-back"),
])
def test_the_canary_is_compared_with_the_replicas_still_on_the_old_version(
        monkeypatch: pytest.MonkeyPatch, slow: bool, steps: list[str], outcome: str) -> None:
    """r0 already runs the new profile (an earlier canary left there): r1 is the canary, judged against r2 only;
    promoted: r2 replaced next; rolled back: r1 back to its previous version, r2 untouched."""
    fleet = fleet_of(_fleet(replicas=[{"host": "a"}, {"host": "b", "engine_port": 31000},
                                      {"host": "c", "engine_port": 32000}]), lambda _t: "127.0.0.1")
    script = _Scripted(monkeypatch, fleet, {0: _numbers(0, itl=0.5), 1: _numbers(1, itl=0.03 if slow else 0.01),
                                            2: _numbers(2)})
    report = FleetReport("f")
    plan = CanaryPlan(Rollout(canary=GATES), back, lambda _m: cast(Remote, None), local_history=False)
    roller = canary_roller(plan)
    roller(fleet, report, TaggedSink(lambda _e: None), new, cast(Remote, object()), lambda r: r.index == 0, None)
    assert script.measured == [1, 2] and script.steps == steps
    assert report.outcome == outcome and report.canary is not None and report.canary.canary.replica == 1
    assert [b.replica for b in report.canary.baseline] == [2]
    assert [r.status for r in report.replicas] == (["unchanged", "ready", "ready"] if not slow else
                                                   ["unchanged", "rolled-back", "left-running"])
    assert [e["kind"] for e in script.written] == ["canary-verdict", "rollout-end"]


def _loopback(_target: Any) -> str:
    return "127.0.0.1"


def test_run_canary_returns_the_rollouts_outcome_and_raises_only_before_anything_is_touched(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """For `deploy upgrade --apply` on a fleet: a rolled-back canary is a result (its verdict, the report, the
    error line), not an exception; a fleet that cannot have a canary raises before fleet_up is called."""
    back_report = FleetReport("f", mode="canary", outcome="rolled-back")
    back_report.canary = judge(_numbers(itl=0.03), [_numbers(1)], GATES, 5.0)
    called: list[Any] = []

    def fleet_up(profile: Profile, opts: Any, _emit: Any, _address: Any, roller_for: Any) -> FleetReport:
        called.append((profile.name, roller_for is not None))
        raise PartlyFailed("f: 0 of 2 replicas ready; r0@a: the canary was rolled back", outcome=back_report)

    monkeypatch.setattr(canary_mod, "fleet_up", fleet_up)
    result = canary_mod.run_canary(_fleet(), UpOptions(), lambda _e: None, Rollout(canary=GATES), _loopback)
    assert called == [("f", True)] and result.outcome == "rolled-back" and result.report is back_report
    assert result.verdict is back_report.canary and "rolled back" in (result.error or "")
    no_router = _fleet()
    no_router.router = None
    with pytest.raises(ProfileError):
        canary_mod.run_canary(no_router, UpOptions(), lambda _e: None, None, _loopback)
    assert len(called) == 1


def test_a_canary_that_does_not_start_stops_the_rollout_before_any_window(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = fleet_of(_fleet(), _loopback)
    script = _Scripted(monkeypatch, fleet, {})
    script.fail = {0}
    report = FleetReport("f")
    plan = CanaryPlan(Rollout(canary=GATES), back, lambda _m: cast(Remote, None), local_history=False)
    canary_roller(plan)(fleet, report, TaggedSink(lambda _e: None), new, cast(Remote, object()), None, None)
    assert script.steps == ["new r0"] and script.measured == [] and report.canary is None
    assert report.outcome == "stopped" and [r.status for r in report.replicas] == ["failed", "left-running"]
    assert "rollout stopped at r0@a: crashed" in report.notes
    assert [(e["kind"], e["decision"]) for e in script.written] == [("rollout-end", "stopped")]
