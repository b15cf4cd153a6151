"""A follower rank that stops progressing hangs the whole group (issue 37 item 5), end to end: the real CLI, one real
sshd per node (tests/hostbed.py) and the stand-in multi-node SGLang, whose rank 0 needs every follower's answer for
each step (tests/standin/sglang/srt/standin_multinode.py, SGLang's per-iteration broadcast). Node 1's engine is
frozen (SIGSTOP of its process group, sent on node 1 over its ssh) while rank 0 holds a request: rank 0's steps stop,
its supervisor calls it hung within health.hang_s and keeps its stacks; the frozen follower is ended too (it
cannot take a SIGTERM while stopped); the whole group restarts and serves again; `deploy status` shows node 0 hung.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import deploy
from hostbed import HostBed
from test_nodes_up import bed  # noqa: F401  (the fixture: two sshd hosts with the stand-in nvidia-smi)
from test_nodes_up import nodes_profile, state, up
from waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HANG_S = 3.0
RUNNING = re.compile(r"^sglang:num_running_reqs\{[^}]*\} (\S+)$", re.M)
PROGRESS = re.compile(r'^sglang:realtime_tokens_total\{[^}]*mode="decode"[^}]*\} (\S+)$', re.M)


def _get(port: int, path: str, timeout: float = 5) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


def _chat(port: int, timeout: float) -> int | None:
    body = json.dumps({"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body=body, headers={"content-type": "application/json"})
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def _series(port: int) -> tuple[float, float]:
    """Rank 0's running requests and its per-step progress counter (what the hang rule reads)."""
    text = _get(port, "/metrics")[1]
    running, progress = RUNNING.search(text), PROGRESS.search(text)
    assert running and progress, text[:2000]
    return float(running.group(1)), float(progress.group(1))


def _profile(tmp_path: Path, bed: HostBed) -> tuple[Path, list[int]]:
    # STANDIN_CHAT_DELAY_S: the request is in flight for a while before its steps (so it is seen running)
    profile, ports = nodes_profile(tmp_path, bed, args={"enable_metrics": True},
                                   env={"STANDIN_CHAT_DELAY_S": "1"},
                                   restart={"backoff_s": [0.2, 0.5], "window_s": 120})
    data = yaml.safe_load(profile.read_text())
    data["health"]["hang_s"] = HANG_S
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    return profile, ports


def test_a_frozen_follower_hangs_rank0_and_the_whole_group_restarts(tmp_path: Path, bed: HostBed) -> None:
    profile, ports = _profile(tmp_path, bed)
    assert up(tmp_path, profile).returncode == 0
    before0, before1 = state(bed, 0), state(bed, 1)
    _, progress0 = _series(ports[0])
    assert _chat(ports[0], 30) == 200          # the group steps: a completion is its steps
    assert _series(ports[0])[1] > progress0    # and the per-step counter moved with them

    held: list[int | None] = []
    client = threading.Thread(target=lambda: held.append(_chat(ports[0], 60)), daemon=True)
    client.start()
    wait_for(lambda: _series(ports[0])[0] >= 1, "a request running on rank 0", 10)
    frozen = bed.run("node-1", f"kill -STOP -- -{int(before1['pgid'])}")   # node 1's engine, frozen on node 1
    assert frozen.returncode == 0, frozen.stderr
    t0 = time.monotonic()
    hung = wait_for(lambda: (state(bed, 0).get("last_crash") or {}).get("hung"), "rank 0 ended as hung", 30)
    detected_s = time.monotonic() - t0
    s0 = state(bed, 0)
    assert not s0["last_crash"]["peer_lost"], s0["last_crash"]   # the hang rule saw it, not the health look
    assert hung["hang_s"] == HANG_S and hung["running"] >= 1 and hung["stalled_s"] >= HANG_S, hung
    assert detected_s < HANG_S + 8, detected_s
    print(f"frozen follower -> rank 0 hung in {detected_s:.1f} s (hang_s {HANG_S:g})")
    stacks = hung["stacks"]
    assert (bed.hosts[0].workdir / "two-node" / "current" / stacks["file"]).is_file() and stacks["processes"]

    # the whole group comes back: the frozen follower was ended (SIGKILL: a stopped process takes no SIGTERM)
    wait_for(lambda: state(bed, 1).get("pid") not in (None, before1["pid"]), "node 1's engine replaced", 30)
    s1 = state(bed, 1)
    assert s1["last_crash"]["peer_lost"] and s1["last_crash"]["signal_name"] == "SIGKILL", s1["last_crash"]
    gone = bed.run("node-1", f"ps -o stat= -p {int(before1['pid'])} || echo gone")
    assert gone.stdout.strip() == "gone", gone.stdout
    wait_for(lambda: state(bed, 0).get("status") == "ready" and state(bed, 1).get("status") == "ready"
             and state(bed, 0).get("pid") != before0["pid"], "the group ready again", 45)
    assert _chat(ports[0], 30) == 200
    client.join(timeout=5)

    # status: node 0 hung, first to fall, the silent follower named; node 1 followed it
    shown = deploy("status", str(profile), home=tmp_path / "home")
    assert "node 0 (rank 0 (API)): its crash came first, the group fell with it" in shown.stdout, shown.stdout
    assert "last crash: hung: 1 running, 0 waiting and no engine step for" in shown.stdout, shown.stdout
    assert f"rank 1 at 127.0.0.3:{ports[1]} does not answer its health check" in shown.stdout, shown.stdout
    shown_json = deploy("status", str(profile), "--json", home=tmp_path / "home").stdout
    rows = {r["node"]: r for r in json.loads(shown_json)["members"]}
    assert rows[0]["first_crash"] and not rows[1]["first_crash"], rows
    assert rows[0]["last_crash_diagnosis"]["signature"] == "hung", rows[0]["last_crash_diagnosis"]
    # node 1 was stopped for its group (the SIGKILL was its supervisor's): not an OOM kill
    assert rows[1]["last_crash_diagnosis"]["signature"] == "group-peer-lost", rows[1]["last_crash_diagnosis"]
    assert "OOM" not in shown.stdout, shown.stdout
    assert deploy("down", str(profile), home=tmp_path / "home").returncode == 0
