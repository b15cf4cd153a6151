"""Red team, issue #34 finding 5: bidirectional controls in engine log text never reach the terminal.

An engine log (replayed by the stand-in: STANDIN_MODE=fail_text) whose traceback and last words carry U+202E
(right-to-left override), isolates and marks, as a hostile model name, path or prompt could put there: `up`'s
failure, its diagnosis and `deploy logs` print the words without any of them (the other control sequences were
already stripped: logtext.CONTROL_RE)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, write_profile

pytestmark = pytest.mark.integration

BIDI = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\u200e", "\u200f"]
LOG = ("[2026-11-30 10:00:00] starting\n"
       "Traceback (most recent call last):\n"
       '  File "/srv/\u202egnp.exe", line 1, in <module>\n'
       "RuntimeError: CUDA out of memory \u2067evil\u2069 tried \u200f\u200eto allocate\n"
       "LAST \u202eWORDS\u202c " + "".join(BIDI) + "END\n")


def bidi_in(text: str) -> list[str]:
    return sorted({hex(ord(c)) for c in text if c in BIDI})


def test_bidi_controls_in_engine_text_are_never_printed(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "home"
    hostile = tmp_path / "hostile.log"
    hostile.write_text(LOG, encoding="utf-8")
    prof = write_profile(tmp_path, sshd, name="hostile",
                         env={"STANDIN_MODE": "fail_text", "STANDIN_FAIL_LOG": str(hostile), "STANDIN_EXIT": "1"},
                         extra={"retry": {"max_attempts": 1, "backoff_s": 0.2}})
    up = deploy("up", str(prof), "--skip-preflight", home=home)
    assert up.returncode == 5, up.stderr[-2000:]
    assert "LAST WORDS END" in up.stdout + up.stderr and bidi_in(up.stdout + up.stderr) == [], up.stderr[-2000:]
    logs = deploy("logs", str(prof), "-n", "20", home=home)
    assert logs.returncode == 0, logs.stderr
    assert "LAST WORDS END" in logs.stdout and bidi_in(logs.stdout + logs.stderr) == [], logs.stdout
    status = deploy("status", str(prof), home=home)
    assert bidi_in(status.stdout + status.stderr) == [], status.stdout
