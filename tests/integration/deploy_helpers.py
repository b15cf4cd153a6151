"""Helpers for end-to-end tests: profiles that point at the test sshd and the stand-in engine, and the real CLI."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from sshbed import free_port

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"


def write_profile(tmp_path: Path, sshd: Any, *, name: str = "demo", args: dict[str, Any] | None = None,
                  env: dict[str, str] | None = None, port: int | None = None, extra: dict[str, Any] | None = None,
                  model: str = "Qwen/Qwen3-8B", workdir: Path | None = None, file: str | None = None) -> Path:
    """A profile for the stand-in engine on the test sshd; `extra` is deep-merged on top."""
    data: dict[str, Any] = {
        "name": name,
        "target": sshd.target(workdir or tmp_path / "work"),
        "engine": {"kind": "sglang", "python": "/usr/bin/python3", "model_path": model,
                   "port": port or free_port(), "args": args or {},
                   "env": {"PYTHONPATH": str(STANDIN), **(env or {})}},
        "health": {"interval_s": 0.2, "startup_timeout_s": 60, "stall_timeout_s": 20},
        "retry": {"max_attempts": 3, "backoff_s": 0.2},
        "restart": {"grace_s": 3},
    }
    for key, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = tmp_path / (file or f"{name}.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def deploy(*argv: str, home: Path, timeout: float = 120, env: dict[str, str] | None = None,
           ) -> subprocess.CompletedProcess[str]:
    """Run the real `deploy` CLI in a subprocess (fresh interpreter, like a user)."""
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DEPLOYER_HOME": str(home),
                "HOME": os.environ.get("HOME", "/root"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "deployer.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=str(REPO))


def events(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def history_events(home: Path, name: str, kind: str) -> list[dict[str, Any]]:
    """The `kind` events (upgrade, canary, ...) of deployment `name` in this machine's history (`home`), oldest
    first."""
    db = sqlite3.connect(str(home / "history.sqlite3"))
    try:
        rows = db.execute("SELECT data FROM events WHERE deployment = ? AND kind = ? ORDER BY id",
                          (name, kind)).fetchall()
    finally:
        db.close()
    return [json.loads(r[0]) for r in rows]


def upgrade_events(home: Path, name: str) -> list[dict[str, Any]]:
    """The `upgrade` events of deployment `name` in this machine's history (`home`), oldest first."""
    return history_events(home, name, "upgrade")


def fill(disk: Path, leave: int) -> None:
    """Fill `disk` (a small tmpfs) but `leave` bytes."""
    st = os.statvfs(disk)
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(st.f_bavail * st.f_frsize - leave, 0))


MTP_ARGS = {"speculative_algorithm": "NEXTN", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4, "tp_size": 1}


@contextmanager
def healed_deployment(tmp: Path, sshd: Any, name: str) -> Iterator[tuple[Path, Path]]:
    """A stand-in deployment whose first attempt crashed and was healed (SGLang 0.5.10's Mamba + MTP failure,
    attempt 2 ready), stopped at the end; its profile and DEPLOYER_HOME."""
    prof = write_profile(tmp, sshd, name=name, model="Qwen/Qwen3.6-27B", args=MTP_ARGS,
                         env={"STANDIN_SGLANG_VERSION": "0.5.10"})
    home = tmp / "home"
    up = deploy("up", str(prof), "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        yield prof, home
    finally:
        deploy("down", str(prof), home=home)


@contextmanager
def crash_looping_deployment(tmp: Path, sshd: Any, name: str) -> Iterator[tuple[Path, Path]]:
    """A stand-in engine that crashes after ready, restarted once and then given up on by the supervisor
    (`crashloop`), its profile naming the engine version 0.5.10; stopped at the end; its profile and DEPLOYER_HOME."""
    crash = {"STANDIN_MODE": "crash_after_ready", "STANDIN_CRASH_AFTER_S": "0.5"}
    prof = write_profile(tmp, sshd, name=name, env=crash, extra={
        "engine": {"version": "0.5.10"},
        "restart": {"policy": "on-failure", "max": 1, "backoff_s": [0.2, 0.2], "grace_s": 2}})
    home = tmp / "home"
    up = deploy("up", str(prof), "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        for _ in range(60):  # bounded: ~30 s
            out = deploy("status", str(prof), "--json", home=home)
            if out.stdout.strip() and json.loads(out.stdout).get("status") == "crashloop":
                break
            time.sleep(0.5)
        yield prof, home
    finally:
        deploy("down", str(prof), home=home)
