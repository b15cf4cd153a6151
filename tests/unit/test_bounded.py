"""Bounded everything, and output that works in CI logs and scripts: capped excerpts, control sequences stripped,
the end of an overlong last line, readable crash times, history with unfinished attempts, the --json error line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deployer.engines import engine_for
from deployer.cli.main import wants_json
from deployer.cli.targets import describe_crash
from deployer.diagnose.diagnosis import diagnose, hang_diagnosis
from deployer.logtext import EXCERPT_CHARS, bounded_diagnosis, clip, printable, readable
from deployer.remote.local import LocalRemote
from deployer.local.history import History
from deployer.box.records import tail_lines

REPO = Path(__file__).resolve().parents[2]
HOSTILE = ["\x1b]0;pwned title\x07", "\x1b]8;;http://evil.example/\x1b\\", "\x1b]52;c;ZXZpbA==\x07", "\x07",
           "\x1bP1;2|junk\x1b\\", "\x9b31m", "\x1b[2J", "\x1b[?1049h", "\x1bc", "\x08\x08", "\x1b[31m", "\x1b]0;open"]


@pytest.mark.parametrize("seq", HOSTILE)
def test_control_sequences_never_reach_the_terminal(seq: str) -> None:
    shown = readable(f"INFO before{seq}after")
    assert shown.startswith("INFO before") and "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown
    assert all(ch == "\t" or ch >= " " and not "\x7f" <= ch <= "\x9f" for ch in shown)
    assert printable(f"a{seq}b\nc\td") .split("\n")[1] == "c\td"


def test_an_8mb_line_makes_a_small_diagnosis() -> None:
    line = "A" * (8 << 20)
    for diag in (hang_diagnosis([line], 600), diagnose(line + "\n", exit_code=1, engine=engine_for("sglang")),
                 diagnose(f"Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: {line}\n",
                          exit_code=1, engine=engine_for("sglang"))):
        data = bounded_diagnosis({**diag.to_json(), "hint": diag.hint})
        size = len(json.dumps(data))
        assert size < 64 << 10, (diag.signature, size)
        assert diag.summary.endswith("no output") or "characters cut]" in json.dumps(data)
    assert clip("x" * 10) == "x" * 10 and len(clip("x" * 10_000)) < EXCERPT_CHARS + 50


def test_logs_shows_the_end_of_a_last_line_longer_than_its_window(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"first line\n" + b"x" * (200 << 10) + b" THE END")
    lines = tail_lines(LocalRemote(), str(log), 5)
    assert len(lines) == 1 and lines[0].endswith("THE END") and lines[0].startswith("[start of line cut")
    assert len(lines[0]) < 20 << 10
    log.write_bytes(b"one\ntwo\n" + b"y" * 100 + b"\n")
    assert tail_lines(LocalRemote(), str(log), 5) == ["one", "two", "y" * 100]


def test_status_prints_the_last_crash_readably() -> None:
    at = time.time() - 300
    text = describe_crash({"at": at, "exit_code": None, "signal": 9, "signal_name": "SIGKILL", "log_offset": 0,
                           "traceback_offset": None}, now=at + 300)
    assert text.startswith("killed by SIGKILL at ") and text.endswith("(5m ago)")
    assert time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) in text and "{" not in text
    assert describe_crash({"at": at, "exit_code": 1, "signal": None}, now=at + 5).startswith("exited with code 1 at")


def _deploy(*argv: str, home: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DEPLOYER_HOME": str(home),
           "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run([sys.executable, "-m", "deployer.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(REPO))


def test_history_local_after_an_interrupted_up(tmp_path: Path) -> None:
    store = History(tmp_path / "history.sqlite3")
    store.begin_attempt(deployment="demo", host="h", up_id="u1", attempt=1, run_id="20261130T000000Z-abc-a1",
                        content_hash="c" * 64, profile={})  # `up` was interrupted before it ended the attempt
    store.close()
    proc = _deploy("history", "demo", "--local", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "unfinished" in proc.stdout and "Traceback" not in proc.stderr


def test_json_failures_end_with_one_error_event(tmp_path: Path) -> None:
    refused = _deploy("status", "demo", "--host", "127.0.0.1:1", "--json", home=tmp_path)
    assert refused.returncode == 3
    last = json.loads(refused.stdout.strip().splitlines()[-1])
    assert last["event"] == "error" and last["code"] == 3 and "127.0.0.1" in last["message"]
    missing = _deploy("up", str(tmp_path / "missing.yaml"), "--json", home=tmp_path)
    assert missing.returncode == 2
    assert json.loads(missing.stdout.strip().splitlines()[-1])["code"] == 2
    plain = _deploy("status", "demo", "--host", "127.0.0.1:1", home=tmp_path)
    assert plain.returncode == 3 and plain.stdout == "" and plain.stderr.startswith("error: ")
    assert wants_json(["up", "p.yaml", "--json"]) and not wants_json(["up", "--", "--json"])


def test_output_is_not_wrapped_without_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from deployer.output.console import LiveProgress
    from deployer.events import Download, Progressed, Warn

    progress = LiveProgress()
    long = "warning text " * 30
    progress(Warn(message=long))
    progress(Progressed(phase="downloading", elapsed=1.0, line="x",
                        download=Download(file="model-1.safetensors", percent=10,
                                          text="model-1.safetensors  10%  1.00 GB of 10.00 GB")))
    progress.close()
    err = capsys.readouterr().err
    assert long.strip() in err  # one line, whatever its length
    assert "downloading" in err and "model-1.safetensors  10%  1.00 GB of 10.00 GB" in err


def test_an_overlong_log_line_keeps_its_head_and_its_end() -> None:
    """`deploy logs`: an engine's 20 KB argument dump is read from its start, a bar from its end."""
    from deployer.logtext import clip_middle

    line = "server_args={'api_key': '***', " + "x" * 40_000 + " 'lora_paths': ['a=/m']}"
    shown = clip_middle(line, 16 << 10)
    assert shown.startswith("server_args={'api_key'") and shown.endswith("'lora_paths': ['a=/m']}")
    assert f"[{len(line) - (16 << 10)} characters cut]" in shown
    assert len(shown) < (16 << 10) + 100
    assert clip_middle("short", 16) == "short"
