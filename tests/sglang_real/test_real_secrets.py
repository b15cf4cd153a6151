"""Secrets against real SGLang 0.5.23: its parser's credential flags are the engine's secret flags, and the real
parser reads secret values from the env file references of launch.sh while nothing we print carries them."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from deployer.engines.sglang.spec import SGLANG
from deployer.preflight.checks import run_preflight
from deployer.profile.loader import load_profile
from deployer.remote.base import Remote
from deployer.render.bundle import render
from deployer.secrets import is_secret_env_name, mask_data

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("SGLANG_VENV", ROOT / ".cache" / "sglang-venv"))  # as conftest.py finds it
H200_DIR = Path(__file__).resolve().parent / "h200"
MODEL = ROOT / "tests" / "fixtures" / "models" / "qwen3-next-80b-a3b"
CREDENTIAL_HELP = re.compile(r"\b(api key|password|passwd|credentials?|secret|access key|bearer)\b", re.I)
OPTIONS = """
import argparse, json
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
print(json.dumps([[a.dest, a.help or "", a.nargs != 0] for a in parser._actions if a.option_strings]))
"""


def test_the_secret_flags_are_the_real_parsers_credential_flags() -> None:
    out = subprocess.run([str(VENV / "bin" / "python"), "-c", OPTIONS], capture_output=True, text=True,
                         timeout=300, env={"PYTHONPATH": str(H200_DIR), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    options = json.loads(out.stdout.strip().splitlines()[-1])
    credential = {dest for dest, help_text, takes_value in options if takes_value and CREDENTIAL_HELP.search(help_text)}
    assert credential == SGLANG.launch.secret_flags == {"api_key", "admin_api_key", "ssl_keyfile_password"}
    # a word rule over flag names would mask tuning flags: why flags are secret by the engine's list
    by_words = {dest for dest, _, _ in options if is_secret_env_name(dest)} - credential
    assert {"speculative_token_map", "bucket_time_to_first_token"} <= by_words


def test_the_real_parser_reads_secrets_through_the_env_file(h200_host: Any, remote: Remote,
                                                            tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps({
        "name": "realsec", "target": h200_host.target(tmp_path / "work"),
        "engine": {"python": "sglang-python", "model_path": str(MODEL),
                   "args": {"device": "cuda", "api_key": "${REAL_API}", "admin_api_key": "adm-real-literal-55",
                            "speculative_num_draft_tokens": 4, "max_total_tokens": 8192},
                   "env": {"HF_TOKEN": "${REAL_HF}"}}}))
    prof = load_profile(path, environ={"REAL_API": "sk-real-api-0c9f", "REAL_HF": "hf_real_tok_77aa"})
    script = render(prof).script
    # SGLang reads no env var for its keys: the argv shim appends them in memory, by variable name (render/bundle.py)
    shim = '"--api-key", "${DEPLOYER_SECRET_API_KEY}", "--admin-api-key", "${DEPLOYER_SECRET_ADMIN_API_KEY}"'
    assert shim in script and "--api-key" not in script.split("\nexec ", 1)[1], script
    assert "--speculative-num-draft-tokens 4" in script
    report = run_preflight(remote, prof, cache_dir=tmp_path / "cache")
    # the real parser got the real values through the env references (not *** and not the names)
    assert report.rejection is None and report.resolution == "done", report.resolution
    assert report.resolved is not None and report.resolved["api_key"] == "sk-real-api-0c9f"
    assert report.resolved["admin_api_key"] == "adm-real-literal-55"
    shown = json.dumps(mask_data(report.to_json())) + report.render_text()
    for value in ("sk-real-api-0c9f", "adm-real-literal-55", "hf_real_tok_77aa"):
        assert value not in shown and value not in script
    assert report.to_json()["engine_args"]["speculative_num_draft_tokens"] == 4
    assert report.to_json()["engine_args"]["api_key"] == "***"
