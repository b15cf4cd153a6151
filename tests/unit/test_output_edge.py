"""Issue 22 (7): no control sequence reaches the terminal through any line deployer prints: an error message, a
progress line, an engine log line or a claim note another user forged (OSC title/hyperlink to BEL or ST, CR, CSI,
bells, other C0 and C1 codes); newline and tab stay."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployer.events import Info, PortTakenSeen, Problem
from deployer.output.edge import PrintableStream, guard_printable, styled_stderr

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "\x1b]0;owned\x07\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\\rfake line\x1b[2J\x9b31m\x07\x08\x00\x85end"
CONTROLS = [chr(c) for c in (*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f, *range(0x80, 0xa0))]


def assert_printable(text: str) -> None:
    found = sorted({f"{ord(c):#04x}" for c in text if c in CONTROLS})
    assert not found, (found, text)


def test_the_edge_strips_every_control_sequence_and_keeps_the_words() -> None:
    inner = io.StringIO()
    PrintableStream(inner).write(f"error: {HOSTILE}\n\tnext\n")  # type: ignore[arg-type]
    out = inner.getvalue()
    assert_printable(out)
    assert out == "error: linkfake line31mend\n\tnext\n", repr(out)


def test_an_error_message_holding_control_sequences_is_printed_without_them(tmp_path: Path) -> None:
    """A profile path is part of the error line `deploy validate` prints."""
    bad = tmp_path / f"prof{HOSTILE.replace(chr(0), '')}.yaml"
    proc = subprocess.run([sys.executable, "-m", "deployer.cli", "validate", str(bad)], capture_output=True,
                          cwd=str(REPO), env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert_printable(err)
    assert "fake line" in err and len(err.strip().splitlines()) == 1, err


def test_progress_lines_hold_no_control_sequences(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The live console draws on styled_stderr (masked, not stripped): the text it is given is stripped itself."""
    from deployer.output.console import LiveProgress

    guard_printable()
    try:
        progress = LiveProgress()
        for event in (Info(message=f"note {HOSTILE}"), Problem(message=f"problem {HOSTILE}"),
                      PortTakenSeen(elapsed=1.0, port=8000, holders=[f"deployment {HOSTILE}"])):
            progress(event)
        progress.say(f"[bold]report[/] {HOSTILE}")
        progress.close()
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    err = capsys.readouterr().err
    assert_printable(err)
    assert err.count("fake line") == 4, err


def test_styled_stderr_is_the_stream_below_the_edge() -> None:
    before = sys.stderr
    try:
        sys.stderr = PrintableStream(io.StringIO())  # type: ignore[assignment]
        assert styled_stderr() is sys.stderr.inner  # type: ignore[attr-defined]
    finally:
        sys.stderr = before
