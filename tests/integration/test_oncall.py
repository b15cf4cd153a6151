"""On-call commands from a laptop that never ran `up`: restart, rollback, history, logs --previous, diagnose,
and the supervisor's restart policy for crashes after ready."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, events, write_profile
from sshbed import Sessions

pytestmark = pytest.mark.integration


def oncall(sshd: Any, tmp_path: Path, *argv: str) -> Any:
    """Run a command as the on-call engineer: name + ssh alias + workdir, fresh DEPLOYER_HOME."""
    return deploy(*argv, "--host", "deployer-test", "--workdir", str(tmp_path / "work"),
                  home=tmp_path / "oncall-laptop", env={"DEPLOYER_SSH_CONFIG": str(sshd.ssh_config)})


def test_restart_keeps_version_and_secrets(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="rs", env={"HF_TOKEN": "${SMOKE_SECRET}"},
                         args={"api_key": "${SMOKE_KEY}"})
    up = deploy("up", str(prof), "--skip-preflight", "--json", home=tmp_path / "h",
                env={"SMOKE_SECRET": "hf_very_secret", "SMOKE_KEY": "sk-api-secret"})
    assert up.returncode == 0, up.stderr
    before = json.loads(oncall(sshd, tmp_path, "status", "rs", "--json").stdout)
    res = oncall(sshd, tmp_path, "restart", "rs", "--json")
    assert res.returncode == 0, res.stderr + res.stdout[-2000:]
    report = events(res.stdout)[-1]
    assert report["status"] == "ready" and report["content_hash"] == before["content_hash"]
    assert "hf_very_secret" not in res.stdout + res.stderr
    after = json.loads(oncall(sshd, tmp_path, "status", "rs", "--json").stdout)
    assert after["pid"] != before["pid"] and after["healthy"] and after["run_dir"] != before["run_dir"]
    env_text = (Path(after["run_dir"]) / "env").read_text()
    assert "HF_TOKEN=hf_very_secret" in env_text and "DEPLOYER_SECRET_API_KEY=sk-api-secret" in env_text
    for name in ("profile.json", "launch.sh"):
        text = (Path(after["run_dir"]) / name).read_text()
        assert "hf_very_secret" not in text and "sk-api-secret" not in text
    oncall(sshd, tmp_path, "down", "rs")


def test_on_call_reads_by_profile_file_need_no_secret_and_follow_the_file(tmp_path: Path, sshd: Any) -> None:
    """At 3 a.m. nobody has HF_TOKEN exported: status/logs/history/down of a profile file read only where it points.
    Where it points is remembered by content: an edited profile (another workdir here) is read afresh."""
    prof = write_profile(tmp_path, sshd, name="tok", env={"HF_TOKEN": "${TOK_SECRET}"})
    up = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h", env={"TOK_SECRET": "hf_tok_secret"})
    assert up.returncode == 0, up.stderr
    for argv in (["status"], ["logs", "-n", "3"], ["history"]):
        res = deploy(*argv, str(prof), home=tmp_path / "h")  # no TOK_SECRET in this environment
        assert res.returncode == 0, (argv, res.stderr)
        assert "hf_tok_secret" not in res.stdout + res.stderr
    assert json.loads(deploy("status", str(prof), "--json", home=tmp_path / "h").stdout)["status"] == "ready"
    refused = deploy("restart", str(prof), home=tmp_path / "h")  # a restart from the file would need it
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "TOK_SECRET" in refused.stderr

    moved = prof.read_text().replace(str(tmp_path / "work"), str(tmp_path / "elsewhere"))
    prof.write_text(moved)
    gone = deploy("status", str(prof), home=tmp_path / "h")
    assert gone.returncode == 7 and "elsewhere" in gone.stderr, gone.stderr  # the edit counts, not the memory
    prof.write_text(moved.replace(str(tmp_path / "elsewhere"), str(tmp_path / "work")))
    assert deploy("down", str(prof), home=tmp_path / "h").returncode == 0


def test_rollback_after_a_failed_change(tmp_path: Path, sshd: Any) -> None:
    good = write_profile(tmp_path, sshd, name="rb")
    assert deploy("up", str(good), "--skip-preflight", home=tmp_path / "h").returncode == 0
    good_hash = json.loads(oncall(sshd, tmp_path, "status", "rb", "--json").stdout)["content_hash"]
    bad = write_profile(tmp_path, sshd, name="rb", env={"STANDIN_MODE": "crash"}, file="rb-bad.yaml",
                        port=json.loads(oncall(sshd, tmp_path, "status", "rb", "--json").stdout)["port"])
    failed = deploy("up", str(bad), "--skip-preflight", "--no-rollback", home=tmp_path / "h")
    assert failed.returncode == 5 and "was not brought back (--no-rollback)" in failed.stderr
    assert json.loads(oncall(sshd, tmp_path, "status", "rb", "--json").stdout)["status"] == "exited"

    offset = sshd.log_offset()
    diag = oncall(sshd, tmp_path, "diagnose", "rb", "--json")
    assert diag.returncode == 0, diag.stderr
    assert json.loads(diag.stdout)["summary"].startswith("unknown failure")
    assert sshd.sessions_since(offset) == Sessions(connections=1, exec=1, sftp=0, shell=0)  # issue 13
    offset = sshd.log_offset()
    prev = oncall(sshd, tmp_path, "logs", "rb", "--previous", "-n", "200")
    assert "The server is fired up and ready to roll!" in prev.stdout
    assert sshd.sessions_since(offset) == Sessions(connections=1, exec=1, sftp=0, shell=0)
    cur = oncall(sshd, tmp_path, "logs", "rb", "-n", "40")
    assert "RuntimeError" in cur.stdout

    back = oncall(sshd, tmp_path, "rollback", "rb", "--json")
    assert back.returncode == 0, back.stderr + back.stdout[-2000:]
    st = json.loads(oncall(sshd, tmp_path, "status", "rb", "--json").stdout)
    assert st["content_hash"] == good_hash and st["healthy"]

    hist = json.loads(oncall(sshd, tmp_path, "history", "rb", "--json").stdout)
    assert [h["outcome"] for h in hist][:3] == ["ready", "crashed", "ready"]
    assert hist[0]["current"] and hist[1]["diagnosis"]["signature"] is None
    oncall(sshd, tmp_path, "down", "rb")


def test_rollback_with_nothing_to_go_back_to(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="norb")
    assert deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h").returncode == 0
    other = write_profile(tmp_path, sshd, name="second", file="second.yaml")
    assert deploy("up", str(other), "--skip-preflight", home=tmp_path / "h").returncode == 0
    listing = json.loads(oncall(sshd, tmp_path, "status", "--json").stdout)  # every deployment on the host
    assert sorted(r["name"] for r in listing) == ["norb", "second"] and all(r["healthy"] for r in listing)
    assert oncall(sshd, tmp_path, "down", "second").returncode == 0
    res = oncall(sshd, tmp_path, "rollback", "norb")
    assert res.returncode == 7 and "nothing to go back to" in res.stderr and "Traceback" not in res.stderr
    missing = oncall(sshd, tmp_path, "history", "never-deployed")
    assert missing.returncode == 7 and "no deployment 'never-deployed'" in missing.stderr
    oncall(sshd, tmp_path, "down", "norb")


def test_crash_after_ready_restarts_with_backoff_then_crashloop(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="loop", env={"STANDIN_MODE": "crash_after_ready",
                                                          "STANDIN_CRASH_AFTER_S": "0.6"},
                         extra={"restart": {"policy": "on-failure", "max": 2, "backoff_s": [0.2, 0.4],
                                            "window_s": 60, "grace_s": 2}})
    assert deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h").returncode == 0
    row: dict[str, Any] = {}
    for _ in range(60):  # bounded: ~30 s
        row = json.loads(oncall(sshd, tmp_path, "status", "loop", "--json").stdout)
        if row["status"] == "crashloop":
            break
        time.sleep(0.5)
    assert row["status"] == "crashloop", row
    assert row["restarts"] == 2 and row["last_crash"]
    assert row["diagnosis"] and row["diagnosis"]["traceback"]
    offset = sshd.log_offset()
    again = json.loads(oncall(sshd, tmp_path, "status", "loop", "--json").stdout)
    assert again["diagnosis"] == row["diagnosis"]  # the crash's log windows came with the one snapshot
    assert sshd.sessions_since(offset) == Sessions(connections=1, exec=1, sftp=0, shell=0)
    human = oncall(sshd, tmp_path, "status", "loop")
    assert "crashloop" in human.stdout and "restarts 2" in human.stdout


def test_restart_with_an_unreadable_env_file_is_one_error_line(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="badenv", env={"HF_TOKEN": "${SMOKE_SECRET}"})
    up = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h", env={"SMOKE_SECRET": "hf_secret_1"})
    assert up.returncode == 0, up.stderr
    before = json.loads(oncall(sshd, tmp_path, "status", "badenv", "--json").stdout)
    env_file = Path(before["run_dir"]) / "env"
    env_file.write_text("HF_TOKEN='hf_secret_1\n")  # an unclosed quote: not shell words
    res = oncall(sshd, tmp_path, "restart", "badenv")
    assert res.returncode == 4, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: run ") and "not valid shell words" in lines[0]
    assert "Traceback" not in res.stderr and "hf_secret_1" not in res.stderr
    after = json.loads(oncall(sshd, tmp_path, "status", "badenv", "--json").stdout)
    assert after["pid"] == before["pid"] and after["healthy"]  # nothing on the target was touched
    oncall(sshd, tmp_path, "down", "badenv")
