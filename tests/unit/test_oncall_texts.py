"""Issue 24's on-call texts: evidence without noise, a CUDA illegal memory access after ready with a next step,
remedies as lines, the diagnosis in `status`'s text, which run a deployment's diagnosis is of."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from deployer.cli import show
from deployer.deployments.reports import DiagnosisReport, HostStatus, StatusRow
from deployer.diagnose.diagnosis import diagnose, evidence_lines
from deployer.engines import engine_for

CASES = Path(__file__).parent.parent / "cases"


def _log(path: str) -> str:
    return (CASES / path).read_bytes().decode("utf-8")


def test_evidence_leaves_out_the_engine_neutral_noise() -> None:
    graphs = diagnose(_log("sglang/capture-cuda-graph-failed.log"), exit_code=1, engine=engine_for("sglang"))
    assert graphs.signature == "capture-cuda-graph-failed"
    assert "Possible solutions:" not in graphs.evidence
    assert not any(line.startswith("Open an issue on GitHub") for line in graphs.evidence)
    assert any("--mem-fraction-static" in line for line in graphs.evidence)  # the numbered solutions stay
    assert "Possible solutions:" in (graphs.traceback or "")                # the traceback is never filtered

    exited = diagnose(_log("vllm/good-startup.log"), exit_code=1, engine=engine_for("vllm"))
    assert not any(line.startswith("warnings.warn(") for line in exited.evidence)
    assert "warnings.warn(" not in exited.summary


def test_evidence_lines_keep_what_is_not_noise() -> None:
    lines = ["  warnings.warn(", "Possible solutions:", "1. set --x", "", "ValueError: bad"]
    assert evidence_lines(lines) == ["1. set --x", "ValueError: bad"]


STANDIN_AFTER_READY = """\
[2026-12-01 04:02:12] The server is fired up and ready to roll!
[2026-12-01 04:02:16] INFO:     127.0.0.1:48628 - "GET /health HTTP/1.1" 200 OK
[2026-12-01 04:02:17] Scheduler hit an exception: Traceback (most recent call last):
  File "/opt/sglang/srt/managers/scheduler.py", line 2710, in run_scheduler_process
    scheduler.event_loop_overlap()
RuntimeError: CUDA error: an illegal memory access was encountered
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.

[2026-12-01 04:02:17] Received sigquit from a child process. It usually means the child failed.
"""


@pytest.mark.parametrize("kind", ["sglang", "vllm", None])
def test_cuda_illegal_memory_access_after_ready_has_a_next_step(kind: str | None) -> None:
    engine = engine_for(kind) if kind else None
    diag = diagnose(STANDIN_AFTER_READY, exit_code=1, engine=engine)
    assert diag.signature == "cuda-illegal-memory-access"
    assert not diag.transient
    assert diag.evidence == ["RuntimeError: CUDA error: an illegal memory access was encountered"]
    assert diag.hint and "CUDA graphs" in diag.hint and "attention backend" in diag.hint
    assert "deploy logs" in diag.hint


def test_vllm_engine_core_illegal_memory_access() -> None:
    diag = diagnose(_log("vllm/cuda-illegal-memory-access.log"), exit_code=1, engine=engine_for("vllm"))
    assert diag.signature == "cuda-illegal-memory-access"
    assert all("asynchronously reported" not in line for line in diag.evidence)


def test_remedy_is_printed_as_lines_not_json(capsys: pytest.CaptureFixture[str]) -> None:
    data = {"signature": "x", "summary": "s", "transient": False, "evidence": [],
            "remedy": {"args": {"mem_fraction_static": 0.7, "enable_beta_spec": None, "disable_cuda_graph": True},
                       "env": {"NCCL_SHM_DISABLE": "1", "OLD": None}, "reason": "mem_fraction_static: 0.771 -> 0.7"}}
    show.text(DiagnosisReport(data))
    out = capsys.readouterr().out
    assert "{" not in out
    assert "remedy:    mem_fraction_static: 0.771 -> 0.7" in out
    assert "set engine.args.mem_fraction_static: 0.7 (--mem-fraction-static 0.7)" in out
    assert "remove engine.args.enable_beta_spec (--enable-beta-spec)" in out
    assert "set engine.args.disable_cuda_graph: true (--disable-cuda-graph)" in out
    assert "set engine.env.NCCL_SHM_DISABLE=1" in out and "unset engine.env.OLD" in out


def test_diagnosis_of_an_old_run_says_which_when_and_that_it_is_healthy_now(
        capsys: pytest.CaptureFixture[str]) -> None:
    at = time.time() - 3600
    data = {"signature": "cuda-illegal-memory-access", "summary": "s", "transient": False, "evidence": [],
            "hint": "try eager", "run_id": "20261201T040211Z-aaaa-a1", "failed_at": at,
            "now": {"run_id": "20261201T050000Z-bbbb-a1", "status": "ready", "healthy": True}}
    show.text(DiagnosisReport(data))
    out = capsys.readouterr().out
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    assert f"run:       20261201T040211Z-aaaa-a1 failed at {when}" in out and "(60m ago)" in out
    assert "now:       the current run is 20261201T050000Z-bbbb-a1: healthy now" in out
    assert "next:      try eager" in out


def test_status_text_shows_the_diagnosis_its_json_has(capsys: pytest.CaptureFixture[str]) -> None:
    row = {"name": "st", "host": "h", "status": "crashloop", "pid": 1, "uptime_s": None, "healthy": False,
           "attempt": 1, "content_hash": "abc" * 8, "run_dir": "/w/st/runs/r", "port": 30000, "restarts": 1,
           "last_crash": {"exit_code": 1, "at": time.time()}, "drift": [], "lock": None,
           "diagnosis": {"signature": "cuda-illegal-memory-access", "summary": "a GPU kernel fault",
                         "hint": "run without CUDA graphs"},
           "exit_code": 1, "signal_name": None, "runs": 1, "serving": False}
    show.text(HostStatus([StatusRow.of(row)]))
    out = capsys.readouterr().out
    assert "  diagnosis: cuda-illegal-memory-access: a GPU kernel fault" in out
    assert "  next: run without CUDA graphs" in out
    show.text(HostStatus([StatusRow.of({**row, "engine": "vllm", "engine_version": "0.32.0", "model": "tiny"})]))
    assert "  engine vllm 0.32.0, model tiny" in capsys.readouterr().out   # what the run's profile names


def test_line_time_reads_both_engines_line_shapes() -> None:
    from deployer.logtext import line_time

    at = time.mktime((2026, 12, 1, 4, 2, 16, 0, 0, -1))
    assert line_time("[2026-12-01 04:02:16] The server is fired up and ready to roll!") == at
    assert line_time("[2026-12-01 04:02:16.250 TP1] Scheduler hit an exception:") == at + 0.25
    now = time.mktime((2026, 6, 1, 0, 0, 0, 0, 0, -1))
    assert line_time("(EngineCore pid=8424) ERROR 12-01 04:02:16 [core.py:1510] x", now=now) == at
    assert line_time('  File "x.py", line 3, in f') is None
    assert line_time("x" * 100 + " 2026-12-01 04:02:16") is None  # a time inside the message is not the line's


def test_parse_since_takes_durations_and_local_times() -> None:
    from deployer.logtext import parse_since

    assert parse_since("10m", now=1000.0) == 400.0 and parse_since("2h", now=1e5) == 1e5 - 7200
    assert parse_since("1.5s", now=10.0) == 8.5 and parse_since("1d", now=1e6) == 1e6 - 86400
    assert parse_since("2026-12-01 04:02") == time.mktime((2026, 12, 1, 4, 2, 0, 0, 0, -1))
    for bad in ("ten minutes", "10x", "", "2026-13-01"):
        with pytest.raises(ValueError):
            parse_since(bad)


def test_log_filter_greps_and_keeps_a_timeless_line_with_the_one_before() -> None:
    from deployer.operate.deployment import log_filter

    lines = ["[2026-12-01 04:00:00] old", "  File old", "[2026-12-01 04:05:00] new error", "  File new",
             "[2026-12-01 04:06:00] fine"]
    since = time.mktime((2026, 12, 1, 4, 1, 0, 0, 0, -1))
    got: list[str] = []
    emit = log_filter(got.append, None, since)
    for line in lines:
        emit(line)
    assert got == lines[2:]
    got.clear()
    emit = log_filter(got.append, r"error|File", since)
    for line in lines:
        emit(line)
    assert got == ["[2026-12-01 04:05:00] new error", "  File new"]
    out = got.append
    assert log_filter(out, None, None) is out


def test_reach_says_how_to_talk_to_the_server() -> None:
    from deployer.runner.report import Reach

    tunnel = Reach("gpu-box", "root", 2222, "127.0.0.1", 30000, "Qwen/Qwen3-0.6B")
    lines = tunnel.lines()
    assert lines[0].endswith("ssh -N -L 30000:127.0.0.1:30000 -p 2222 root@gpu-box &")
    assert lines[1] == "  curl http://127.0.0.1:30000/v1/models"
    assert '"model": "Qwen/Qwen3-0.6B"' in lines[2] and "/v1/chat/completions" in lines[2]
    assert tunnel.to_json()["ssh_tunnel"] == "ssh -N -L 30000:127.0.0.1:30000 -p 2222 root@gpu-box"

    open_ = Reach("gpu-box", None, None, "0.0.0.0", 8000, "m", api_key=True)
    assert open_.lines()[0] == "reach it at http://gpu-box:8000/v1 (OpenAI API)"
    assert 'Authorization: Bearer $API_KEY' in open_.lines()[1] and open_.to_json()["ssh_tunnel"] is None
