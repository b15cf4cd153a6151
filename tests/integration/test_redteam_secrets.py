"""Red team, issue #35 item 5 (with #34): the env file (0600, the secrets) outlives only runs that can be rolled back
to. An `up` whose engine crashes before ready (no version to go back to, so its run stays `current`) leaves no env
file behind once its retention ran; a run that reached ready keeps its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, write_profile

pytestmark = pytest.mark.integration

SECRET = "hf_redteam_secret_value_0123456789"


def env_files(tmp_path: Path) -> list[str]:
    return sorted(p.parent.name for p in (tmp_path / "work" / "demo" / "runs").glob("*/env"))


def test_a_run_that_crashed_before_ready_keeps_no_secrets(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "home"
    log = tmp_path / "crash.log"
    log.write_text("[2026-11-30 10:00:00] starting\nTraceback (most recent call last):\nRuntimeError: boom\n")
    prof = write_profile(tmp_path, sshd, name="demo",
                         env={"HF_TOKEN": SECRET, "STANDIN_MODE": "fail_text", "STANDIN_FAIL_LOG": str(log),
                              "STANDIN_EXIT": "1"},
                         extra={"retry": {"max_attempts": 1, "backoff_s": 0.2}})
    up = deploy("up", str(prof), "--skip-preflight", home=home)
    assert up.returncode == 5, up.stderr[-2000:]
    runs = sorted((tmp_path / "work" / "demo" / "runs").iterdir())
    assert len(runs) == 1 and (tmp_path / "work" / "demo" / "current").resolve() == runs[0].resolve()
    assert env_files(tmp_path) == []
    assert not any(SECRET in p.read_text(errors="replace") for p in runs[0].iterdir() if p.is_file())


def test_a_ready_run_keeps_its_env_and_a_later_crash_loses_its_own(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "home"
    good = write_profile(tmp_path, sshd, name="demo", env={"HF_TOKEN": SECRET},
                         extra={"restart": {"grace_s": 3, "on_boot": False}})
    up = deploy("up", str(good), "--skip-preflight", home=home)
    assert up.returncode == 0, up.stderr[-2000:]
    ready = env_files(tmp_path)
    assert len(ready) == 1
    log = tmp_path / "crash.log"
    log.write_text("[2026-11-30 10:00:00] starting\nTraceback (most recent call last):\nRuntimeError: boom\n")
    bad = write_profile(tmp_path, sshd, name="demo", file="bad.yaml",
                        env={"HF_TOKEN": SECRET, "STANDIN_MODE": "fail_text", "STANDIN_FAIL_LOG": str(log),
                             "STANDIN_EXIT": "1"},
                        extra={"retry": {"max_attempts": 1, "backoff_s": 0.2}, "restart": {"grace_s": 3,
                                                                                          "on_boot": False}})
    try:
        failed = deploy("up", str(bad), "--skip-preflight", home=home)
        assert failed.returncode != 0, failed.stderr[-2000:]
        assert env_files(tmp_path) == ready  # the ready one (serving again) keeps it, the crashed one lost its
    finally:
        deploy("down", str(good), "--break-lock", home=home, timeout=60)
