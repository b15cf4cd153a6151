"""The steps every real-engine lifecycle test takes, whatever the engine: a real chat completion, status, logs,
restart, down, and what must be true of the target afterwards."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import STANDIN, deploy, events

DEPLOY_S = 400  # one deploy command, bounded: a real start is 15-45 s here, a busy CI's 2 cores slower


def report_of(stdout: str) -> dict[str, Any]:
    evs = events(stdout)
    assert evs and evs[-1]["event"] == "report", stdout[-3000:]
    return evs[-1]


def up_json(prof: Path, home: Path, *extra: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = deploy("up", str(prof), "--json", *extra, home=home, timeout=DEPLOY_S)
    return proc.returncode, events(proc.stdout), proc.stdout[-4000:] + proc.stderr[-3000:]


def chat(port: int, model: str, tokens: int = 8) -> dict[str, Any]:
    """A real /v1/chat/completions request to the engine (greedy, bounded)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hello"}],
                       "max_tokens": tokens, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


def completion(port: int, model: str, tokens: int) -> int:
    """A real /v1/completions request that generates exactly `tokens` tokens (ignore_eos); the tokens it got."""
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": tokens, "ignore_eos": True,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=180) as resp:   # behind a queue of others
        answer: dict[str, Any] = json.loads(resp.read())
    return int(answer["usage"]["completion_tokens"])


def status_row(prof: Path, home: Path) -> tuple[int, dict[str, Any]]:
    proc = deploy("status", str(prof), "--json", home=home, timeout=60)
    row: dict[str, Any] = json.loads(proc.stdout)
    return proc.returncode, row


# Between two looks of wait_status. Each look is a `deploy status` (a python process of ~0.6 CPU-s here), and the
# waits (a restart, a probe's grace, a drain) last minutes while a real engine starts beside them on the same 2
# cores: a look every ~3 s instead of every ~2 s, for at most a second more per wait.
LOOK_EVERY_S = 2.0


def wait_status(prof: Path, home: Path, pred: Any, timeout: float, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    row: dict[str, Any] = {}
    while time.monotonic() < deadline:
        _, row = status_row(prof, home)
        if pred(row):
            return row
        time.sleep(LOOK_EVERY_S)
    raise AssertionError(f"status never showed {what} within {timeout:g}s: {row}")


# Phases only a GPU shows (the stand-ins pretend an H200; the real tier runs on a CPU).
GPU_ONLY_PHASES = {"capturing cuda graphs"}


def standin_twin(prof: Path, home: Path, name: str, *, model: str = "Qwen/Qwen3-8B", env: dict[str, str] | None = None,
                 args: dict[str, Any] | None = None, restart: dict[str, Any] | None = None,
                 ) -> tuple[Path, int, list[dict[str, Any]], str]:
    """The same scenario on the fast tier's stand-in of the engine: the real profile with the engine python and
    model swapped for the stand-in's (same host, same args unless `args` replaces them), deployed the same way,
    so a test can compare what deployer made of the stand-in with what it made of the real engine."""
    import yaml

    data = yaml.safe_load(prof.read_text())
    data["name"] = name
    engine = data["engine"]
    engine.update(python="/usr/bin/python3", model_path=model)
    engine["env"] = {"PYTHONPATH": str(STANDIN), **(env or {})}
    if args is not None:
        engine["args"] = args
    if restart is not None:
        data["restart"] = {**data.get("restart", {}), **restart}
    from sshbed import free_port

    engine["port"] = free_port()
    twin = prof.with_name(f"{name}.yaml")
    twin.write_text(yaml.safe_dump(data, sort_keys=False))
    code, evs, said = up_json(twin, home)
    return twin, code, evs, said


def phases_of(evs: list[dict[str, Any]]) -> list[str]:
    return [e["phase"] for e in evs if e["event"] == "phase" and e["phase"] not in GPU_ONLY_PHASES]


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def new_shm_segments(before: set[str], since: float, settle_s: float = 20.0) -> list[str]:
    """Engine shared memory (vLLM's psm_* and multiprocessing's sem.mp-*, SGLang's sglang_*) made since `since`
    and still in /dev/shm with no live process mapping it: left behind. /dev/shm is the machine's: a segment
    another engine running here (another test run beside this one, another user) holds is mapped by that
    engine, so it is not ours; one that another engine's supervisor is about to clean (its engine just ended) is
    gone within seconds, so what is found is looked at again for up to `settle_s`: left means still there and
    unmapped at every look."""
    left = _unmapped_new(before, since)
    deadline = time.monotonic() + settle_s
    while left and time.monotonic() < deadline:   # bounded: settle_s, a look a second
        time.sleep(1.0)
        left = [name for name in _unmapped_new(before, since) if name in left]
    return left


def _unmapped_new(before: set[str], since: float) -> list[str]:
    left = []
    for name in shm_entries() - before:
        if name.startswith(("psm_", "sem.mp-", "sglang_")):
            try:
                if os.stat(os.path.join("/dev/shm", name)).st_mtime >= since - 1:
                    left.append(name)
            except OSError:
                pass
    mapped = _mapped_shm() if left else set()
    return [name for name in left if name not in mapped]


def _mapped_shm() -> set[str]:
    """Names under /dev/shm that some live process maps (its /proc/PID/maps; a process gone meanwhile is skipped)."""
    names = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/maps") as maps:
                names |= {line.rsplit("/dev/shm/", 1)[1].split(" ")[0].strip() for line in maps if "/dev/shm/" in line}
        except OSError:
            continue
    return names


def assert_recorded_timeline(prof: Path, home: Path) -> None:
    """The real start's timeline as `up` recorded it (outcome.json, read by `history`): its phases in order from
    launch, the weights loaded, their durations adding up to the time to ready; `history` shows them."""
    rows = json.loads(deploy("history", str(prof), "--json", home=home, timeout=60).stdout)
    (current,) = [r for r in rows if r.get("current")]
    timeline = current["timeline"]
    phases = [p["phase"] for p in timeline["phases"]]
    assert phases[0] == "start" and "load" in phases and phases[-1] == "http_up", timeline
    assert timeline["ready_s"] > 1.0, timeline
    assert sum(p["duration_s"] for p in timeline["phases"]) == pytest.approx(timeline["ready_s"], abs=0.01)
    assert [p["start_s"] for p in timeline["phases"]] == sorted(p["start_s"] for p in timeline["phases"])
    text = deploy("history", str(prof), home=home, timeout=60).stdout
    assert "    phases: start " in text and "-> ready at " in text, text


def assert_served_lifecycle(prof: Path, home: Path, port: int, model: str, phases: list[str], *,
                            drain: tuple[float, int] | None = None, before_down: Any = None) -> None:
    """up (done by the caller, `phases` its phase events) -> chat -> status -> logs -> restart -> chat -> down.
    `drain` (the profile's restart.drain_s, tokens a request): the restart runs with requests in flight, each
    must finish (hangs.restart_drains); `before_down`: a phase of the caller's on the restarted engine."""
    assert phases[0] == "args" and phases[-1] == "ready", phases
    answer = chat(port, model)
    assert answer["choices"][0]["message"]["role"] == "assistant", answer
    assert answer["usage"]["completion_tokens"] >= 1, answer

    code, row = status_row(prof, home)
    assert code == 0 and row["status"] == "ready" and row["healthy"] is True, row
    first_pid = row["pid"]

    assert_recorded_timeline(prof, home)

    logs = deploy("logs", str(prof), "-n", "400", home=home, timeout=60)
    assert logs.returncode == 0 and "POST /v1/chat/completions" in logs.stdout, logs.stdout[-2000:]

    if drain is None:
        restart = deploy("restart", str(prof), "--json", home=home, timeout=DEPLOY_S)
        assert restart.returncode == 0, restart.stdout[-3000:] + restart.stderr
        assert report_of(restart.stdout)["status"] == "ready"
    else:
        from hangs import restart_drains

        restart_drains(prof, home, port, model, *drain)
    code, row = status_row(prof, home)
    assert code == 0 and row["healthy"] is True and row["pid"] != first_pid, row
    assert chat(port, model)["usage"]["completion_tokens"] >= 1
    if before_down is not None:
        before_down()

    down = deploy("down", str(prof), home=home, timeout=120)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stdout + down.stderr
    code, row = status_row(prof, home)
    assert code == 8 and row["status"] == "stopped", row
