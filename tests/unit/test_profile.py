"""Profiles: loading, layering, overrides, and one clear message per bad profile (file, line, field)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deployer.errors import ProfileError
from deployer.profile.loader import load_profile

GOOD = """\
name: demo
target:
  host: gpu-box
  workdir: /srv/deployer
engine:
  kind: sglang
  model_path: Qwen/Qwen3-8B
  args:
    tp_size: 1
  env:
    HF_TOKEN: ${HF_TOKEN}
"""

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str | bytes, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_good_profile_loads_with_defaults(tmp_path: Path) -> None:
    prof = load_profile(write(tmp_path, GOOD), environ={"HF_TOKEN": "hf_x"})
    assert prof.engine.port == 30000
    assert prof.engine.args == {"tp_size": 1}
    assert prof.engine.env["HF_TOKEN"] == "hf_x"
    assert "HF_TOKEN" in prof.secret_env_keys()
    assert prof.public_dict()["engine"]["env"]["HF_TOKEN"] == "***"


def test_kebab_and_dashed_flag_names_become_snake_case(tmp_path: Path) -> None:
    text = GOOD.replace("    tp_size: 1", "    tp-size: 2\n    --mem-fraction-static: 0.8")
    prof = load_profile(write(tmp_path, text), environ={"HF_TOKEN": "x"})
    assert prof.engine.args == {"tp_size": 2, "mem_fraction_static": 0.8}


def test_set_overrides_are_typed_and_host_override(tmp_path: Path) -> None:
    prof = load_profile(write(tmp_path, GOOD), environ={"HF_TOKEN": "x"},
                        overrides=["engine.args.tp_size=2", "engine.args.enable_metrics=true",
                                   "health.interval_s=0.5"], host="ops@10.1.2.3:2222")
    assert prof.engine.args["tp_size"] == 2 and prof.engine.args["enable_metrics"] is True
    assert prof.health.interval_s == 0.5
    assert (prof.target.user, prof.target.host, prof.target.port) == ("ops", "10.1.2.3", 2222)


@pytest.mark.parametrize("text,expected", [("gpu-box", (None, "gpu-box", None)), ("ops@box:2222", ("ops", "box", 2222)),
                                           ("a@b@host", ("a@b", "host", None))])
def test_host_option_forms(text: str, expected: tuple[object, ...]) -> None:
    from deployer.host import parse_host

    assert parse_host(text) == expected


@pytest.mark.parametrize("text", ["box:ssh", "box:0", "box:70000", "@box", "user@", ""])
def test_bad_host_option_is_a_profile_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(ProfileError, match="--host"):
        load_profile(write(tmp_path, GOOD), environ={"HF_TOKEN": "x"}, host=text or "@")


def test_extends_deep_merges_child_over_base(tmp_path: Path) -> None:
    write(tmp_path, "name: base\ntarget: {host: a, workdir: /w}\nengine:\n  model_path: m\n"
                    "  args: {tp_size: 1, dtype: bfloat16}\n", "base.yaml")
    child = write(tmp_path, "extends: base.yaml\nname: child\nengine:\n  args: {tp_size: 4}\n")
    prof = load_profile(child, environ={})
    assert prof.name == "child" and prof.target.host == "a"
    assert prof.engine.args == {"tp_size": 4, "dtype": "bfloat16"}


def test_dollar_dollar_escapes_a_literal_dollar(tmp_path: Path) -> None:
    text = GOOD.replace("${HF_TOKEN}", "$${NOT_EXPANDED}")
    prof = load_profile(write(tmp_path, text), environ={})
    assert prof.engine.env["HF_TOKEN"] == "${NOT_EXPANDED}"


def test_shipped_profiles_validate() -> None:
    for path in sorted((REPO / "profiles").glob("*.yaml")):
        if path.name == "base.yaml":
            continue
        prof = load_profile(path, environ={"HF_TOKEN": "hf_test", "SGLANG_API_KEY": "sk_test"})
        assert prof.name == path.stem


def test_qwen36_profile_is_the_mtp_deployment() -> None:
    prof = load_profile(REPO / "profiles/qwen36-mtp.yaml", environ={"HF_TOKEN": "t"})
    args = prof.engine.args
    assert args["speculative_algorithm"] == "NEXTN"
    assert (args["speculative_num_steps"], args["speculative_eagle_topk"],
            args["speculative_num_draft_tokens"]) == (3, 1, 4)
    assert args["mamba_scheduler_strategy"] == "extra_buffer"
    assert prof.engine.env["SGLANG_ENABLE_SPEC_V2"] == "1" and prof.engine.port == 30000


# (case id, file text or bytes, expected line or None, substrings the one message must contain)
BAD: list[tuple[str, str | bytes, int | None, list[str]]] = [
    ("yaml-syntax", "name: demo\ntarget: [unclosed\n", 3, ["YAML syntax error"]),
    ("unknown-top-key", GOOD + "helth:\n  path: /x\n", 12, ["unknown key 'helth'", "did you mean 'health'"]),
    ("unknown-target-key", GOOD.replace("  workdir:", "  hostt: x\n  workdir:"), 4,
     ["target.hostt", "did you mean 'host'"]),
    ("unknown-engine-key", GOOD.replace("  kind: sglang", "  kind: sglang\n  modle_path: x"), 7,
     ["engine.modle_path", "did you mean 'model_path'"]),
    ("unknown-health-key", GOOD + "health:\n  intervl_s: 2\n", 13, ["health.intervl_s", "did you mean 'interval_s'"]),
    ("wrong-type", GOOD.replace("kind: sglang", "kind: sglang\n  port: lots"), 7, ["engine.port", "integer"]),
    ("missing-required", GOOD.replace("  model_path: Qwen/Qwen3-8B\n", ""), 5, ["engine.model_path", "missing"]),
    ("bad-name", GOOD.replace("name: demo", "name: Demo_1"), 1, ["name", "pattern"]),
    ("unset-var", GOOD, 11, ["${HF_TOKEN} is not set", "engine.env.HF_TOKEN"]),
    ("unknown-engine-kind", GOOD.replace("kind: sglang", "kind: tgi"), 6,
     ["unknown engine kind 'tgi' (known: sglang, vllm)"]),
    ("negative-timeout", GOOD + "health:\n  startup_timeout_s: -5\n", 13, ["health.startup_timeout_s", "greater than 0"]),
    ("port-out-of-range", GOOD.replace("kind: sglang", "kind: sglang\n  port: 70000"), 7,
     ["engine.port", "less than or equal to 65535"]),
    ("flag-twice", GOOD.replace("    tp_size: 1", "    tp_size: 1\n    tp-size: 2"), 8, ["tp_size", "given twice"]),
    ("args-not-mapping", GOOD.replace("  args:\n    tp_size: 1", "  args: [--tp-size, 1]"), 8,
     ["engine.args", "must be a mapping"]),
    ("empty-file", "", None, ["file is empty"]),
    ("binary-file", b"\x7fELF\x02\x01\x01\x00\x00\x00\x00", None, ["binary"]),
    ("not-a-mapping", "- a\n- b\n", 1, ["must be a YAML mapping"]),
    ("duplicate-key", GOOD.replace("name: demo", "name: demo\nname: again"), 2, ["duplicate key 'name'"]),
    ("reserved-arg", GOOD.replace("    tp_size: 1", "    port: 31000"), 8, ["set engine.port instead"]),
    ("bad-env-name", GOOD.replace("    HF_TOKEN: ${HF_TOKEN}", "    BAD-NAME: x"), 10, ["bad environment variable"]),
    ("relative-workdir", GOOD.replace("/srv/deployer", "srv"), 4, ["target.workdir", "absolute"]),
    ("bad-gpus", GOOD.replace("kind: sglang", "kind: sglang\n  gpus: [0, 0]"), 7, ["engine.gpus", "distinct"]),
]


@pytest.mark.parametrize("case_id,text,line,needles", BAD, ids=[c[0] for c in BAD])
def test_bad_profiles_give_one_clear_error(tmp_path: Path, case_id: str, text: str | bytes, line: int | None,
                                           needles: list[str]) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as info:
        load_profile(path, environ={} if case_id == "unset-var" else {"HF_TOKEN": "x"})
    message = str(info.value)
    assert message.startswith(str(path)), message
    if line is not None:
        assert f"{path}:{line}:" in message, message
    for needle in needles:
        assert needle in message, message
    assert "\n" not in message


def test_extends_loop_and_missing_base(tmp_path: Path) -> None:
    write(tmp_path, "extends: b.yaml\nname: a\n", "a.yaml")
    write(tmp_path, "extends: a.yaml\nname: b\n", "b.yaml")
    with pytest.raises(ProfileError, match=r"extends loop: a.yaml -> b.yaml -> a.yaml"):
        load_profile(tmp_path / "a.yaml", environ={})
    missing = write(tmp_path, GOOD + "extends: nowhere.yaml\n", "c.yaml")
    with pytest.raises(ProfileError, match=r"c.yaml:12: extends: extends file not found"):
        load_profile(missing, environ={"HF_TOKEN": "x"})


def test_error_in_base_file_names_the_base_file(tmp_path: Path) -> None:
    write(tmp_path, "name: base\ntarget: {host: a}\nengine:\n  model_path: m\n  port: nope\n", "base.yaml")
    child = write(tmp_path, "extends: base.yaml\nname: child\n", "child.yaml")
    with pytest.raises(ProfileError) as info:
        load_profile(child, environ={})
    assert "base.yaml:5: engine.port" in str(info.value)


def test_bad_set_override_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="expected KEY=VALUE"):
        load_profile(write(tmp_path, GOOD), environ={"HF_TOKEN": "x"}, overrides=["engine.args.tp_size"])
    with pytest.raises(ProfileError, match="did you mean 'port'"):
        load_profile(write(tmp_path, GOOD), environ={"HF_TOKEN": "x"}, overrides=["engine.prot=1"])


@pytest.mark.parametrize("case_id,text,line,needles", BAD[:6], ids=[c[0] for c in BAD[:6]])
def test_cli_validate_exits_2_without_traceback(tmp_path: Path, case_id: str, text: str | bytes,
                                                line: int | None, needles: list[str]) -> None:
    path = write(tmp_path, text)
    proc = subprocess.run([sys.executable, "-m", "deployer.cli", "validate", str(path)], capture_output=True,
                          text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HF_TOKEN": "x"})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needles[0] in lines[0]


def test_cli_validate_ok_and_missing_file(tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, "-m", "deployer.cli", "validate", str(write(tmp_path, GOOD))],
                        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "HF_TOKEN": "x"})
    assert ok.returncode == 0 and ": ok (demo" in ok.stdout
    missing = subprocess.run([sys.executable, "-m", "deployer.cli", "validate", str(tmp_path / "nope.yaml")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "file not found" in missing.stderr and "Traceback" not in missing.stderr


# --- engine.install (the managed environment, deployer.prepare) -------------------------------------------------

INSTALL = GOOD.replace("  args:\n", """  install:
    packages: ["vllm==0.11.0", "torch >= 2.8, < 3 ; python_version >= '3.10'", "mypkg @ file:///opt/wheels/m.whl"]
    find_links: [/opt/wheels]
    extra_index_urls: ["https://download.pytorch.org/whl/cu128"]
    python: /usr/bin/python3.11
  args:
""")


def test_engine_install_loads_and_leaves_python_alone(tmp_path: Path) -> None:
    prof = load_profile(write(tmp_path, INSTALL), environ={"HF_TOKEN": "x"})
    install = prof.engine.install
    assert install is not None and install.python == "/usr/bin/python3.11"
    assert install.packages[1] == "torch >= 2.8, < 3 ; python_version >= '3.10'"
    assert install.find_links == ["/opt/wheels"] and install.index_url is None
    assert load_profile(write(tmp_path, GOOD), environ={"HF_TOKEN": "x"}).engine.install is None


def test_engine_install_and_an_explicit_python_exclude_each_other(tmp_path: Path) -> None:
    text = INSTALL.replace("  model_path: Qwen/Qwen3-8B\n", "  model_path: Qwen/Qwen3-8B\n  python: /opt/venv/bin/python\n")
    with pytest.raises(ProfileError) as err:
        load_profile(write(tmp_path, text), environ={"HF_TOKEN": "x"})
    assert (err.value.line, err.value.field) == (8, "engine.python")
    assert "exclude each other" in str(err.value) and str(err.value).startswith(str(tmp_path / "p.yaml") + ":8:")


@pytest.mark.parametrize("package", ["-r requirements.txt", "vllm===", "vllm==0.11 0", "", "vllm[all"])
def test_engine_install_refuses_what_is_not_a_requirement(tmp_path: Path, package: str) -> None:
    text = INSTALL.replace('"vllm==0.11.0"', repr(package).replace("'", '"'))
    with pytest.raises(ProfileError) as err:
        load_profile(write(tmp_path, text), environ={"HF_TOKEN": "x"})
    assert err.value.field == "engine.install.packages.0" and "requirement specifier" in str(err.value)


def test_engine_install_unknown_key_has_a_did_you_mean(tmp_path: Path) -> None:
    text = INSTALL.replace("    find_links:", "    find_link:")
    with pytest.raises(ProfileError) as err:
        load_profile(write(tmp_path, text), environ={"HF_TOKEN": "x"})
    assert "unknown key 'find_link' (did you mean 'find_links'?)" in str(err.value)
    assert err.value.field == "engine.install" and err.value.line == 8   # the section's line (see EngineInstall)


def test_engine_install_needs_packages(tmp_path: Path) -> None:
    text = INSTALL.replace('    packages: ["vllm==0.11.0", "torch >= 2.8, < 3 ; python_version >= \'3.10\'", '
                           '"mypkg @ file:///opt/wheels/m.whl"]\n', "    packages: []\n")
    with pytest.raises(ProfileError) as err:
        load_profile(write(tmp_path, text), environ={"HF_TOKEN": "x"})
    assert err.value.field == "engine.install.packages"


@pytest.mark.parametrize("text,ok", [("vllm==0.11.0", True), ("sglang[all]>=0.5.10,<0.6", True),
                                     ("torch (>=2.8)", True), ("mypkg @ file:///w/m-1-py3-none-any.whl", True),
                                     ("numpy; python_version<'3.12'", True), ("Jinja2", True),
                                     ("vllm==", False), ("--pre", False), ("a b", False), ("vllm[all", False),
                                     ("vllm>=1 ;", False)])
def test_requirement_fallback_regex_agrees_with_packaging(text: str, ok: bool) -> None:
    """Where `packaging` is missing the regex decides: it accepts and refuses what packaging does on these."""
    from packaging.requirements import InvalidRequirement, Requirement

    from deployer.profile.model import REQUIREMENT_RE

    try:
        Requirement(text)
        by_packaging = True
    except InvalidRequirement:
        by_packaging = False
    assert by_packaging is ok
    assert bool(REQUIREMENT_RE.match(text)) is ok
