"""Typed events: each one's NDJSON line keeps the names and keys `--json` users parse (the shapes of before)."""

from __future__ import annotations

import dataclasses

from deployer.events import (
    AttemptStarted, BecameReady, Changed, Diagnosed, Download, EngineExited, EngineHung, FollowerExited, Info,
    PhaseEntered, Progressed, SmokePhase, Warn,
)
from deployer.secrets import masking_sink


def _line(event: object) -> dict[str, object]:
    data = event.to_json()  # type: ignore[attr-defined]
    assert isinstance(data.pop("at"), float)
    return data


def test_payload_keys_and_context() -> None:
    assert _line(PhaseEntered(phase="loading", elapsed=1.5, line="x")) == \
        {"event": "phase", "phase": "loading", "elapsed": 1.5, "line": "x"}
    assert _line(AttemptStarted(attempt=2, content_hash="abc", host="a, b")) == \
        {"event": "attempt", "attempt": 2, "content_hash": "abc", "host": "a, b"}
    assert _line(BecameReady(elapsed=3.0)) == {"event": "ready", "elapsed": 3.0, "phase": "ready"}
    assert _line(BecameReady(elapsed=0.0, phase=None, message="router ready")) == \
        {"event": "ready", "elapsed": 0.0, "message": "router ready"}
    assert _line(EngineHung(elapsed=1.0, stalled_s=2.0)) == {"event": "hung", "elapsed": 1.0, "stalled_s": 2.0}
    assert _line(EngineExited(elapsed=1.0, exit_code=1, signal=None, signal_name=None, status="exited")) == \
        {"event": "exited", "elapsed": 1.0, "exit_code": 1, "signal": None, "signal_name": None, "status": "exited"}
    assert _line(FollowerExited(message="node 1 ended (exited)", node=1, host="h1")) == \
        {"event": "exited", "message": "node 1 ended (exited)", "node": 1, "host": "h1"}
    assert _line(Warn(message="w", host="h", member="r0")) == \
        {"event": "warning", "message": "w", "host": "h", "member": "r0"}
    assert _line(SmokePhase(phase="push", status="passed", duration_s=0.5)) == \
        {"event": "smoke_phase", "phase": "push", "status": "passed", "duration_s": 0.5}


def test_diagnosis_and_change_lines() -> None:
    diag = {"signature": "oom", "summary": "s", "transient": False, "evidence": ["e"], "traceback": None,
            "remedy": None, "hint": "h"}
    assert _line(Diagnosed(attempt=1, **diag)) == {"event": "diagnosis", "attempt": 1, **diag}
    assert _line(Diagnosed(attempt=0, stage="preflight", **diag)) == \
        {"event": "diagnosis", "attempt": 0, "stage": "preflight", **diag}
    change = {"args": {"a": 1}, "env": {}, "reason": "r", "basis": {}}
    assert _line(Changed(attempt=1, **change)) == {"event": "change", "attempt": 1, **change}
    assert _line(Changed(attempt=0, before_launch=True, **change)) == \
        {"event": "change", "attempt": 0, "before_launch": True, **change}


def test_download_progress_shapes() -> None:
    bytes_bar = Download(file="m.safetensors", percent=10, text="t", bytes=1, total_bytes=10, rate_bytes_s=5)
    assert _line(Progressed(phase="downloading", elapsed=1.0, line="l", download=bytes_bar)) == \
        {"event": "progress", "phase": "downloading", "elapsed": 1.0, "line": "l", "file": "m.safetensors",
         "percent": 10, "text": "t", "bytes": 1, "total_bytes": 10, "rate_bytes_s": 5}
    counted = Download(file="files", percent=50, text="t", done=1, total=2, unit="it")
    assert set(_line(Progressed(phase="downloading", elapsed=1.0, download=counted))) == \
        {"event", "phase", "elapsed", "line", "file", "percent", "text", "done", "total", "unit"}
    cache = Download(file="org/m", bytes=3, rate_bytes_s=1, text="t", source="hub cache")
    assert set(_line(Progressed(phase="downloading", elapsed=1.0, download=cache))) == \
        {"event", "phase", "elapsed", "line", "file", "percent", "bytes", "total_bytes", "rate_bytes_s", "text",
         "source"}
    assert _line(Progressed(phase="loading", elapsed=1.0, line="l")) == \
        {"event": "progress", "phase": "loading", "elapsed": 1.0, "line": "l"}


def test_context_is_added_by_replace_and_masking_keeps_the_type(monkeypatch: object) -> None:
    tagged = dataclasses.replace(Info(message="m"), node=0, host="h")
    assert isinstance(tagged, Info) and tagged.data == {"message": "m", "node": 0, "host": "h"}
    seen: list[object] = []
    masking_sink(seen.append)(Info(message="plain"))
    assert isinstance(seen[0], Info) and seen[0].message == "plain"
