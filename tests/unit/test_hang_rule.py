"""The hang rule (issue 37) against /metrics sequences: the real engines' captures (tests/cases/metrics/) replayed
in time, with their progress counter held or advanced; the engines' progress counters as data; the stacks'
classification (tests/cases/hangs/: real py-spy dumps of the step stand-in); the profile keys as supervise.json
and the launch carry them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from deployer.diagnose.hangkinds import classify
from deployer.diagnose.hung import hung_diagnosis
from deployer.engines import engine_for
from deployer.observe.names import load_metric_names
from deployer.profile.model import Profile
from deployer.render.bundle import render
from deployer.supervisor.hang import (
    HANG_MAX_S, HANG_MIN_S, HANG_UNSEEN_S, HangRule, HangWatch, Reading, reading_of, readings_of,
)
from deployer.supervisor.stacks import dump_stacks, top_frames
from deployer.box.push import supervisor_config

CASES = Path(__file__).resolve().parents[1] / "cases"
METRICS = CASES / "metrics"
NAMES = {
    "vllm": (["vllm:num_requests_running"], ["vllm:num_requests_waiting"], ["vllm:iteration_tokens_total_count"]),
    "sglang": (["sglang:num_running_reqs"], ["sglang:num_queue_reqs"], ["sglang:realtime_tokens_total"]),
}
CAPTURES = {"vllm": "vllm-0.32.0", "sglang": "sglang-0.5.23"}


def _capture(engine: str, which: str) -> str:
    return (METRICS / CAPTURES[engine] / f"{which}.prom").read_text(encoding="utf-8")


def _reading(engine: str, which: str) -> Reading:
    found = reading_of(_capture(engine, which), *NAMES[engine])
    assert found is not None
    return found


def _advanced(reading: Reading, by: float) -> Reading:
    running, waiting, progress = reading
    assert progress is not None
    return running, waiting, progress + by


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_progress_counters_are_the_engines_data_and_in_its_real_metrics(engine: str) -> None:
    names = load_metric_names(engine_for(engine).knowledge.metrics)  # type: ignore[arg-type]
    assert [m.name for m in names.progress] == NAMES[engine][2]
    assert all(re.search(r"\.py:\d+", m.source) and m.also_in for m in names.progress)
    before, during, after = (_reading(engine, w) for w in ("before", "during", "after"))
    assert before[0] == 0 and during[0] > 0 and after[0] == 0      # requests ran in `during` only
    assert before[2] is not None and during[2] is not None and after[2] is not None
    assert before[2] < during[2] < after[2]                        # and the counter advanced while they ran


def test_real_readings_are_summed_over_series_and_modes() -> None:
    assert _reading("vllm", "during") == (4.0, 0.0, 414.0)
    assert _reading("sglang", "during") == (1.0, 0.0, 125.0 + 219.0 + 114.0)   # three `mode` series
    assert reading_of("# nothing\n", *NAMES["vllm"]) is None                    # no gauge: nothing to judge
    assert reading_of('vllm:num_requests_running{engine="0"} 2.0\n', *NAMES["vllm"]) == (2.0, 0.0, None)


def _replay(rule: HangRule, readings: list[tuple[float, Reading | None]]) -> list[tuple[float, dict[str, Any]]]:
    return [(at, hung) for at, reading in readings if (hung := rule.feed(at, reading, reading is not None))]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_requests_running_and_a_frozen_counter_are_hung_at_hang_s_not_before(engine: str) -> None:
    during = _reading(engine, "during")
    hung = _replay(HangRule(10.0), [(t * 0.5, during) for t in range(40)])
    at, record = hung[0]
    assert at == 10.0, hung                               # the first reading 10 s after the last step
    assert (record["running"], record["progress"], record["stalled_s"], record["derived"]) == \
        (during[0], during[2], 10.0, False)
    assert "no engine step for 10 s" in record["reason"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_counter_that_advances_every_reading_is_never_hung(engine: str) -> None:
    during = _reading(engine, "during")
    assert _replay(HangRule(10.0), [(t * 1.0, _advanced(during, t)) for t in range(600)]) == []


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_idle_engine_with_a_still_counter_is_never_hung(engine: str) -> None:
    after = _reading(engine, "after")
    assert _replay(HangRule(10.0), [(t * 1.0, after) for t in range(600)]) == []


def test_a_queue_waiting_with_nothing_running_and_no_step_is_hung() -> None:
    stuck: Reading = (0.0, 3.0, 500.0)
    assert _replay(HangRule(5.0), [(t * 1.0, stuck) for t in range(10)])[0][0] == 5.0


def test_slow_steps_raise_the_derived_bound_and_a_later_freeze_is_still_caught() -> None:
    """A long prefill: one step every 8 s for ten minutes -> derived hang_s 80 s; no false hang; then frozen."""
    during = _reading("vllm", "during")
    rule = HangRule()
    readings: list[tuple[float, Reading | None]] = [(float(t), _advanced(during, t // 8)) for t in range(600)]
    assert _replay(rule, readings) == []
    assert rule.hang_s == 80.0
    frozen = _advanced(during, 599 // 8)
    hung = _replay(rule, [(float(t), frozen) for t in range(600, 800)])
    assert hung[0][0] == 592 + 80.0 and hung[0][1]["derived"] and hung[0][1]["longest_step_s"] == 8.0


def test_the_derived_bound_stays_within_its_limits() -> None:
    assert HangRule().hang_s == HANG_UNSEEN_S == 60.0          # before any step was seen
    fast, slow = HangRule(), HangRule()
    fast.longest, slow.longest = 0.01, 3600.0
    assert (fast.hang_s, slow.hang_s) == (HANG_MIN_S, HANG_MAX_S) == (20.0, 300.0)


def test_metrics_that_stop_answering_after_a_busy_reading_are_hung_after_an_idle_one_never() -> None:
    during, after = _reading("vllm", "during"), _reading("vllm", "after")
    busy: list[tuple[float, Reading | None]] = [(0.0, during)] + [(float(t), None) for t in range(1, 30)]
    hung = _replay(HangRule(10.0), busy)
    assert hung[0][0] == 10.0 and "/metrics does not answer" in hung[0][1]["reason"]
    idle: list[tuple[float, Reading | None]] = [(0.0, after)] + [(float(t), None) for t in range(1, 30)]
    assert _replay(HangRule(10.0), idle) == []


def test_metrics_without_the_gauges_are_never_judged() -> None:
    rule = HangRule(5.0)
    assert [rule.feed(float(t), None, answered=True) for t in range(30)] == [None] * 30


def test_a_token_from_the_probe_restarts_the_clock() -> None:
    during = _reading("vllm", "during")
    rule = HangRule(10.0)
    for t in range(9):
        assert rule.feed(float(t), during) is None
    rule.alive(8.5)
    assert rule.feed(15.0, during) is None and rule.feed(18.5, during) is not None


def test_a_counter_that_goes_back_is_progress() -> None:
    rule = HangRule(5.0)
    assert rule.feed(0.0, (2.0, 0.0, 900.0)) is None
    assert rule.feed(4.0, (2.0, 0.0, 3.0)) is None and rule.feed(8.0, (2.0, 0.0, 3.0)) is None


def test_the_watch_is_off_without_progress_counters() -> None:
    base = {"port": 8000, "running_metrics": NAMES["vllm"][0], "waiting_metrics": NAMES["vllm"][1]}
    assert not HangWatch(base).enabled                       # an older supervise.json, or metrics off
    assert HangWatch({**base, "progress_metrics": NAMES["vllm"][2]}).enabled
    assert HangWatch({**base, "progress_metrics": NAMES["vllm"][2], "hang_s": 7}).rule.fixed == 7.0


# -- the stacks and their classification ---------------------------------------------------------------------
def _stacks(*texts: str) -> dict[str, Any]:
    return {"file": "hang-stacks-0.txt", "method": "py-spy",
            "processes": [{"pid": 100 + i, "top": top_frames(t)} for i, t in enumerate(texts)]}


HANGS = CASES / "hangs"
FROZEN = (HANGS / "stepengine-core-frozen.pyspy.txt").read_text(encoding="utf-8")
SERVER = (HANGS / "stepengine-server.pyspy.txt").read_text(encoding="utf-8")
# SYNTHETIC (py-spy's format, frames as PyTorch 2.x names them): a rank blocked in an all-reduce
NCCL = """Thread 7 (active): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2806)
    wrapper (torch/distributed/c10d_logger.py:81)
    forward (vllm/distributed/communication_op.py:14)
"""


def test_the_real_dump_of_a_frozen_core_is_a_lock_wait_the_server_alone_names_none() -> None:
    found = classify(_stacks(SERVER, FROZEN))
    assert found is not None and found[0].kind == "lock" and "Condition.wait (threading.py" in found[1]
    assert classify(_stacks(SERVER)) is None   # a server between two polls: serve_forever, a request's wait loop


def test_a_blocking_read_is_a_blocking_call() -> None:
    # SYNTHETIC, py-spy's format: vLLM's engine core client waiting on its ZMQ socket
    text = 'Thread 9 (idle): "MainThread"\n    recv_multipart (zmq/sugar/socket.py:802)\n    get_output (x.py:1)\n'
    assert classify(_stacks(text))[0].kind == "blocking-call"  # type: ignore[index]


def test_a_collective_wait_and_a_stopped_process_are_named() -> None:
    assert classify(_stacks(SERVER, NCCL))[0].kind == "collective"  # type: ignore[index]
    stopped = {"processes": [{"pid": 5, "top": ["Process 5: state T, wchan do_signal_stop", *top_frames(FROZEN)]}]}
    assert classify(stopped)[0].kind == "stopped"  # type: ignore[index]
    assert classify({"processes": [{"pid": 5, "top": ["Thread 5 (x): state R, wchan -, syscall running"]}]}) is None


def test_the_diagnosis_shows_the_progress_and_the_top_frames() -> None:
    end = {"hung": {"reason": "2 running, 0 waiting and no engine step for 21 s (hang_s 20, derived)",
                    "progress": 414.0, "stacks": _stacks(SERVER, FROZEN)}}
    diagnosis = hung_diagnosis(end)
    assert diagnosis is not None and diagnosis.signature == "hung" and diagnosis.transient
    assert diagnosis.summary.startswith("the engine held requests and made no progress: hung: lock")
    assert "no engine step for 21 s" in diagnosis.evidence[0] and "414.0" in diagnosis.evidence[0]
    assert any("Condition.wait (threading.py:331)" in line for line in diagnosis.evidence)
    assert hung_diagnosis({"probe_dead": {}}) is None


def test_dump_stacks_writes_every_process_of_a_group(tmp_path: Path) -> None:
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(30)\nelse:\n    time.sleep(30)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        summary: dict[str, Any] = {}
        while time.monotonic() < deadline:
            summary = dump_stacks(proc.pid, str(tmp_path / "stacks.txt"), {"PATH": "/nonexistent"})
            if len(summary["processes"]) == 2:
                break
            time.sleep(0.1)
        assert summary["file"] == "stacks.txt" and len(summary["processes"]) == 2, summary
        text = (tmp_path / "stacks.txt").read_text()
        assert all(f"==== pid {p['pid']} " in text for p in summary["processes"])
        assert all(p["top"][0].startswith(f"Process {p['pid']}: state ") for p in summary["processes"])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


# -- the profile's keys, as supervise.json and the launch carry them ------------------------------------------
def _profile(kind: str, health: dict[str, Any] | None = None, restart: dict[str, Any] | None = None,
             args: dict[str, Any] | None = None) -> Profile:
    return Profile.model_validate({
        "name": "demo", "target": {"host": "gpu-box", "workdir": "/srv/deploy"},
        "engine": {"kind": kind, "python": "/usr/bin/python3", "model_path": "/models/tiny", "port": 30000,
                   "args": args or {}},
        "health": health or {}, "restart": restart or {}})


def test_supervise_json_carries_the_progress_counters_and_hang_s() -> None:
    probe = supervisor_config(_profile("sglang", {"hang_s": 45}, args={"enable_metrics": True}))["probe"]
    assert probe.get("progress_metrics") == ["sglang:realtime_tokens_total"] and probe.get("hang_s") == 45.0
    off = supervisor_config(_profile("sglang"))["probe"]          # no --enable-metrics: no /metrics at all
    assert "progress_metrics" not in off and "hang_s" not in off


@pytest.mark.parametrize("bad", [0, -1, "soon", True])
def test_hang_s_refuses_what_is_not_seconds_or_auto(bad: Any) -> None:
    with pytest.raises(ValueError, match="hang_s"):
        _profile("vllm", {"hang_s": bad})


def test_drain_s_sets_vllms_shutdown_timeout_and_the_supervisors_stop() -> None:
    drained = _profile("vllm", restart={"drain_s": 12.5})
    assert render(drained).argv[-2:] == ["--shutdown-timeout", "13"]
    assert supervisor_config(drained)["restart"].get("drain_s") == 12.5
    plain = _profile("vllm")
    assert "--shutdown-timeout" not in render(plain).argv and "drain_s" not in supervisor_config(plain)["restart"]
    own = _profile("vllm", restart={"drain_s": 5}, args={"shutdown_timeout": 60})   # the profile's own value wins
    assert render(own).argv.count("--shutdown-timeout") == 1 and "60" in render(own).argv
    assert "--shutdown-timeout" not in render(_profile("sglang", restart={"drain_s": 5})).argv  # drains by itself


def test_status_and_history_show_the_hang_its_progress_and_its_frame() -> None:
    from types import SimpleNamespace

    from deployer.deployments.status_text import describe_crash
    from deployer.operate.history import _hung

    hung = {"at": 1.0, "reason": "2 running, 0 waiting and no engine step for 21 s (hang_s 20, derived)",
            "progress": 414.0, "stacks": _stacks(SERVER, FROZEN)}
    crash = {"at": 100.0, "exit_code": None, "signal": 15, "signal_name": "SIGTERM", "hung": hung}
    text = describe_crash(crash, now=160.0)
    assert text.startswith("hung: 2 running, 0 waiting and no engine step for 21 s"), text
    assert "lock wait: pid 101:   Condition.wait (threading.py:331)" in text, text
    assert "stacks (py-spy) in the run dir: hang-stacks-0.txt; then killed by SIGTERM at " in text, text
    row = _hung(SimpleNamespace(state={"last_crash": crash}))  # type: ignore[arg-type]
    assert row["hung"]["kind"] == "lock" and row["hung"]["stacks"] == "hang-stacks-0.txt"
    assert row["hung"]["top"][0].startswith("pid 100: Thread ")
    assert _hung(SimpleNamespace(state={"last_crash": {**crash, "hung": None}})) == {}  # type: ignore[arg-type]


def test_idle_time_before_the_load_does_not_count() -> None:
    """Idle for 100 s with a still counter, then requests arrive and no step runs: hung hang_s after they came."""
    after, during = _reading("vllm", "after"), _reading("vllm", "during")
    stuck: Reading = (during[0], during[1], after[2])
    hung = _replay(HangRule(10.0), [(float(t), after) for t in range(100)] + [(float(t), stuck) for t in range(100, 130)])
    assert hung[0][0] == 109.0, hung   # the last idle reading (99 s) starts the clock


def test_the_stop_waits_for_the_runs_own_drain() -> None:
    from deployer.box.process import drain_of

    assert drain_of({"profile": {"restart": {"drain_s": 12}}}) == 12.0
    assert drain_of({"profile": {"restart": {}}}) == drain_of({}) == drain_of({"profile": {"restart": {"drain_s": True}}}) == 0.0


def _nudged(answer: str | None) -> tuple[HangWatch, list[float]]:
    sent: list[float] = []

    def nudge() -> str | None:
        sent.append(time.monotonic())
        return answer

    base = {"port": 8000, "running_metrics": NAMES["sglang"][0], "waiting_metrics": NAMES["sglang"][1],
            "progress_metrics": NAMES["sglang"][2], "hang_s": 10}
    return HangWatch(base, nudge), sent


def _settle(watch: HangWatch) -> None:
    assert watch._nudging is not None
    watch._nudging.join(5)


def test_stale_gauges_of_an_idle_engine_are_answered_by_a_nudge_not_restarted() -> None:
    """SGLang 0.5.10 republishes its gauges while idle only every 30 s: "1 running", a still counter, but the
    engine answers a one-token completion: the nudge's token restarts the clock, at most one nudge per stall."""
    watch, sent = _nudged(None)
    stale = _reading("sglang", "during")
    base = time.monotonic() - 5.0        # the last step 5 s ago: half of hang_s
    assert watch.feed(base, stale) is None
    assert not watch.nudge_due(base + 4.9)
    assert watch.nudge_due(time.monotonic()) and not watch.nudge_due(time.monotonic())
    _settle(watch)
    assert len(sent) == 1
    assert watch.feed(base + 10.5, stale) is None         # hung here without the token
    assert watch.feed(base + 14.5, stale) is None         # the token (at ~base + 5) started a new hang_s
    assert watch.rule.moved_at is not None and watch.rule.moved_at >= sent[0]


def test_a_nudge_that_gets_no_token_leaves_the_hang_to_the_rule() -> None:
    watch, sent = _nudged("no answer to a one-token completion after 5.0 s: timed out")
    stuck = _reading("sglang", "during")
    now = time.monotonic()
    assert watch.feed(now, stuck) is None and watch.nudge_due(now + 5.0)
    _settle(watch)
    hung = watch.feed(now + 10.0, stuck)
    assert len(sent) == 1 and hung is not None and hung["stalled_s"] == 10.0


def test_no_nudge_while_idle_or_progressing() -> None:
    watch, sent = _nudged(None)
    now = time.monotonic()
    watch.feed(now, _reading("sglang", "after"))          # idle
    assert not watch.nudge_due(now + 100)
    during = _reading("sglang", "during")
    for t in range(1, 20):                                 # busy and stepping every second
        watch.feed(now + 100 + t, _advanced(during, t))
        assert not watch.nudge_due(now + 100 + t + 0.5)
    assert sent == []


def test_the_real_sglang_scheduler_stopped_under_load_is_named_stopped() -> None:
    stacks = json.loads((HANGS / "sglang-0.5.23-scheduler-sigstop.json").read_text(encoding="utf-8"))
    found = classify(stacks)
    assert found is not None and found[0].kind == "stopped", found
    assert found[1].endswith(": state T, wchan do_signal_stop")
    rest = {"processes": [p for p in stacks["processes"] if not p["top"][0].endswith("do_signal_stop")]}
    assert classify(rest)[0].kind == "blocking-call"  # type: ignore[index]  # the detokenizer's zmq recv, idle


# -- data-parallel engines, each judged alone ----------------------------------------------------------------
# SYNTHETIC, in the real captures' format (tests/cases/metrics/): two vLLM engine cores (--data-parallel-size 2,
# label `engine` as loggers.py:499 writes it) and two SGLang DP ranks (label `dp_rank`, metrics_collector.py:1391).
def _two_vllm(steps0: float, steps1: float) -> str:
    lines = []
    for engine, steps in (("0", steps0), ("1", steps1)):
        labels = f'{{engine="{engine}",model_name="/m"}}'
        lines += [f"vllm:num_requests_running{labels} 2.0", f"vllm:num_requests_waiting{labels} 1.0",
                  f"vllm:iteration_tokens_total_count{labels} {steps}"]
    return "\n".join(lines) + "\n"


def _two_sglang(tokens0: float, tokens1: float) -> str:
    lines = []
    for rank, tokens in (("0", tokens0), ("1", tokens1)):
        labels = f'engine_type="unified",model_name="/m",moe_ep_rank="0",pp_rank="0",tp_rank="{rank}",dp_rank="{rank}"'
        lines += [f"sglang:num_running_reqs{{{labels}}} 2.0", f"sglang:num_queue_reqs{{{labels}}} 0.0",
                  f'sglang:realtime_tokens_total{{{labels},mode="decode"}} {tokens}',
                  f'sglang:realtime_tokens_total{{{labels},mode="prefill_compute"}} 30.0']
    return "\n".join(lines) + "\n"


TWO = {"vllm": (_two_vllm, ["engine"], "engine=1"), "sglang": (_two_sglang, ["dp_rank"], "dp_rank=1")}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_engine_labels_are_the_engines_data_and_split_the_readings(engine: str) -> None:
    text, labels, _ = TWO[engine]
    assert load_metric_names(engine_for(engine).knowledge.metrics).engine_labels == labels  # type: ignore[arg-type]
    probe = supervisor_config(_profile(engine, args={"enable_metrics": True}))["probe"]
    assert probe.get("engine_labels") == labels
    split = readings_of(text(100.0, 7.0), *NAMES[engine], labels)
    assert split is not None and sorted(split) == [f"{labels[0]}=0", f"{labels[0]}=1"]
    assert split[f"{labels[0]}=1"][2] == 7.0 + (30.0 if engine == "sglang" else 0.0)
    # the real single-engine captures: one engine, whatever its labels
    assert list(readings_of(_capture(engine, "during"), *NAMES[engine], labels) or {}) == \
        (["engine=0"] if engine == "vllm" else [""])


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_one_frozen_engine_is_hung_while_the_other_steps(engine: str) -> None:
    text, labels, frozen = TWO[engine]
    rule = HangRule(10.0)
    hung = [(t, h) for t in range(40)
            if (h := rule.feed(float(t), readings_of(text(100.0 + t, 7.0), *NAMES[engine], labels)))]
    assert hung and hung[0][0] == 10.0, hung
    record = hung[0][1]
    assert record["engine"] == frozen and record["running"] == 2.0 and record["stalled_s"] == 10.0
    assert record["reason"].startswith(f"engine {frozen} (of 2): 2 running, ")
    # one engine (the real capture, vLLM's engine="0"): judged and named as before
    one, alone = readings_of(_capture(engine, "during"), *NAMES[engine], labels), HangRule(10.0)
    single = [(t, h) for t in range(12) if (h := alone.feed(float(t), one))]
    assert single and single[0][1]["reason"].startswith("%g running" % _reading(engine, "during")[0])
    assert "engine" not in single[0][1]
    # the same text summed, as the rule read it before: the other engine's steps hid the frozen one
    summed = HangRule(10.0)
    assert [t for t in range(40) if summed.feed(float(t), reading_of(text(100.0 + t, 7.0), *NAMES[engine]))] == []


def test_a_token_extends_each_stalled_engine_once_when_there_are_several() -> None:
    """A token proves that some engine steps, not which: with several engines it restarts a stalled engine's clock
    once per stall, so probes answered by the live engine never hide the stuck one for long."""
    rule = HangRule(10.0)
    names = (*NAMES["vllm"], ["engine"])
    for t in range(9):
        assert rule.feed(float(t), readings_of(_two_vllm(100.0 + t, 7.0), *names)) is None
    rule.alive(8.0)                                     # the first token: engine 1's clock starts again at 8
    assert rule.feed(17.0, readings_of(_two_vllm(117.0, 7.0), *names)) is None
    rule.alive(17.5)                                    # a second token in the same stall: no second extension
    hung = rule.feed(18.0, readings_of(_two_vllm(118.0, 7.0), *names))
    assert hung is not None and hung["engine"] == "engine=1" and hung["stalled_s"] == 10.0
    single = HangRule(10.0)                             # one engine: every token restarts its clock (as before)
    during = _reading("vllm", "during")
    assert single.feed(0.0, during) is None
    single.alive(8.0)
    assert single.feed(17.0, during) is None
    single.alive(17.5)
    assert single.feed(26.0, during) is None and single.feed(27.5, during) is not None


# -- vLLM's drain flag only on a release that has it ----------------------------------------------------------
def test_the_drain_flag_is_rendered_only_where_the_release_has_it() -> None:
    launch = engine_for("vllm").launch
    assert launch.drain_since == "0.18.0"                          # the engine package's data (vllm#34730)
    assert [launch.drain_flag_for(v) for v in (None, "0.17.1", "0.18.0", "0.32.0", "nightly")] == \
        ["shutdown_timeout", None, "shutdown_timeout", "shutdown_timeout", "shutdown_timeout"]
    drained = _profile("vllm", restart={"drain_s": 12.5})
    old = drained.model_copy(update={"engine": drained.engine.model_copy(update={"version": "0.17.1"})})
    assert "--shutdown-timeout" not in render(old).argv
    assert supervisor_config(old)["restart"].get("drain_s") == 12.5   # the supervisor's stop still waits
    new = drained.model_copy(update={"engine": drained.engine.model_copy(update={"version": "0.18.0"})})
    assert render(new).argv[-2:] == ["--shutdown-timeout", "13"]


def test_preflight_says_once_that_an_older_vllm_cannot_drain_and_pins_its_version() -> None:
    from deployer.preflight.checks import PreflightReport, _drain_flag
    from deployer.preflight.facts import Facts

    drained = _profile("vllm", restart={"drain_s": 12.5})
    report = PreflightReport(facts=Facts(engine_version="0.17.1"), profile=drained)
    _drain_flag(report)
    assert report.warnings == ["vllm 0.17.1 has no --shutdown-timeout (from 0.18.0): restart.drain_s 12.5 is not "
                               "passed to the engine, which ends what is in flight on a stop; the supervisor still "
                               "waits drain_s and the grace before SIGKILL"]
    assert report.profile.engine.version == "0.17.1" and "--shutdown-timeout" not in render(report.profile).argv
    for version, profile in (("0.18.0", drained), ("0.17.1", _profile("vllm")),
                             ("0.17.1", _profile("sglang", restart={"drain_s": 5}))):
        quiet = PreflightReport(facts=Facts(engine_version=version), profile=profile)
        _drain_flag(quiet)
        assert quiet.warnings == [] and quiet.profile is profile


def test_an_engine_that_steps_after_an_extension_gets_one_again_in_its_next_stall() -> None:
    rule, names = HangRule(10.0), (*NAMES["vllm"], ["engine"])
    assert rule.feed(0.0, readings_of(_two_vllm(100.0, 7.0), *names)) is None
    rule.alive(8.0)                                     # engine 1's first stall: extended to 8
    assert rule.feed(9.0, readings_of(_two_vllm(109.0, 8.0), *names)) is None    # then it steps (at 9)
    rule.alive(18.0)                                    # its next stall: a token extends it again
    assert rule.feed(20.0, readings_of(_two_vllm(120.0, 8.0), *names)) is None   # hung here without it
    hung = rule.feed(28.0, readings_of(_two_vllm(128.0, 8.0), *names))
    assert hung is not None and hung["engine"] == "engine=1" and hung["stalled_s"] == 10.0
