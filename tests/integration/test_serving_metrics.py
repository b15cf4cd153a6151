"""Issue 26 over the real sshd: `deploy status` shows what the engine serves (its own /metrics, through the helper:
the stand-in engines replay real vLLM 0.32.0 / SGLang 0.5.23 captures with their counters advancing per completion)
and the GPUs' memory (the stand-in nvidia-smi); `deploy top --once --json`; the live `deploy top` in a pty quits on
q and gives the terminal back as it found it."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import REPO, deploy, write_profile

pytestmark = pytest.mark.integration

VLLM = {"kind": "vllm"}


def complete(port: int, n: int) -> None:
    """n chat completions straight to the engine (it listens on loopback: the test machine is the target)."""
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}).encode()
    for _ in range(n):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as reply:
            assert reply.status == 200


def status_json(prof: Path, home: Path) -> dict[str, Any]:
    res = deploy("status", str(prof), "--json", home=home)
    assert res.returncode == 0, res.stderr + res.stdout[-2000:]
    return json.loads(res.stdout)


def test_status_shows_vllm_serving_metrics_and_gpu_memory(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "home"
    prof = write_profile(tmp_path, sshd, name="metrics-vllm", extra={"engine": VLLM})
    up = deploy("up", str(prof), "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr + up.stdout[-2000:]
    try:
        first = status_json(prof, home)
        m = first["metrics"]
        # the first look has no interval: no rates, latencies over the engine's life (no request yet: none)
        assert m["engine"] == "vllm" and m["interval_s"] is None and m["generation_tokens_per_s"] is None, m
        assert m["requests_running"] == 0 and m["kv_cache_usage"] == 0 and m["absent"] == [], m
        assert m["e2e_latency"] == {"p50_s": None, "p99_s": None, "count": 0, "window": "since_start"}, m
        assert m["gpu_memory"] == [{"index": 0, "used_mib": 1, "total_mib": 143771}], m  # the stand-in's H200

        complete(first["port"], 3)
        time.sleep(0.3)
        second = status_json(prof, home)["metrics"]
        interval = second["interval_s"]
        assert interval and interval > 0, second
        # 3 completions of 12 prompt / 10 generated tokens each, over the interval since the first look
        assert second["prompt_tokens_per_s"] == pytest.approx(36 / interval, rel=1e-6), second
        assert second["generation_tokens_per_s"] == pytest.approx(30 / interval, rel=1e-6), second
        e2e = second["e2e_latency"]
        # each took 0.065 s: in vLLM's first e2e bucket (le 0.3), interpolated as PromQL does (0.99 x 0.3)
        assert e2e["count"] == 3 and e2e["window"] == "interval" and e2e["p99_s"] == pytest.approx(0.297), e2e
        assert second["time_to_first_token"]["count"] == 3 and second["request_errors"]["total"] == 0, second

        text = deploy("status", str(prof), home=home)
        assert text.returncode == 0, text.stderr
        assert "  serving: 0 running, 0 waiting, KV 0.0%;" in text.stdout, text.stdout
        assert "  gpu memory: GPU 0 1/143771 MiB" in text.stdout, text.stdout
    finally:
        deploy("down", str(prof), home=home)


def test_sglang_without_enable_metrics_says_how_to_turn_them_on(tmp_path: Path, sshd: Any) -> None:
    """Absent is absent: no /metrics (no --enable-metrics) is no numbers, with the profile change that adds them;
    with it, the replayed SGLang capture's numbers."""
    home = tmp_path / "home"
    prof = write_profile(tmp_path, sshd, name="metrics-sgl")
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    try:
        m = status_json(prof, home)["metrics"]
        assert set(m) == {"off", "error", "gpu_memory"} and m["error"].startswith("metrics off ("), m  # not asked
        assert "add `enable_metrics: true` to engine.args" in m["error"], m
    finally:
        deploy("down", str(prof), home=home)
    on = write_profile(tmp_path, sshd, name="metrics-sgl-on", args={"enable_metrics": True})
    assert deploy("up", str(on), "--skip-preflight", home=home).returncode == 0
    try:
        m = status_json(on, home)["metrics"]
        assert m["engine"] == "sglang" and m["requests_running"] == 0 and m["absent"] == [], m
        assert m["generation_tokens_per_s"] is None and m["request_errors"]["total"] == 0, m
    finally:
        deploy("down", str(on), home=home)


def test_top_once_json_and_the_live_view_in_a_pty(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "home"
    prof = write_profile(tmp_path, sshd, name="top-vllm", extra={"engine": VLLM})
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    try:
        port = status_json(prof, home)["port"]  # the first look: the next one has an interval
        complete(port, 2)
        res = deploy("top", str(prof), "--once", "--json", home=home)
        assert res.returncode == 0, res.stderr + res.stdout[-2000:]
        data = json.loads(res.stdout)
        assert data["problems"] == [] and len(data["rows"]) == 1, data
        row = data["rows"][0]
        assert row["deployment"] == row["member"] == "top-vllm" and row["state"] == "ready" and row["healthy"], row
        assert row["restarts"] == 0 and row["requests_running"] == 0 and row["kv_cache_usage"] == 0, row
        assert row["generation_tokens_per_s"] > 0 and row["e2e_p99_s"] == pytest.approx(0.297), row

        missing = deploy("top", "nosuch", "--host", "127.0.0.1:1", "--once", "--json", home=home)
        assert missing.returncode == 3 and json.loads(missing.stdout)["problems"], missing.stdout
        usage = deploy("top", str(prof), "--json", home=home)
        assert usage.returncode == 2 and "--json needs --once" in usage.stderr, usage.stderr

        for how in ("q", "SIGINT"):  # the key, and Ctrl-C as the terminal delivers it (a SIGINT)
            code, screen, before, after = live_top(prof, home, how)
            assert code == 0, (how, screen[-2000:])
            assert "top-vllm" in screen and "ready" in screen and "TOK/S" in screen, screen[-2000:]
            assert "\x1b[?1049h" in screen and screen.rstrip().endswith("\x1b[?1049l"), (how, screen[-300:])
            assert after == before, how  # the terminal's modes as they were (echo, canonical input)
    finally:
        deploy("down", str(prof), home=home)


def live_top(prof: Path, home: Path, how: str) -> tuple[int, str, list[Any], list[Any]]:
    """`deploy top PROFILE` on a pty: wait for two screens, press q (or send SIGINT); its exit code, what it drew,
    and the pty's termios modes before and after."""
    leader, follower = pty.openpty()
    before = termios.tcgetattr(follower)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DEPLOYER_HOME": str(home),
           "HOME": os.environ.get("HOME", "/root"), "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "deployer.cli", "top", str(prof), "--interval", "0.5"],
                            stdin=follower, stdout=follower, stderr=follower, env=env, cwd=str(REPO),
                            start_new_session=True)
    screen = b""
    try:
        deadline = time.monotonic() + 60
        pressed = False
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    screen += os.read(leader, 65536)
                except OSError:
                    break
            if not pressed and b"TOK/S" in screen and screen.count(b"top-vllm") >= 2:  # two screens drawn
                if how == "q":
                    os.write(leader, b"q")
                else:
                    proc.send_signal(signal.SIGINT)
                pressed = True
            if pressed and proc.poll() is not None:
                break
        code = proc.wait(timeout=20)
        while select.select([leader], [], [], 0.2)[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            screen += chunk
        after = termios.tcgetattr(follower)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
        os.close(follower)
    return code, screen.decode("utf-8", "replace"), before, after
