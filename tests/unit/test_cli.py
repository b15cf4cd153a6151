"""The CLI's offline commands: render, schema, validate --json, diagnose --log; and its error contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "cases" / "sglang"


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deployer.cli", *argv], capture_output=True, text=True,
                          timeout=60, env={"PATH": os.environ["PATH"], **(env or {})}, cwd=str(REPO))


def test_render_prints_the_script_and_json_bundle_masks_secrets() -> None:
    env = {"HF_TOKEN": "hf_cli_secret"}
    text = cli("render", "profiles/qwen36-mtp.yaml", env=env)
    assert text.returncode == 0 and text.stdout.startswith("#!/usr/bin/env bash")
    assert "--mamba-scheduler-strategy extra_buffer" in text.stdout and "hf_cli_secret" not in text.stdout
    bundle = json.loads(cli("render", "profiles/qwen36-mtp.yaml", "--json", "--set", "engine.args.tp_size=2",
                            env=env).stdout)
    assert bundle["argv"][:3] == ["/workspace/venv/bin/python", "-m", "sglang.launch_server"]
    assert "--tp-size" in bundle["argv"] and bundle["argv"][bundle["argv"].index("--tp-size") + 1] == "2"
    assert bundle["env"]["HF_TOKEN"] == "***" and len(bundle["content_hash"]) == 64


def test_schema_is_a_json_schema_of_the_profile() -> None:
    schema = json.loads(cli("schema").stdout)
    assert set(schema["required"]) >= {"name", "target", "engine"}
    assert schema["$defs"]["Engine"]["additionalProperties"] is False


def test_validate_json_masks_secrets() -> None:
    out = cli("validate", "profiles/llama33-70b-tp2.yaml", "--json", env={"HF_TOKEN": "hf_x"})
    data = json.loads(out.stdout)
    assert data["engine"]["args"]["tp_size"] == 2 and data["engine"]["env"]["HF_TOKEN"] == "***"


def test_diagnose_log_offline_json_contract() -> None:
    out = cli("diagnose", "--log", str(CASES / "mamba-spec-needs-extra-buffer.log"), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) >= {"signature", "summary", "transient", "evidence", "traceback", "remedy"}
    assert data["signature"] == "mamba-spec-needs-extra-buffer" and data["transient"] is False
    assert data["remedy"] == {"args": {"mamba_scheduler_strategy": "extra_buffer"},
                              "env": {"SGLANG_ENABLE_SPEC_V2": "1"},
                              "reason": "mamba_scheduler_strategy: (engine default) -> extra_buffer; "
                                        "SGLANG_ENABLE_SPEC_V2=1"}
    human = cli("diagnose", "--log", str(CASES / "mamba-spec-needs-extra-buffer.log"))
    assert "signature: mamba-spec-needs-extra-buffer" in human.stdout


def test_diagnose_json_shows_a_rename_as_removal_plus_new_name() -> None:
    """Real 0.5.23 argparse output: the old flag maps to null, the new one carries the value."""
    out = cli("diagnose", "--log", str(CASES / "unrecognized-arguments.log"), "--json", "--engine-version", "0.5.23")
    assert out.returncode == 0, out.stderr
    remedy = json.loads(out.stdout)["remedy"]
    assert remedy["args"] == {"mamba_scheduler_strategy": None, "mamba_radix_cache_strategy": "extra_buffer"}


def test_diagnose_unknown_log_still_exits_0_and_missing_file_exits_2(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nKeyError: 'zz'\n")
    data = json.loads(cli("diagnose", "--log", str(log), "--json").stdout)
    assert data["signature"] is None and data["summary"].startswith("unknown failure")
    missing = cli("diagnose", "--log", str(tmp_path / "nope.log"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_name_commands_need_a_host_and_say_so() -> None:
    out = cli("status", "demo")
    assert out.returncode == 2 and out.stderr.startswith("error: give --host") and "Traceback" not in out.stderr


def test_help_lists_every_command() -> None:
    out = cli("--help")
    for command in ("up", "status", "logs", "down", "restart", "rollback", "history", "diagnose", "plan",
                    "validate", "render", "schema"):
        assert f"  {command} " in out.stdout, command
