"""Secrets are secrets, nothing else: the rules, masking, and the real SGLang 0.5.23 flag table."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from deployer.engines import engine_for
from deployer.diagnose.drift import compare
from deployer.engines.sglang.spec import SGLANG
from deployer.profile.model import Profile
from deployer.profile.loader import load_profile
from deployer.render.bundle import render, sh_word
from deployer.operate.secret_restore import Restorer, SecretUnavailable
from deployer.secrets import MASK, is_secret_env_name, mask_data, mask_text, remember

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "tests" / "standin" / "sglang" / "srt" / "flags_0_5_23.json"
RESERVED = {"model_path", "port", "host"}
# What a flag that takes a credential says about itself in its help text.
CREDENTIAL_HELP = re.compile(r"\b(api key|password|passwd|credentials?|secret|access key|bearer)\b", re.I)


def actions() -> list[dict[str, Any]]:
    return list(json.loads(TABLE.read_text(encoding="utf-8"))["actions"])


@pytest.mark.parametrize("name", ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "API_KEY", "DB_PASSWORD", "SMTP_PASSWD",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_CREDENTIAL", "hf_token", "KEY"])
def test_env_names_with_a_secret_word_are_secret(name: str) -> None:
    assert is_secret_env_name(name)


@pytest.mark.parametrize("name", ["MAX_TOTAL_TOKENS", "TOKENIZER_PATH", "TOKENIZER_MODE", "HF_HOME", "KEYBOARD",
                                  "SGLANG_ENABLE_SPEC_V2", "MONKEY", "SPECULATIVE_NUM_DRAFT_TOKENS", "PASSWORDLESS"])
def test_env_names_that_only_contain_a_secret_word_are_not(name: str) -> None:
    assert not is_secret_env_name(name)


def test_the_engine_secret_flags_are_the_credential_flags_of_the_real_table() -> None:
    """Regenerate the table for a new SGLang and this fails when it gains a flag that takes a credential."""
    taking_credentials = {a["dest"] for a in actions() if CREDENTIAL_HELP.search(a.get("help") or "")
                          and a["kind"] == "store"}
    assert taking_credentials == {"api_key", "admin_api_key", "ssl_keyfile_password"}
    assert SGLANG.launch.secret_flags == taking_credentials


def _value_for(action: dict[str, Any], index: int) -> Any:
    if action["kind"] != "store" and action["kind"] != "lora_path":
        return True
    if action.get("choices"):
        return str(action["choices"][-1])
    if action["nargs"] in ("+", "*"):
        return [f"item{index}a", f"item{index}b"]
    if action.get("type") == "int":
        return 1000 + index
    if action.get("type") == "float":
        return 0.5 + index
    return f"val{index}-{action['dest']}"


def test_over_the_real_flag_table_only_secret_flags_are_masked() -> None:
    """Every option of SGLang 0.5.23 set at once: the secret ones are masked, every other stays literal in
    launch.sh, `render`, the run record that status and history read, drift, and any text we print."""
    args: dict[str, Any] = {}
    for index, action in enumerate(actions()):
        if action["dest"] in RESERVED or not action["option_strings"][0].startswith("--") or \
                action["kind"] == "help":
            continue
        key = action["option_strings"][0][2:].replace("-", "_")
        args[key] = f"sk-secret-{key}-0123456789" if action["dest"] in SGLANG.launch.secret_flags else \
            _value_for(action, index)
    prof = Profile.model_validate({"name": "all", "target": {"host": "h"},
                                   "engine": {"model_path": "m", "args": args}})
    remember(prof.secret_values())
    bundle = render(prof)
    record = prof.public_dict()["engine"]["args"]
    masked = sorted(k for k, v in record.items() if v == MASK)
    assert masked == ["admin_api_key", "api_key", "ssl_keyfile_password"]

    exec_line = next(line for line in bundle.script.splitlines() if line.startswith("exec "))
    words = shlex.split(exec_line)
    shown = json.dumps(mask_data({"argv": bundle.argv, "script": bundle.script, "env": bundle.masked_env}))
    drift_lines = [d.describe() for d in compare(args, {k: "engine-changed-it" for k in args})]
    drift = mask_text("\n".join(drift_lines))
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if key in SGLANG.launch.secret_flags:
            assert value not in bundle.script and value not in shown and value not in drift
            assert value in bundle.env
            assert f'{flag} "$DEPLOYER_SECRET_{key.upper()}"' in " ".join(sh_word(w) for w in bundle.shim_words)
            assert flag not in exec_line
            continue
        assert record[key] == value, key
        if value is True:
            assert flag in words, key
            continue
        items = [str(v) for v in value] if isinstance(value, list) else [str(value)]
        at = words.index(flag)
        assert words[at + 1: at + 1 + len(items)] == items, key
        for item in items:
            assert item in mask_text(exec_line) and item in shown, key
        assert f"asked {key}=" in drift and mask_text(str(value if not isinstance(value, list) else
                                                         json.dumps(value))) in drift, key
    # the flagship cases
    assert "--speculative-num-draft-tokens" in words and "$DEPLOYER_SECRET_SPECULATIVE" not in bundle.script


def test_qwen36_profile_renders_its_tuning_flags_literally_without_any_secret_set() -> None:
    prof = load_profile(REPO / "profiles" / "qwen36-mtp.yaml", environ={}, allow_unset=True)
    script = render(prof).script
    assert "--speculative-num-draft-tokens 4" in script and "DEPLOYER_SECRET" not in script
    assert [u.name for u in prof.unset] == ["HF_TOKEN"]
    assert "qwen36-mtp.yaml:" in prof.unset[0].warning() and "${HF_TOKEN}" in prof.unset[0].warning()
    assert prof.public_dict()["engine"]["env"]["HF_TOKEN"] == MASK


def test_up_still_needs_the_variable(tmp_path: Path) -> None:
    from deployer.errors import ProfileError

    with pytest.raises(ProfileError, match=r"\$\{HF_TOKEN\} is not set"):
        load_profile(REPO / "profiles" / "qwen36-mtp.yaml", environ={})


def _write(tmp_path: Path, args: str, env: str = "") -> Path:
    path = tmp_path / "p.yaml"
    path.write_text("name: t\ntarget: {host: h}\nengine:\n  model_path: m\n  python: /usr/bin/python3\n"
                    f"  args:\n{args}" + (f"  env:\n{env}" if env else ""))
    return path


def test_var_items_of_lists_and_dicts_go_through_the_env_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "    lora_paths: [plain-adapter, '${ADAPTER}']\n"
                            "    json_model_override_args: {rope: 2, auth: {token: '${DICT_SECRET}'}}\n"
                            "    tp_size: 2\n")
    prof = load_profile(path, environ={"ADAPTER": "adapter=/secret/path-xyz", "DICT_SECRET": "dict-secret-123"})
    bundle = render(prof)
    for value in ("adapter=/secret/path-xyz", "dict-secret-123"):
        assert value not in bundle.script and value not in json.dumps(prof.public_dict())
        assert value not in " ".join(bundle.argv) and value in bundle.env
    shimmed = " ".join(sh_word(w) for w in bundle.shim_words)  # SGLang: appended to its argv in memory
    assert '--lora-paths plain-adapter "$DEPLOYER_SECRET_LORA_PATHS_1"' in shimmed
    assert '--json-model-override-args "$DEPLOYER_SECRET_JSON_MODEL_OVERRIDE_ARGS"' in shimmed
    public = prof.public_dict()["engine"]["args"]
    assert public["lora_paths"] == ["plain-adapter", MASK]
    assert public["json_model_override_args"] == {"rope": 2, "auth": {"token": MASK}}
    assert prof.templates == {"engine.args.lora_paths.1": "${ADAPTER}",
                              "engine.args.json_model_override_args.auth.token": "${DICT_SECRET}"}


def _env_of(bundle_env: str) -> dict[str, str]:
    from deployer.supervisor.base import parse_env_text

    return parse_env_text(bundle_env)


def test_restore_from_the_env_file_renders_the_same_version(tmp_path: Path) -> None:
    path = _write(tmp_path, "    lora_paths: [plain, '${ADAPTER}']\n    api_key: sk-literal-key\n"
                            "    json_model_override_args: {a: '${DICT_SECRET}'}\n",
                  "    HF_TOKEN: '${TOKEN}'\n")
    prof = load_profile(path, environ={"ADAPTER": "secret-adapter", "DICT_SECRET": "dsecret", "TOKEN": "hf_tok"})
    bundle = render(prof)
    record = prof.public_dict()
    restorer = Restorer("r1", _env_of(bundle.env), prof.templates, environ={})
    engine = restorer.engine(record["engine"])
    assert engine["args"]["lora_paths"] == ["plain", "secret-adapter"]
    assert engine["args"]["api_key"] == "sk-literal-key" and engine["env"]["HF_TOKEN"] == "hf_tok"
    assert engine["args"]["json_model_override_args"] == {"a": "dsecret"}
    rebuilt = Profile.model_validate({**record, "engine": engine})
    rebuilt._templates = prof.templates
    assert render(rebuilt).content_hash == bundle.content_hash


def test_restore_without_env_file_uses_the_local_environment_or_names_what_is_missing(tmp_path: Path) -> None:
    path = _write(tmp_path, "    lora_paths: [plain, '${ADAPTER}']\n", "    HF_TOKEN: '${TOKEN}'\n")
    prof = load_profile(path, environ={"ADAPTER": "secret-adapter", "TOKEN": "hf_tok"})
    record = prof.public_dict()
    engine = Restorer("r1", None, prof.templates, environ={"ADAPTER": "a2", "TOKEN": "t2"}).engine(record["engine"])
    assert engine["args"]["lora_paths"] == ["plain", "a2"] and engine["env"]["HF_TOKEN"] == "t2"
    with pytest.raises(SecretUnavailable) as info:
        Restorer("r1", None, prof.templates, environ={"TOKEN": "t2"}).engine(record["engine"])
    assert "${ADAPTER} is not set here" in str(info.value) and "env file of run r1 is gone" in str(info.value)
    literal = load_profile(_write(tmp_path, "    api_key: sk-literal\n"), environ={})
    with pytest.raises(SecretUnavailable, match="literally"):
        Restorer("r2", None, {}, environ={}).engine(literal.public_dict()["engine"])


def test_mask_text_hides_known_values_and_the_engines_own_args_dump() -> None:
    remember(["hf_known_value_1"])
    assert mask_text("token hf_known_value_1 used") == "token *** used"
    dump = "server_args={'api_key': 'never-seen-key', 'admin_api_key': \"adm-x\", 'tp_size': 2, 'ssl_keyfile_password': None}"
    masked = mask_text(dump)
    assert "never-seen-key" not in masked and "adm-x" not in masked
    assert "'tp_size': 2" in masked and "'ssl_keyfile_password': None" in masked
    cli = mask_text("argv: --api-key zzz3 --admin-api-key=zzz4 --tp-size 2 --api-key \"$DEPLOYER_SECRET_API_KEY\"")
    assert "zzz3" not in cli and "zzz4" not in cli and "--tp-size 2" in cli and "$DEPLOYER_SECRET_API_KEY" in cli
    call = mask_text("ServerArgs(model_path='m', api_key='zzz5', port=1)")
    assert "zzz5" not in call and "model_path='m'" in call and "port=1" in call


def test_the_cli_streams_mask_what_is_written_through_them() -> None:
    import io

    from deployer.secrets import MaskingStream

    remember(["stream-secret-31337"])
    inner = io.StringIO()
    stream = MaskingStream(inner)
    print("line with stream-secret-31337 and --api-key unknown-one", file=stream)
    stream.writelines(["stream-secret-31337\n"])
    assert inner.getvalue() == "line with *** and --api-key ***\n***\n"
    assert stream.isatty() is False and stream.getvalue() == inner.getvalue()  # the rest is the inner stream's


def test_a_flag_renamed_by_preflight_stays_secret(tmp_path: Path) -> None:
    """cuda_graph_max_bs is renamed for 0.5.23; had its value come from ${VAR}, the new name is just as secret."""
    from deployer.preflight.flags import Flag, FlagSet, check_flags
    from deployer.engines.renames import load_renames

    path = _write(tmp_path, "    cuda_graph_max_bs: '${GRAPH}'\n    tp_size: 1\n")
    prof = load_profile(path, environ={"GRAPH": "renamed-secret-4242"})
    flagset = FlagSet("sglang", "0.5.23", (Flag(("--cuda-graph-max-bs-decode",), "cuda_graph_max_bs_decode"),
                                           Flag(("--tp-size",), "tp_size")))
    checked = check_flags(prof, flagset, load_renames(engine_for("sglang").knowledge))
    assert "cuda_graph_max_bs_decode" in checked.profile.engine.args, checked.errors
    bundle = render(checked.profile)
    assert "renamed-secret-4242" not in bundle.script and "renamed-secret-4242" in bundle.env
    assert checked.profile.public_dict()["engine"]["args"]["cuda_graph_max_bs_decode"] == MASK


def test_save_fixed_writes_a_renamed_secret_flag_as_its_var(tmp_path: Path) -> None:
    from deployer.profile.fixed import profile_diff
    from deployer.preflight.flags import Flag, FlagSet, check_flags
    from deployer.engines.renames import load_renames

    prof = load_profile(_write(tmp_path, "    cuda_graph_max_bs: '${GRAPH}'\n"), environ={"GRAPH": "fx-secret-99"})
    flagset = FlagSet("sglang", "0.5.23", (Flag(("--cuda-graph-max-bs-decode",), "cuda_graph_max_bs_decode"),))
    after = check_flags(prof, flagset, load_renames(engine_for("sglang").knowledge)).profile
    assert profile_diff(prof, after)["args"] == {"cuda_graph_max_bs": None, "cuda_graph_max_bs_decode": "${GRAPH}"}


def test_validate_and_render_of_the_shipped_profiles_need_no_secret() -> None:
    import os
    import subprocess
    import sys

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "deployer.cli", *argv], capture_output=True, text=True,
                              timeout=60, env={"PATH": os.environ["PATH"]}, cwd=str(REPO))

    for path in sorted((REPO / "profiles").glob("*.yaml")):
        res = cli("validate", str(path.relative_to(REPO)))
        assert res.returncode == 0, res.stderr
    rendered = cli("render", "profiles/qwen36-mtp.yaml")
    assert rendered.returncode == 0 and "--speculative-num-draft-tokens 4" in rendered.stdout
    assert "DEPLOYER_SECRET" not in rendered.stdout
    assert rendered.stderr.startswith("warning: profiles/qwen36-mtp.yaml:") and "${HF_TOKEN} is not set" in \
        rendered.stderr


def test_render_json_says_where_each_secret_comes_from() -> None:
    import os
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "deployer.cli", "render", "profiles/qwen36-mtp.yaml", "--json"],
                         capture_output=True, text=True, timeout=60, env={"PATH": os.environ["PATH"]}, cwd=str(REPO))
    data = json.loads(res.stdout)
    assert data["secret_sources"] == {"engine.env.HF_TOKEN": "${HF_TOKEN}"} and data["unset"] == ["HF_TOKEN"]
    assert data["env"]["HF_TOKEN"] == MASK


def test_structured_output_is_masked_before_json_escaping() -> None:
    """The stdout guard sees `"pa\\"ss\\u00e9"`, not the value: structured output is masked first."""
    remember(['quo"te-s\u00e9cret'])
    data = mask_data({"detail": 'engine said quo"te-s\u00e9cret', "list": ['quo"te-s\u00e9cret']})
    text = json.dumps(data)
    assert data == {"detail": "engine said ***", "list": ["***"]} and "cret" not in text


def test_an_engine_that_reads_its_key_from_its_environment_gets_it_there_and_restores_from_there(
        tmp_path: Path) -> None:
    """Issue 34 finding 2: the key was read from the engine's argv. vLLM reads VLLM_API_KEY (Launch.secret_env): the
    key is in that variable of the 0600 env file, in no argv word; restart and rollback restore it from there."""
    path = tmp_path / "v.yaml"
    path.write_text("name: v\ntarget: {host: h}\nengine:\n  kind: vllm\n  model_path: m\n  python: /usr/bin/python3\n"
                    "  args:\n    api_key: '${KEY}'\n")
    prof = load_profile(path, environ={"KEY": "sk-vllm-env-5150"})
    bundle = render(prof)
    assert "sk-vllm-env" not in bundle.script and not any("api-key" in w or "API_KEY" in w for w in bundle.argv)
    assert _env_of(bundle.env)["VLLM_API_KEY"] == "sk-vllm-env-5150" and bundle.masked_env["VLLM_API_KEY"] == "***"
    engine = Restorer("r1", _env_of(bundle.env), prof.templates, environ={}).engine(prof.public_dict()["engine"])
    assert engine["args"]["api_key"] == "sk-vllm-env-5150"
    rebuilt = Profile.model_validate({**prof.public_dict(), "engine": engine})
    rebuilt._templates = prof.templates
    assert render(rebuilt).content_hash == bundle.content_hash
