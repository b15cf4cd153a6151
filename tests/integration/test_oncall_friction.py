"""Issue 24's on-call friction over the real sshd test bed: a NAME without --host/--workdir when the local history
knows it, `deploy ls`, `history --local` of everything, the config file's defaults and `deploy config`, diagnose
of an old failure of a deployment that is healthy now, `diagnose nosuch`, status text with its diagnosis."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, write_profile

pytestmark = pytest.mark.integration


def _xdg(tmp_path: Path, text: str) -> dict[str, str]:
    (tmp_path / "xdg" / "deployer").mkdir(parents=True, exist_ok=True)
    (tmp_path / "xdg" / "deployer" / "config.yaml").write_text(text)
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def test_a_name_the_local_history_knows_needs_no_host_and_ls_lists_it(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="known", workdir=tmp_path / "w1")
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0

    st = deploy("status", "known", "--json", home=home)
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["healthy"]
    assert st.stderr.count("\n") == 1 and "from the local history" in st.stderr
    assert f"workdir {tmp_path / 'w1'}" in st.stderr and f"host {sshd.user}@" in st.stderr
    assert deploy("logs", "known", "-n", "3", home=home).returncode == 0

    rows = json.loads(deploy("ls", "--json", home=home).stdout)
    assert [(r["name"], r["workdir"], r["state"]) for r in rows] == [("known", str(tmp_path / "w1"), "ready")]
    assert rows[0]["host"].endswith(f":{sshd.port}") and len(rows[0]["version"]) >= 12
    text = deploy("ls", home=home).stdout
    assert text.splitlines()[0].split() == ["NAME", "HOST", "WORKDIR", "VERSION", "STATE", "WHEN"]
    assert "known" in text and rows[0]["version"][:12] in text
    live = json.loads(deploy("ls", "--live", "--json", home=home).stdout)
    assert live[0]["live"] == {"status": "ready", "healthy": True, "error": None}

    every = deploy("history", "--local", "--json", home=home)  # no NAME: every deployment's attempts
    assert every.returncode == 0 and [r["deployment"] for r in json.loads(every.stdout)] == ["known"]
    assert "known on " in deploy("history", "--local", home=home).stdout

    # the same name in a second workdir: ambiguous, one line listing both, exit 2
    other = write_profile(tmp_path, sshd, name="known", workdir=tmp_path / "w2", file="known2.yaml")
    assert deploy("up", str(other), "--skip-preflight", home=home).returncode == 0
    both = deploy("status", "known", home=home)
    assert both.returncode == 2 and both.stderr.count("\n") == 1, both.stderr
    assert str(tmp_path / "w1") in both.stderr and str(tmp_path / "w2") in both.stderr
    picked = deploy("status", "known", "--workdir", str(tmp_path / "w2"), "--json", home=home)
    assert picked.returncode == 0 and str(tmp_path / "w2") in json.loads(picked.stdout)["run_dir"]
    assert len(json.loads(deploy("ls", "--json", home=home).stdout)) == 2
    for path in (prof, other):
        assert deploy("down", str(path), home=home).returncode == 0

    nothing = deploy("ls", home=tmp_path / "fresh")
    assert nothing.returncode == 0 and "no deployments" in nothing.stdout
    unknown = deploy("status", "never", home=tmp_path / "fresh")
    assert unknown.returncode == 2 and "give --host" in unknown.stderr


def test_config_file_defaults_and_deploy_config(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="cfg", workdir=tmp_path / "cw")
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    ssh = {"DEPLOYER_SSH_CONFIG": str(sshd.ssh_config)}
    env = {**ssh, **_xdg(tmp_path, f"host: deployer-test\nworkdir: {tmp_path / 'cw'}\n")}
    fresh = tmp_path / "laptop"  # no local history: the config file's host and workdir
    st = deploy("status", "cfg", "--json", home=fresh, env=env)
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["healthy"]

    shown = json.loads(deploy("config", "--json", home=fresh, env=env).stdout)
    config_file = str(tmp_path / "xdg" / "deployer" / "config.yaml")
    assert shown["config_file"] == config_file and shown["exists"]
    sources = {s["name"]: (s["value"], s["source"]) for s in shown["settings"]}
    assert sources == {"host": ("deployer-test", f"config {config_file}:1"),
                       "workdir": (str(tmp_path / "cw"), f"config {config_file}:2"),
                       "engine_python": ("python3", "built-in")}
    over = json.loads(deploy("config", "--json", "--workdir", "/x", home=fresh,
                             env={**env, "DEPLOYER_HOST": "other-box"}).stdout)
    sources = {s["name"]: (s["value"], s["source"]) for s in over["settings"]}
    assert sources["host"] == ("other-box", "env DEPLOYER_HOST") and sources["workdir"] == ("/x", "--workdir")

    # a profile: its own values above the config file's, the environment above the profile
    with_prof = json.loads(deploy("config", str(prof), "--json", home=fresh,
                                  env={**env, "DEPLOYER_ENGINE_PYTHON": "/opt/py"}).stdout)
    sources = {s["name"]: (s["value"], s["source"]) for s in with_prof["settings"]}
    assert sources["workdir"][1].startswith(f"profile {prof}:")
    assert sources["engine_python"] == ("/opt/py", "env DEPLOYER_ENGINE_PYTHON")
    text = deploy("config", home=fresh, env=env).stdout
    assert f"config file: {config_file}" in text and f"from config {config_file}:1" in text

    bad = deploy("status", "cfg", home=fresh, env={**ssh, **_xdg(tmp_path, "host: a\nworkdri: /w\n")})
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert f"{config_file}:2: unknown key 'workdri' (did you mean 'workdir'?)" in bad.stderr
    assert "Traceback" not in bad.stderr
    syntax = deploy("config", home=fresh, env=_xdg(tmp_path, "host: [a\n"))
    assert syntax.returncode == 2 and f"{config_file}:" in syntax.stderr and "YAML" in syntax.stderr
    assert deploy("down", str(prof), home=home).returncode == 0


def test_diagnose_says_which_run_failed_and_that_the_deployment_is_healthy_now(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    env_crash = {"STANDIN_MODE": "crash_after_ready", "STANDIN_CRASH_AFTER_S": "0.5"}
    bad = write_profile(tmp_path, sshd, name="imadiag", env=env_crash, file="bad.yaml",
                        extra={"restart": {"policy": "no", "grace_s": 2}})
    assert deploy("up", str(bad), "--skip-preflight", home=home).returncode == 0
    row: dict[str, Any] = {}
    for _ in range(40):  # bounded: ~20 s
        row = json.loads(deploy("status", str(bad), "--json", home=home).stdout)
        if row["status"] == "exited":
            break
        time.sleep(0.5)
    assert row["status"] == "exited" and row["diagnosis"]["signature"] == "cuda-illegal-memory-access", row
    human = deploy("status", str(bad), home=home)
    assert "  diagnosis: cuda-illegal-memory-access: " in human.stdout and "  next: " in human.stdout
    crashed = deploy("diagnose", str(bad), home=home).stdout
    assert "signature: cuda-illegal-memory-access" in crashed and "next:      " in crashed
    assert "now:       this is the current run: exited, not healthy now" in crashed

    good = write_profile(tmp_path, sshd, name="imadiag", port=row["port"])
    assert deploy("up", str(good), "--skip-preflight", home=home).returncode == 0
    old = deploy("diagnose", str(good), home=home)
    assert old.returncode == 0, old.stderr
    assert f"run:       {Path(row['run_dir']).name} failed at " in old.stdout and " ago)" in old.stdout
    assert "healthy now (the failure above is history)" in old.stdout
    data = json.loads(deploy("diagnose", str(good), "--json", home=home).stdout)
    assert data["run_id"] == Path(row["run_dir"]).name and data["now"]["healthy"]
    assert isinstance(data["failed_at"], float) and data["failed_at"] <= time.time()

    nosuch = deploy("diagnose", "nosuch", "--host", "deployer-test", "--workdir", str(tmp_path / "work"),
                    home=home, env={"DEPLOYER_SSH_CONFIG": str(sshd.ssh_config)})
    assert nosuch.returncode == 7 and "no deployment 'nosuch'" in nosuch.stderr, nosuch.stderr
    assert deploy("down", str(good), home=home).returncode == 0


def test_up_says_how_to_reach_the_server_and_logs_grep_since_json(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="reach", args={"api_key": "${REACH_KEY}"})
    up = deploy("up", str(prof), "--skip-preflight", home=home, env={"REACH_KEY": "sk-reach-secret"})
    assert up.returncode == 0, up.stderr
    port = json.loads(deploy("status", str(prof), "--json", home=home).stdout)["port"]
    tunnel = f"ssh -N -L {port}:127.0.0.1:{port} -p {sshd.port} {sshd.user}@{sshd.host} &"
    assert f"reach it through an SSH tunnel (it listens on 127.0.0.1 of the box): {tunnel}" in up.stderr
    assert f'curl -H "Authorization: Bearer $API_KEY" http://127.0.0.1:{port}/v1/models' in up.stderr
    assert '"model": "Qwen/Qwen3-8B"' in up.stderr and "sk-reach-secret" not in up.stderr
    report = json.loads(deploy("up", str(prof), "--skip-preflight", "--json", home=home,
                               env={"REACH_KEY": "sk-reach-secret"}).stdout.splitlines()[-1])
    assert report["status"] == "already-running"
    assert report["reach"]["url"] == f"http://127.0.0.1:{port}/v1" and report["reach"]["ssh_tunnel"] == tunnel[:-2]

    every = deploy("logs", str(prof), "-n", "200", home=home).stdout.splitlines()
    ready = [line for line in every if "ready to roll" in line]
    assert ready
    got = deploy("logs", str(prof), "--grep", r"ready to r.ll", home=home)
    assert got.returncode == 0 and got.stdout.splitlines() == ready
    first_timed = next(i for i, line in enumerate(every) if line.startswith("[20"))
    assert first_timed > 0  # the stand-in's first lines carry no time: --since cannot place them
    for since in ("10m", "2000-01-01"):
        assert deploy("logs", str(prof), "--since", since, home=home).stdout.splitlines() == every[first_timed:]
    future = deploy("logs", str(prof), "--since", "2999-01-01 00:00", home=home)
    assert future.returncode == 0 and future.stdout == ""
    rows = [json.loads(line) for line in deploy("logs", str(prof), "--json", "-n", "5", home=home).stdout.splitlines()]
    assert len(rows) == 5 and all(set(r) == {"line", "time"} for r in rows)
    assert [r["line"] for r in rows] == every[-5:]
    timed = [r for r in rows if r["time"]]
    assert timed and all(r["time"][:10] in r["line"] for r in timed)
    for bad in (["--grep", "(unclosed"], ["--since", "ten minutes"]):
        res = deploy("logs", str(prof), *bad, home=home)
        assert res.returncode == 2 and "Traceback" not in res.stderr and bad[0] in res.stderr, res.stderr
    assert deploy("down", str(prof), home=home).returncode == 0
