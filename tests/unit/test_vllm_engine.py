"""vLLM engine data and hooks: registry, argv, the real parser's acceptance of our argv (stand-in table),
the `non-default args` dump for drift (and its masking), version probe text, phases."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deployer.diagnose.drift import compare, masked, parse_args_dump
from deployer.engines import engine_for
from deployer.engines import kinds
from deployer.preflight.facts import version_py
from deployer.box.tokenprobe import probe_config
from deployer.profile.model import Profile
from deployer.render.bundle import EnvRef, engine_argv, render

STANDIN = Path(__file__).resolve().parents[1] / "standin"
VLLM = engine_for("vllm")
DUMP_033 = ("(APIServer pid=812) INFO 11-30 23:52:55 [launcher.py:368] non-default args: {'host': '127.0.0.1', "
            "'port': 8000, 'api_key': '***', 'model': 'Qwen/Qwen3-8B', 'max_model_len': 4000, "
            "'enable_prefix_caching': False, 'served_model_name': ['qwen3-8b'], "
            "'compilation_config': {'level': 3, 'cudagraph_capture_sizes': [1, 2, 4]}}\n")
DUMP_OLD = ("INFO 06-01 10:00:00 [api_server.py:1077] non-default args: {'api_key': ['sk-live-0001'], "
            "'hf_token': 'hf_abcdef', 'model': 'Qwen/Qwen3-8B', 'max_model_len': 8192}\n")


def profile(args: dict[str, Any] | None = None, **engine: Any) -> Profile:
    return Profile.model_validate({
        "name": "v", "target": {"host": "local", "workdir": "/tmp/x"},
        "engine": {"kind": "vllm", "python": "/opt/venv/bin/python", "model_path": "Qwen/Qwen3-8B", "port": 8000,
                   "args": args or {}, **engine}})


def test_registry_knows_both_engines_and_nothing_else() -> None:
    assert kinds() == ("sglang", "vllm")
    assert VLLM.launch.module == "vllm.entrypoints.openai.api_server" and VLLM.launch.health_path == "/health"
    with pytest.raises(KeyError):
        engine_for("tgi")


def test_argv_names_the_model_with_model_and_secrets_come_from_the_env() -> None:
    p = profile({"max_model_len": 32768, "enable_prefix_caching": False, "api_key": "sk-1", "hf_token": "hf_2",
                 "served_model_name": ["qwen3-8b"]})
    argv = engine_argv(p)
    assert argv[:5] == ["/opt/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Qwen3-8B"]
    # the API key: vLLM reads VLLM_API_KEY (Launch.secret_env), so not even a reference to it is an argv word
    assert "--model-path" not in argv and "--api-key" not in argv and not any("API_KEY" in str(w) for w in argv)
    assert argv[argv.index("--hf-token") + 1] == EnvRef("DEPLOYER_SECRET_HF_TOKEN")   # a literal in the profile too
    bundle = render(p)
    assert "sk-1" not in bundle.script and "hf_2" not in bundle.script and "VLLM_API_KEY=sk-1\n" in bundle.env
    assert "vllm.entrypoints.openai.api_server" in bundle.script
    assert bundle.masked_env["VLLM_API_KEY"] == "***" == bundle.masked_env["DEPLOYER_SECRET_HF_TOKEN"]
    assert probe_config(p)["api_key_env"] == "VLLM_API_KEY"   # the supervisor's probe finds it there


def test_rendered_argv_is_accepted_by_the_parser_table_of_vllm_0_33_0() -> None:
    """The argv we render, fed to the parser built from the real 0.33.0 table (stand-in), parses as asked."""
    p = profile({"max_model_len": 32768, "gpu_memory_utilization": 0.9, "enable_prefix_caching": False,
                 "served_model_name": ["a", "b"], "compilation_config": {"level": 3}, "dtype": "half"})
    words = [str(w) for w in engine_argv(p)[3:]]
    code = ("import json,sys\n"
            "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
            "from vllm.entrypoints.common.cli_args import make_arg_parser\n"
            "a = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])\n"
            "print(json.dumps({k: getattr(a, k) for k in ('model', 'port', 'max_model_len', 'gpu_memory_utilization',"
            " 'enable_prefix_caching', 'served_model_name', 'compilation_config', 'dtype')}))\n")
    out = subprocess.run([sys.executable, "-c", code, *words], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(STANDIN), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    assert json.loads(out.stdout) == {"model": "Qwen/Qwen3-8B", "port": 8000, "max_model_len": 32768,
                                      "gpu_memory_utilization": 0.9, "enable_prefix_caching": False,
                                      "served_model_name": ["a", "b"], "compilation_config": {"level": 3},
                                      "dtype": "half"}


def test_non_default_args_dump_is_parsed_for_drift() -> None:
    dump = parse_args_dump("some line\n" + DUMP_033, VLLM.log.args_dump)
    assert dump is not None and dump["max_model_len"] == 4000 and dump["compilation_config"]["level"] == 3
    assert parse_args_dump(DUMP_033, engine_for("sglang").log.args_dump) is None  # SGLang's marker does not read vLLM's dump
    drifts = compare({"max_model_len": "4k", "gpu_memory_utilization": 0.92, "enable_prefix_caching": False},
                     dump, VLLM.knowledge.value_aliases, complete=VLLM.log.args_dump_complete)
    # 0.92 is the default (absent from a non-default dump): not "unknown"; 4k became 4000: drift
    assert [d.describe() for d in drifts] == ["asked max_model_len=4k, engine resolved 4000"]
    strict = compare({"gpu_memory_utilization": 0.92}, dump)
    assert [d.kind for d in strict] == ["unknown"]  # a complete dump (SGLang's) would call it unknown


def test_old_vllm_prints_secrets_in_clear_and_they_are_masked() -> None:
    dump = parse_args_dump(DUMP_OLD, VLLM.log.args_dump)
    assert dump is not None and dump["api_key"] == ["sk-live-0001"]
    clean = masked(dump, VLLM.launch.secret_flags)
    assert clean["api_key"] == "***" and clean["hf_token"] == "***" and clean["max_model_len"] == 8192
    line = VLLM.masked(DUMP_OLD)
    assert "sk-live-0001" not in line and "hf_abcdef" not in line and "'max_model_len': 8192" in line
    assert VLLM.masked("api_key: sk-live-0001 (not the dump)") == "api_key: sk-live-0001 (not the dump)"


def test_phases_follow_the_startup_log_in_order() -> None:
    log = (STANDIN.parent / "cases" / "vllm" / "kv-cache-too-small.log").read_text()
    seen = [VLLM.log.phase_of(line) for line in log.splitlines()]
    assert [p for p in seen if p][:3] == ["args", "loading weights", "weights loaded"]
    assert VLLM.log.phase_of("INFO 06-01 10:00:00 [api_server.py:1077] Starting vLLM API server on http://0.0.0.0:8000") \
        == "http up"
    assert VLLM.log.phase_of("INFO:     Application startup complete.") == "ready"


@pytest.mark.parametrize("kind, version", [("vllm", "0.31.2"), ("sglang", "0.5.21")])
def test_version_probe_asks_the_engines_own_distribution(kind: str, version: str) -> None:
    """Run for real against the stand-ins (not installed: the import fallback answers), each with a version that
    only that stand-in reports."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(STANDIN), "STANDIN_VLLM_VERSION": "0.31.2",
           "STANDIN_SGLANG_VERSION": "0.5.21"}
    out = subprocess.run([sys.executable, "-c", version_py(engine_for(kind).install)], env=env,
                         capture_output=True, text=True, timeout=30, check=True).stdout
    assert f"@@engine {version}" in out.splitlines()


def test_flag_table_was_generated_from_the_real_parser() -> None:
    import json

    table = json.loads((STANDIN / "vllm/entrypoints/openai/flags_0_33_0.json").read_text())
    assert table["vllm_version"] == "0.33.0" and "make_arg_parser" in table["source"]
    dests = {r["dest"] for r in table["actions"]}
    assert {"model", "model_tag", "max_model_len", "gpu_memory_utilization", "api_key", "max_num_seqs"} <= dests
    assert argparse.SUPPRESS in {r["default"] for r in table["actions"] if isinstance(r["default"], str)}
