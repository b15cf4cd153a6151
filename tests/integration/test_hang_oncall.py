"""A hang end to end over SSH (issue 37): the stand-in SGLang's engine core dies with a request running (it stays
counted, its progress counter stays still: tests/standin/standin_core.py), the supervisor's hang rule calls it hung
after health.hang_s, keeps the stacks of its processes in the run dir and restarts it; `status`, `history` and
`diagnose` of the on-call engineer say "hung", the progress it saw and where the stacks say it waited."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, write_profile
from test_oncall import oncall
from test_stays_up import state_json, status_row, wait_row
from waiting import wait_for

pytestmark = pytest.mark.integration


def test_a_hung_engine_is_restarted_and_on_call_reads_say_hung(tmp_path: Path, sshd: Any) -> None:
    dead = tmp_path / "dead-core"
    # The request stays in flight far longer than the `status` calls that see it take on a loaded box: with 2 s it
    # could end before the core died (nothing running: no hang, a red run). While the core lives, the hang watch's
    # one-token nudge is answered and restarts its clock, so a long request alone is never called hung.
    prof = write_profile(tmp_path, sshd, name="hang", args={"enable_metrics": True},
                         env={"STANDIN_DEAD_CORE_FILE": str(dead), "STANDIN_CHAT_DELAY_S": "60"},
                         extra={"health": {"hang_s": 3},
                                "restart": {"backoff_s": [0.2, 0.4], "window_s": 60, "grace_s": 2}})
    assert deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h").returncode == 0
    first = status_row(sshd, tmp_path, "hang")[1]
    chat = json.dumps({"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    client = ("import sys, urllib.request; urllib.request.urlopen(urllib.request.Request("
              f"'http://127.0.0.1:{first['port']}/v1/chat/completions', data=sys.argv[1].encode(), "
              "headers={'content-type': 'application/json'}), timeout=120).read()")
    request = subprocess.Popen(["ssh", "-F", str(sshd.ssh_config), "deployer-test",
                                f"python3 -c {shlex.quote(client)} {shlex.quote(chat)}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_row(sshd, tmp_path, "hang", lambda r: (r["metrics"] or {}).get("requests_running") == 1,
                 "a request in flight")
        dead.touch()   # the core dies with the request running: it stays counted, nothing steps
        # the core comes back as soon as the supervisor says hung (its state.json, read here at once: the test host
        # is this machine), before the restarted engine's warmup asks it for a token (a `status` over ssh, slow
        # on a loaded box, let that warmup meet the dead core and fail)
        wait_for(lambda: _hung_said(Path(first["run_dir"])), "the supervisor to say hung", 60, 0.05)
        dead.unlink()
        crashed = wait_row(sshd, tmp_path, "hang", lambda r: (state_json(r).get("last_crash") or {}).get("hung"),
                           "ended as hung")
    finally:
        dead.unlink(missing_ok=True)
        request.kill()
        request.wait(timeout=30)
    back = wait_row(sshd, tmp_path, "hang", lambda r: r["status"] == "ready" and r["restarts"] == 1, "restarted")
    assert back["pid"] != first["pid"]
    hung = state_json(crashed)["last_crash"]["hung"]
    assert hung["hang_s"] == 3.0 and hung["running"] >= 1 and hung["stalled_s"] >= 3.0, hung
    stacks = hung["stacks"]
    assert (Path(crashed["run_dir"]) / stacks["file"]).is_file() and stacks["processes"], stacks
    status = oncall(sshd, tmp_path, "status", "hang").stdout
    assert "last crash: hung: 1 running, 0 waiting and no engine step for" in status, status
    assert "stacks (" in status and "in the run dir: hang-stacks-0.txt; then " in status, status
    assert "diagnosis: hung: the engine held requests and made no progress: hung" in status, status
    history = oncall(sshd, tmp_path, "history", "hang").stdout
    assert "    hung: 1 running, 0 waiting and no engine step for" in history, history
    assert "      pid " in history, history   # the top frames, each with its process
    diagnose = oncall(sshd, tmp_path, "diagnose", "hang").stdout
    assert "hung" in diagnose and "hang-stacks-0.txt" in diagnose, diagnose
    assert deploy("down", str(prof), home=tmp_path / "h").returncode == 0


def _hung_said(run_dir: Path) -> bool:
    try:
        return bool(json.loads((run_dir / "state.json").read_text()).get("hung"))
    except (OSError, ValueError):   # being replaced right now
        return False
