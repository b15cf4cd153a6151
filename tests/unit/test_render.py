"""Rendering: argv from args, env file, masking, stable hash; and the property that makes heredoc bugs impossible.

The property test renders profiles full of hostile values, runs the real launch.sh under bash with the engine
python replaced by a probe that records its argv and environment, and checks they are exactly what was asked.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deployer.errors import RenderError
from deployer.profile.model import Profile
from deployer.render.bundle import SECRET_ARGV_VAR, EnvRef, flag_tokens, render, secret_var, sh_word
from deployer.supervisor.base import read_env_file

# The engine python, replaced by a probe that records what it was started with: its cwd and argv as NUL-separated
# bytes, then its environment as `env -0` prints it. A POSIX sh probe costs a fifth of a python one (about 20 ms
# against 100 ms per example on a loaded 2-core machine), which keeps 2000 examples well inside the timeout.
PROBE = """#!/bin/sh
printf '%s\\0' "$PWD" "$@" > "$PROBE_OUT.argv"
exec /usr/bin/env -0 > "$PROBE_OUT.env"
"""
# 2000 examples (HYPOTHESIS_PROFILE=ci), each one bash + the probe: measured 145 s with seven test suites running
# at once on 2 cores (load 9; the python probe took 40 s for 200 examples there, so about 400 s for 2000). The
# suite's 120 s per test fits a quiet machine only; this test gets 4x the measured worst.
PROPERTY_TIMEOUT_S = 600


def make_profile(**engine: Any) -> Profile:
    base: dict[str, Any] = {"name": "t", "target": {"host": "h"},
                            "engine": {"model_path": "m", "python": "/usr/bin/python3"}}
    base["engine"].update(engine)
    return Profile.model_validate(base)


def test_flag_tokens_cover_bool_none_list_dict_and_dash_values() -> None:
    assert flag_tokens("trust_remote_code", True) == ["--trust-remote-code"]
    assert flag_tokens("disable_radix_cache", False) == []
    assert flag_tokens("x", None) == []
    assert flag_tokens("cuda_graph_bs_decode", [1, 2, 4]) == ["--cuda-graph-bs-decode", "1", "2", "4"]
    assert flag_tokens("json_model_override_args", {"b": 1, "a": "x"}) == [
        "--json-model-override-args", '{"a": "x", "b": 1}']
    assert flag_tokens("chat_template", "-weird") == ["--chat-template=-weird"]
    assert flag_tokens("tp_size", 2) == ["--tp-size", "2"]


def test_secrets_stay_out_of_script_and_argv_and_are_masked() -> None:
    prof = make_profile(env={"HF_TOKEN": "hf_supersecret", "PLAIN": "visible"}, gpus=[1, 3])
    bundle = render(prof)
    assert "hf_supersecret" not in bundle.script and "hf_supersecret" not in " ".join(bundle.argv)
    assert "hf_supersecret" in bundle.env
    assert bundle.masked_env["HF_TOKEN"] == "***" and bundle.masked_env["PLAIN"] == "visible"
    assert bundle.masked_env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert bundle.script.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in bundle.script
    assert "\nexec /usr/bin/python3 -m sglang.launch_server --model-path m --host 127.0.0.1 --port 30000" \
        in bundle.script


def test_secret_flags_are_passed_from_the_env_file_not_written_in_launch_sh(tmp_path: Path) -> None:
    from deployer.profile.loader import load_profile

    path = tmp_path / "p.yaml"
    path.write_text("name: t\ntarget: {host: h}\nengine:\n  model_path: m\n  python: /usr/bin/python3\n"
                    "  args:\n    api_key: sk-looks-secret\n    chat_template: ${TEMPLATE}\n    tp_size: 2\n")
    prof = load_profile(path, environ={"TEMPLATE": "tmpl-from-env"})
    assert prof.secret_arg_keys() == {"api_key", "chat_template"}
    bundle = render(prof)
    for value in ("sk-looks-secret", "tmpl-from-env"):
        assert value not in bundle.script and value not in " ".join(bundle.argv) and value in bundle.env
    # SGLang takes its credentials only from argv: the shim appends them in memory (never in launch.sh's argv)
    assert "--api-key" not in bundle.script.split("\nexec ", 1)[1] and "--tp-size 2" in bundle.script
    assert '--api-key "$DEPLOYER_SECRET_API_KEY"' in " ".join(sh_word(w) for w in bundle.shim_words)
    assert bundle.masked_env["DEPLOYER_SECRET_API_KEY"] == "***"
    assert prof.public_dict()["engine"]["args"] == {"api_key": "***", "chat_template": "***", "tp_size": 2}


def test_hash_is_stable_and_tracks_effective_content() -> None:
    a = render(make_profile(args={"tp_size": 1, "dtype": "bf16"}))
    b = render(make_profile(args={"tp_size": 1, "dtype": "bf16"}))
    c = render(make_profile(args={"tp_size": 2, "dtype": "bf16"}))
    d = render(make_profile(args={"tp_size": 1, "dtype": "bf16"}, env={"A": "1"}))
    assert a.content_hash == b.content_hash
    assert len({a.content_hash, c.content_hash, d.content_hash}) == 3


def test_custom_template_relative_to_profile_and_missing_template(tmp_path: Path) -> None:
    (tmp_path / "my.sh.j2").write_text("#!/bin/bash\n# {{ name | shq }}\nexec {{ argv | shjoin }}\n")
    prof = make_profile().model_copy(update={"template": "my.sh.j2"})
    prof._source = tmp_path / "p.yaml"
    assert render(prof).script.startswith("#!/bin/bash\n# t\nexec /usr/bin/python3")
    prof2 = make_profile().model_copy(update={"template": "missing.j2"})
    prof2._source = tmp_path / "p.yaml"
    with pytest.raises(RenderError, match="template not found"):
        render(prof2)
    (tmp_path / "bad.j2").write_text("{{ nonexistent_variable }}")
    prof3 = make_profile().model_copy(update={"template": "bad.j2"})
    prof3._source = tmp_path / "p.yaml"
    with pytest.raises(RenderError, match="nonexistent_variable"):
        render(prof3)


@pytest.mark.parametrize("key", ["a;b", "$(id)", "--", "x y", "", "A_B"])
def test_hostile_flag_names_are_rejected(key: str) -> None:
    with pytest.raises(ValueError):
        make_profile(args={key: "1"})


# --- the property -----------------------------------------------------------------------------------------------

HOSTILE = ["'", '"', "$(touch /tmp/pwned)", "`id`", ";", "&&", "\n", "\\", "\\'", "$HOME", "${PATH}", "-", "--x",
           "*", "?", "~", "!", "#", " ", "\t", "\r", "é", "日本", "🙂", "$'\\n'", "%s", "{{ x }}", "{% if %}", "<<EOF",
           "EOF", ">", "|", "\x1b[31m", "\u202e"]
text = st.lists(st.one_of(st.sampled_from(HOSTILE),
                          st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                                  max_size=8)), max_size=5).map("".join)
scalar = st.one_of(text, st.integers(-10**6, 10**6), st.booleans(),
                   st.floats(allow_nan=False, allow_infinity=False, width=32))
flag_name = st.one_of(st.from_regex(r"\A[a-z][a-z0-9_]{0,12}\Z"),
                      st.sampled_from(["api_key", "admin_api_key", "ssl_keyfile_password"])  # SGLang's secret flags
                      ).filter(lambda k: k not in {"model_path", "port", "host"})
env_name = st.from_regex(r"\AT_[A-Za-z0-9_]{0,10}\Z")

settings.register_profile("ci", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("dev", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("probe") / "python-probe"
    path.write_text(PROBE)
    path.chmod(0o755)
    return path


def expected_tokens(name: str, value: Any) -> list[list[str]]:
    """Independent of render: the argv forms that mean `--name value` to argparse."""
    flag = "--" + name.replace("_", "-")
    if value is True:
        return [[flag]]
    if value is False or value is None:
        return [[]]
    if isinstance(value, list):
        return [[flag, *[str(v).lower() if isinstance(v, bool) else str(v) for v in value]]]
    return [[flag, str(value)], [f"{flag}={value}"]]


def read_probe(out: Path) -> dict[str, Any]:
    """What the probe recorded, decoded as Python decodes argv and environ (UTF-8, surrogateescape)."""
    def text(raw: bytes) -> str:
        return raw.decode("utf-8", "surrogateescape")

    cwd, *argv = [text(a) for a in (out.parent / (out.name + ".argv")).read_bytes().split(b"\0")[:-1]]
    env = dict(text(item).partition("=")[::2] for item in (out.parent / (out.name + ".env")).read_bytes().split(b"\0")
               if item)
    return {"argv": argv, "env": env, "cwd": cwd}


@pytest.mark.timeout(PROPERTY_TIMEOUT_S)
@pytest.mark.slow("2000 hostile profiles under HYPOTHESIS_PROFILE=ci, each rendered and run by bash into a probe")
@settings(settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev")))
@given(args=st.dictionaries(flag_name, st.one_of(scalar, st.lists(text, min_size=1, max_size=3)), max_size=6),
       env=st.dictionaries(env_name, text, max_size=6), model=text.filter(bool),
       name=st.from_regex(r"\A[a-z0-9][a-z0-9-]{0,20}\Z"))
def test_launch_script_passes_hostile_values_exactly(tmp_path_factory: pytest.TempPathFactory, probe: Path,
                                                     args: dict[str, Any], env: dict[str, str], model: str,
                                                     name: str) -> None:
    prof = Profile.model_validate({"name": name, "target": {"host": "h"},
                                   "engine": {"model_path": model, "python": str(probe), "args": args, "env": env}})
    bundle = render(prof)
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / "launch.sh").write_text(bundle.script, encoding="utf-8")
    (run_dir / "env").write_text(bundle.env, encoding="utf-8")
    out = run_dir / "probe"
    loaded = read_env_file(str(run_dir / "env"))
    hidden = [w for w in bundle.shim_words if isinstance(w, EnvRef)]  # the shim's: read from the env file
    secret_words = [w.name for w in [*bundle.words, *hidden] if isinstance(w, EnvRef)] + \
        ([SECRET_ARGV_VAR] if bundle.shim_words else [])
    assert {k: v for k, v in loaded.items() if k not in secret_words} == env
    assert set(loaded) - set(env) == set(secret_words)
    base = {"PATH": "/usr/bin:/bin", "PROBE_OUT": str(out), "LC_ALL": "C.UTF-8"}
    proc = subprocess.run(["bash", str(run_dir / "launch.sh")], env={**base, **loaded}, cwd="/",
                          capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    seen = read_probe(out)
    concrete = [w.prefix + loaded[w.name] if isinstance(w, EnvRef) else w for w in bundle.words]
    shim = bundle.shim_words
    shimmed = [w.prefix + loaded[w.name] if isinstance(w, EnvRef) else w for w in shim]
    assert seen["argv"] == concrete[1:]
    assert seen["cwd"] == str(run_dir)
    for key, value in env.items():
        assert seen["env"][key] == value
    for key in prof.secret_arg_keys():  # values of secret-looking flags never stand in launch.sh
        value = args[key]
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            assert any(word.endswith(f"${{{secret_var(key)}}}") for word in [*bundle.argv, *map(str, shim)])
    argv = seen["argv"]
    if argv[:1] == ["-c"]:  # SGLang's credentials: the shim appends them to the module's argv, in memory
        told = json.loads(loaded[SECRET_ARGV_VAR])
        assert [w if isinstance(w, str) else w[0] + loaded[w[1]] for w in told] == shimmed
        argv = ["-m", *argv[2:], *shimmed]
    assert argv[:2] == ["-m", "sglang.launch_server"]
    assert ["--model-path", model] in windows(argv, 2) or [f"--model-path={model}"] in windows(argv, 1)
    for key, value in args.items():
        forms = expected_tokens(key, value)
        assert any(form == [] or form in windows(argv, len(form)) for form in forms), (key, value, argv)


def windows(items: list[str], size: int) -> list[list[str]]:
    return [items[i:i + size] for i in range(len(items) - size + 1)]
