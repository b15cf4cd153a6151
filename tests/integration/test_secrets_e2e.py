"""Secrets end to end over the real sshd: nothing deployer writes or prints carries a secret value, `${VAR}` items of
list args go through the env file and survive restart, and retention takes old secrets off the target."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, events, write_profile

pytestmark = pytest.mark.integration

SECRETS = {
    "CYCLE_HF": "hf_cycle_token_4f1d9e",          # engine.env.HF_TOKEN: ${CYCLE_HF}
    "CYCLE_API": "sk-cycle-api-7b2c5a",            # engine.args.api_key: ${CYCLE_API}
    "CYCLE_LORA": "adapter-b=/secret/lora-9d3e1f",  # second item of engine.args.lora_paths: ${CYCLE_LORA}
}
LITERAL_SECRETS = {"admin": "adm-literal-6e0f2b", "env": "literal-password-81c4d7"}
ALL_VALUES = [*SECRETS.values(), *LITERAL_SECRETS.values()]


def oncall(sshd: Any, tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> Any:
    return deploy(*argv, "--host", "deployer-test", "--workdir", str(tmp_path / "work"),
                  home=tmp_path / "laptop", env={"DEPLOYER_SSH_CONFIG": str(sshd.ssh_config), **(env or {})})


def cycle_profile(tmp_path: Path, sshd: Any, name: str = "sec") -> Path:
    return write_profile(tmp_path, sshd, name=name,
                         env={"HF_TOKEN": "${CYCLE_HF}", "DB_PASSWORD": LITERAL_SECRETS["env"],
                              "MAX_TOTAL_TOKENS_HINT": "4096"},
                         args={"api_key": "${CYCLE_API}", "admin_api_key": LITERAL_SECRETS["admin"],
                               "lora_paths": ["adapter-a=/models/lora-plain", "${CYCLE_LORA}"],
                               "max_total_tokens": 8192, "speculative_num_draft_tokens": 4,
                               "tokenizer_mode": "auto"})


def written_files(root: Path) -> dict[Path, bytes]:
    """Every file under `root` except the run dirs' 0600 env files and the engine's own output."""
    out = {}
    for path in root.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        if path.name == "env":
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            continue
        if path.name == "engine.log":
            continue
        out[path] = path.read_bytes()
    return out


def test_nothing_deployer_writes_or_prints_carries_a_secret(tmp_path: Path, sshd: Any) -> None:
    prof = cycle_profile(tmp_path, sshd)
    home = tmp_path / "home"
    outputs: list[tuple[str, Any]] = []

    def run(*argv: str, **kw: Any) -> Any:
        res = deploy(*argv, home=home, env={**SECRETS, "DEPLOYER_SSH_CONFIG": str(sshd.ssh_config)}, **kw)
        outputs.append((" ".join(argv), res))
        return res

    up = run("up", str(prof))  # people's output: live phases with the engine's lines, then the report
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    assert "ready" in up.stdout + up.stderr
    target = ["--host", "deployer-test", "--workdir", str(tmp_path / "work")]
    for argv in (["status", "sec"], ["status", "sec", "--json"], ["logs", "sec", "-n", "500"],
                 ["history", "sec"], ["history", "sec", "--json"], ["history", "sec", "--local", "--json"],
                 ["restart", "sec", "--json"], ["logs", "sec", "-n", "500", "--previous"],
                 ["diagnose", "sec", "--json"]):
        run(*argv, *target)
    plan = run("plan", str(prof), "--json")
    assert plan.stdout.strip().startswith("{"), plan.stderr
    restarted = events(outputs[7][1].stdout)[-1]
    assert restarted["status"] == "ready", outputs[7][1].stderr
    run("down", "sec", *target)

    work = tmp_path / "work" / "sec"
    runs = sorted((work / "runs").iterdir())
    log = (runs[-1] / "engine.log").read_text()
    # The engine itself printed every secret (its args dump): what we show of that log must not.
    assert all(value in log for value in (SECRETS["CYCLE_API"], LITERAL_SECRETS["admin"], SECRETS["CYCLE_LORA"]))
    logs_out = outputs[3][1].stdout
    assert "server_args=" in logs_out and "'api_key': '***'" in logs_out
    assert re.search(r"'max_total_tokens': '?8192", logs_out) and "'speculative_num_draft_tokens': 4" in logs_out

    # the restarted engine ran with the real values, not with ***
    assert "'api_key': '***'" not in log and SECRETS["CYCLE_LORA"] in log
    env_text = (runs[-1] / "env").read_text()
    assert f"DEPLOYER_SECRET_LORA_PATHS_1={SECRETS['CYCLE_LORA']!s}" in env_text.replace("'", "")
    script = (runs[-1] / "launch.sh").read_text()
    # SGLang's secret flags reach its argv through the shim (render/bundle.py ARGV_SHIM), never launch.sh's argv
    assert '"--lora-paths", "adapter-a=/models/lora-plain", ["", "DEPLOYER_SECRET_LORA_PATHS_1"]' in \
        env_text.replace("'", "") and "--lora-paths" not in script.split("\nexec ", 1)[1]
    assert "--max-total-tokens 8192" in script and "--speculative-num-draft-tokens 4" in script
    assert "--tokenizer-mode auto" in script
    record = json.loads((runs[-1] / "profile.json").read_text())["profile"]["engine"]
    assert record["args"]["max_total_tokens"] == 8192 and record["env"]["MAX_TOTAL_TOKENS_HINT"] == "4096"

    files = written_files(tmp_path / "work") | written_files(home) | written_files(tmp_path / "laptop")
    assert any(p.name == "history.sqlite3" for p in files) and any(p.name == "outcome.json" for p in files)
    for value in ALL_VALUES:
        for path, data in files.items():
            assert value.encode() not in data, f"{value} in {path}"
        for what, res in outputs:
            assert value not in res.stdout and value not in res.stderr, f"{value} printed by {what}"


def test_validate_and_render_need_no_secret_but_up_does(tmp_path: Path, sshd: Any) -> None:
    prof = cycle_profile(tmp_path, sshd, name="nosec")
    for command in ("validate", "render"):
        res = deploy(command, str(prof), home=tmp_path / "h")
        assert res.returncode == 0, res.stderr
        assert "${CYCLE_HF} is not set here" in res.stderr and "${CYCLE_LORA} is not set here" in res.stderr
    rendered = deploy("render", str(prof), home=tmp_path / "h").stdout
    assert "--speculative-num-draft-tokens 4" in rendered and '"--api-key", "${DEPLOYER_SECRET_API_KEY}"' in rendered
    for command in (["up", str(prof)], ["smoke", str(prof)]):
        res = deploy(*command, home=tmp_path / "h")
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
        assert "is not set in the local environment" in errors[0]
    assert not (tmp_path / "work" / "nosec").exists()


def _up(tmp_path: Path, sshd: Any, prof: Path, *sets: str, env: dict[str, str] | None = None) -> Any:
    argv = ["up", str(prof), "--skip-preflight"]
    for item in sets:
        argv += ["--set", item]
    return deploy(*argv, home=tmp_path / "h", env={**SECRETS, **(env or {})})


def _runs(tmp_path: Path, name: str) -> list[Path]:
    return sorted((tmp_path / "work" / name / "runs").iterdir())


@pytest.mark.slow("five ups (four versions, then one that crashes at start), a down, three prunes and a rollback")
def test_retention_drops_old_secrets_and_prune_keeps_what_restart_and_rollback_need(tmp_path: Path,
                                                                                    sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="ret", env={"HF_TOKEN": "${CYCLE_HF}"},
                         extra={"retention": {"keep_runs": 3}})
    for n in range(4):
        assert _up(tmp_path, sshd, prof, f"engine.args.max_running_requests={10 + n}").returncode == 0
    # stopped first: a failed up over a serving version brings that version back (current would not move)
    assert oncall(sshd, tmp_path, "down", "ret").returncode == 0
    bad = _up(tmp_path, sshd, prof, "engine.env.STANDIN_MODE=crash", "retry.max_attempts=1")
    assert bad.returncode == 5
    runs = _runs(tmp_path, "ret")
    current = (tmp_path / "work" / "ret" / "current").resolve()
    # 5 ups, keep_runs 3: the failed current, the newest ready, rollback's target (the same here) are kept
    assert len(runs) == 3 and current == runs[-1]
    with_env = [r.name for r in runs if (r / "env").exists()]
    # newest ready (rollback's target); the failed current never reached ready: its secrets go (issue 35 item 5)
    assert with_env == [runs[-2].name]

    missing = oncall(sshd, tmp_path, "prune", "no-such-deployment")
    assert missing.returncode == 7 and "no deployment 'no-such-deployment'" in missing.stderr
    dry = oncall(sshd, tmp_path, "prune", "ret", "--keep", "1", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["delete"] == [runs[0].name] and plan["dry_run"] is True
    assert plan["protected"] == {runs[-1].name: "current", runs[-2].name: "newest run that reached ready"}
    assert _runs(tmp_path, "ret") == runs
    text = oncall(sshd, tmp_path, "prune", "ret", "--keep", "1")
    assert text.returncode == 0 and f"deleted run {runs[0].name}" in text.stdout
    assert f"kept run {runs[-2].name}: newest run that reached ready" in text.stdout
    assert _runs(tmp_path, "ret") == runs[1:]

    # rollback needs the secret: from the kept env file (no local variable needed)
    back = oncall(sshd, tmp_path, "rollback", "ret", "--json")
    assert back.returncode == 0, back.stderr
    assert events(back.stdout)[-1]["status"] == "ready"
    assert SECRETS["CYCLE_HF"] not in back.stdout + back.stderr


def test_restart_without_the_env_file_takes_var_from_here_or_refuses_in_one_line(tmp_path: Path,
                                                                                  sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="rv", env={"HF_TOKEN": "${CYCLE_HF}"},
                         args={"lora_paths": ["plain-a", "${CYCLE_LORA}"]})
    assert _up(tmp_path, sshd, prof).returncode == 0
    run = _runs(tmp_path, "rv")[-1]
    os.unlink(run / "env")  # as if pruned
    refused = oncall(sshd, tmp_path, "restart", "rv")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "is not set here" in refused.stderr and "export CYCLE_" in refused.stderr
    assert _runs(tmp_path, "rv") == [run]  # nothing changed on the target
    ok = oncall(sshd, tmp_path, "restart", "rv", "--json", env=SECRETS)
    assert ok.returncode == 0, ok.stderr
    new = _runs(tmp_path, "rv")[-1]
    assert new != run and SECRETS["CYCLE_LORA"] in (new / "env").read_text()
    assert SECRETS["CYCLE_LORA"] in (new / "engine.log").read_text()  # the engine got the value, not ***
    oncall(sshd, tmp_path, "down", "rv")
