"""Issue 22 (7): `deploy logs -n N` shows the last N lines of the log whatever their length: the traceback lines
before a 20 MB last line are kept, and the long line is shown by its head and its end with exactly how many bytes
were cut between them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, write_profile

pytestmark = pytest.mark.integration

TRACEBACK = ["Traceback (most recent call last):", '  File "/srv/engine/scheduler.py", line 2211, in run',
             "    self.step()", "RuntimeError: CUDA error: an illegal memory access was encountered"]


def test_logs_keeps_the_lines_before_a_20mb_line_and_says_how_many_bytes_it_cut(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="longline")
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    run_dir = Path(json.loads(deploy("status", str(prof), "--json", home=home).stdout)["run_dir"])
    assert deploy("down", str(prof), home=home).returncode == 0
    long_line = b"HEAD-OF-THE-LINE " + b"x" * (20 << 20) + b" THE-LAST-WORDS"
    (run_dir / "engine.log").write_bytes(b"".join(f"early line {i}\n".encode() for i in range(50)) +
                                         "\n".join(TRACEBACK).encode() + b"\n\n" + long_line + b"\n")
    proc = deploy("logs", str(prof), "-n", "5", home=home)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:4] == TRACEBACK and len(lines) == 5, [x[:120] for x in lines]
    last = lines[4]
    assert last.startswith("HEAD-OF-THE-LINE ") and last.endswith(" THE-LAST-WORDS") and len(last) < 40 << 10
    found = re.search(r"\[(\d+) bytes cut\]", last)
    assert found, last[:300]
    shown = len(last.encode()) - len(found.group(0)) - len(" ...  ... ")
    assert int(found.group(1)) + shown == len(long_line), (found.group(0), shown, len(long_line))
    one = deploy("logs", str(prof), "-n", "1", home=home).stdout.splitlines()
    assert len(one) == 1 and one[0] == last
