"""The live display (issue 24) on a real pseudo-terminal at 60, 80 and 200 columns, and piped: quoted log lines fit
the terminal (their beginning kept, the end cut with an ellipsis), each phase shows its own duration and the end
the total, Ctrl-C clears the live line once, and a hub-cache download is not printed twice without a terminal.

The child drives `run_reported` (what `up` prints through) with a scripted attempt; its output is replayed on a
small screen model (carriage return, newline, erase line, cursor up: what rich's Live writes)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HUB = "Qwen/Qwen3.6-27B in the hub cache: 1.00 GB, 50.00 MB/s"
CHILD = f"""
import sys, time
from deployer.cli.runs import run_reported
from deployer.events import AttemptStarted, BecameReady, Download, PhaseEntered, Progressed

class Dep:
    tagged_events = False

ARGS = "[2026-12-01 00:16:26] server_args=ServerArgs(model_path='Qwen/Qwen3.6-27B', " + "tp_size=1, " * 15 + "END"
HUB = {HUB!r}

def action(sink):
    sink(AttemptStarted(attempt=1, content_hash="9237bfb7fb98aaaa"))
    sink(PhaseEntered(phase="args", elapsed=0.5, line=ARGS))
    time.sleep(0.3)
    sink(PhaseEntered(phase="loading weights", elapsed=2.5, line="Load weight begin. avail mem=139.80 GB"))
    sink(PhaseEntered(phase="downloading", elapsed=3.0, line=HUB))
    sink(Progressed(phase="downloading", elapsed=3.0, line=HUB,
                    download=Download(file="Qwen/Qwen3.6-27B", bytes=10**9, text=HUB, source="hub cache")))
    time.sleep(0.6)  # the live line is drawn a few times
    if sys.argv[1] == "interrupt":
        raise KeyboardInterrupt
    sink(PhaseEntered(phase="ready", elapsed=10.0, line="The server is fired up and ready to roll!"))
    sink(BecameReady(elapsed=10.25))
    raise SystemExit(0)  # (the report is not the point here)

try:
    run_reported(False, Dep(), action)
except KeyboardInterrupt:
    sys.stderr.write("interrupted\\n")
"""


def screen(raw: str, width: int) -> list[str]:
    """The rows a terminal of `width` columns shows after `raw` (enough of VT100 for rich's Live)."""
    rows, row, col = [""], 0, 0
    raw = re.sub(r"\x1b\][^\x07]*\x07|\x1b\[\?[0-9;]*[hl]|\x1b\[[0-9;]*m", "", raw)
    for token in re.findall(r"\x1b\[[0-9;]*[A-Za-z]|.", raw, re.S):
        if token.startswith("\x1b["):
            n = int(token[2:-1] or 1) if token[2:-1].isdigit() else 1
            if token[-1] == "A":
                row = max(row - n, 0)
            elif token[-1] == "K":
                rows[row] = rows[row][:col] if token[2:-1] == "" or token[2:-1] == "0" else ""
            elif token[-1] == "G":
                col = n - 1
            continue
        if token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            rows += [""] * (row + 1 - len(rows))
        else:
            if col >= width:  # the terminal wraps
                row, col = row + 1, 0
                rows += [""] * (row + 1 - len(rows))
            rows[row] = rows[row][:col].ljust(col) + token + rows[row][col + 1:]
            col += 1
    return [r.rstrip() for r in rows if r.strip()]


def on_pty(width: int, mode: str) -> tuple[list[str], str]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, width, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(PYTHONPATH=str(REPO), TERM="xterm-256color")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode], stdin=slave, stdout=slave, stderr=slave,
                            env=env, cwd=str(REPO), close_fds=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=30)
    os.close(master)
    raw = b"".join(chunks).decode("utf-8", "replace")
    return screen(raw, width), raw


@pytest.mark.parametrize("width", [60, 80, 200])
def test_lines_fit_the_terminal_keeping_their_beginning(width: int) -> None:
    rows, raw = on_pty(width, "ready")
    assert rows[0] == "attempt 1 (content 9237bfb7fb98)"
    args = next(r for r in rows if r.startswith("  args "))
    assert len(args) == width and args.endswith("\u2026"), rows  # fitted, never wrapped onto a second row
    head = "[2026-12-01 00:16:26] server_args=ServerArgs(model_path='Qwen/Qwen3.6-27B', " + "tp_size=1, " * 15
    assert args[35:-1] == head[:width - 36]                      # the beginning kept, the end cut
    assert all(len(r) <= width for r in rows), rows
    # each phase's own duration (args 0.5 -> 2.5: 2.0s), and the total at the end
    assert re.match(r"  args +2\.0s  ", args) and any(re.match(r"  loading weights +0\.5s  Load weight", r)
                                                       for r in rows), rows
    assert any(re.match(r"  downloading +7\.0s  Qwen/Qwen3\.6-27B in the", r) for r in rows), rows
    assert rows[-1] == "  ready after 10.2s (total)", rows
    assert "\x1b[?25l" in raw  # the live line was drawn (and cleared: it is not on the screen)
    assert not any(r.startswith("downloading") for r in rows), rows


@pytest.mark.parametrize("width", [60, 200])
def test_ctrl_c_clears_the_live_line_once(width: int) -> None:
    rows, _ = on_pty(width, "interrupt")
    assert rows[-1] == "interrupted", rows
    live = [r for r in rows if HUB[:20] in r]
    # the live line is cleared; the interrupted phase is said once, as a permanent line with its time so far
    assert len(live) == 1 and re.match(r"  downloading +0\.[5-9]s  ", live[0]) and rows[-2] == live[0], rows
    assert [r for r in rows if r.startswith("  args ")].__len__() == 1


def test_piped_output_fits_80_and_says_a_hub_cache_download_once() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    out = subprocess.run([sys.executable, "-c", CHILD, "ready"], capture_output=True, text=True, timeout=60,
                         env={**env, "PYTHONPATH": str(REPO)}, cwd=str(REPO))
    lines = out.stderr.splitlines()
    quoted = [line for line in lines if "hub cache" not in line]  # log text; a download line is deployer's own
    assert "\x1b" not in out.stderr and all(len(line) <= 80 for line in quoted), lines
    assert len(set(lines)) == len(lines), lines  # no line twice
    hub = [line for line in lines if "in the hub cache" in line]
    # its first line once (it is the phase's own first line too), then the phase's line with its duration
    assert all(line.endswith("1.00 GB, 50.00 MB/s") for line in hub), hub  # deployer's own line: whole in a log
    assert [line[:35] for line in hub] == [f"  {'downloading':<22} {0.0:7.1f}s  ", f"  {'downloading':<22} {7.0:7.1f}s  "]
    wide = subprocess.run([sys.executable, "-c", CHILD, "ready"], capture_output=True, text=True, timeout=60,
                          env={**env, "PYTHONPATH": str(REPO), "COLUMNS": "300"}, cwd=str(REPO))
    assert "tp_size=1, END" in wide.stderr  # COLUMNS widens a log that is no terminal
