"""deployer.prepare.install_plan: the argv lists that build a managed environment, the target's pip configuration
honoured (read from the real `pip config list` of the dev machine), and the dry resolution's real outputs read."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.prepare.envspec import EnvSpec
from deployer.prepare.install_plan import (LOCK_PROTOCOL, PipConfig, TargetTools, choose_tool, parse_freeze,
                                           record_for,
                                           parse_pip_config, parse_pip_report, parse_tool_version, parse_uv_compile, parse_uv_dry_run,
                                           plan_install, probe_commands, with_sizes)
from deployer.profile.model import EngineInstall

CASES = Path(__file__).parent.parent / "cases" / "install"
UV = TargetTools(python_version="3.11.7", uv="/usr/local/bin/uv", uv_version="0.13.9", pip_version="23.2.1")
PIP_ONLY = TargetTools(python_version="3.11.7", pip_version="23.2.1")


def case(name: str) -> str:
    return (CASES / f"{name}.txt").read_text(encoding="utf-8")


def spec(**kw: object) -> EnvSpec:
    data: dict[str, object] = {"packages": ["vllm==0.11.0"]}
    data.update(kw)
    return EnvSpec.from_install(EngineInstall.model_validate(data))


def test_real_pip_config_list_is_read_as_pip_install_reads_it() -> None:
    conf = parse_pip_config(case("pip-config-list"))
    assert conf.get("find-links") == ("/opt/wheels",)
    assert conf.get("extra-index-url") == ("file:///opt/pypi/simple", "file:///opt/pypi-more/simple")
    assert conf.get("constraint") == ("/etc/xdg/pip/constraints.txt",)
    assert conf.get("cert") == ("/etc/ssl/certs/ca-certificates.crt",)
    assert conf.get("index-url") == ()


def test_environment_beats_install_section_beats_global() -> None:
    conf = parse_pip_config("global.index-url='https://g/simple'\ninstall.index-url='https://i/simple'\n"
                            ":env:.index-url='https://e/simple'\nglobal.timeout='60'\nnot a config line\n")
    assert conf.get("index-url") == ("https://e/simple",)
    assert parse_pip_config(":env:.index-url='https://e/simple'\nglobal.index-url='https://g/simple'\n"
                            ).get("index-url") == ("https://e/simple",)


def test_uv_gets_the_targets_pip_configuration_as_flags() -> None:
    conf = parse_pip_config(case("pip-config-list"))
    choice = choose_tool(spec(find_links=["/srv/wheels"]), UV, conf)
    assert choice.tool == "uv"
    flags = list(choice.flags)
    assert flags[flags.index("--constraints") + 1] == "/etc/xdg/pip/constraints.txt"
    assert [flags[i + 1] for i, f in enumerate(flags) if f == "--find-links"] == ["/opt/wheels", "/srv/wheels"]
    assert [flags[i + 1] for i, f in enumerate(flags) if f == "--extra-index-url"] == [
        "file:///opt/pypi/simple", "file:///opt/pypi-more/simple"]
    assert flags[-2:] == ["--index-strategy", "unsafe-best-match"]        # pip's merge of indexes
    assert dict(choice.env) == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}


def test_profile_index_url_replaces_the_targets() -> None:
    conf = PipConfig({"index-url": ("https://target/simple",)})
    flags = list(choose_tool(spec(index_url="https://profile/simple"), UV, conf).flags)
    assert flags.count("--index-url") == 1 and flags[flags.index("--index-url") + 1] == "https://profile/simple"
    assert "--index-strategy" not in flags


@pytest.mark.parametrize("conf,needle", [
    ({"constraint": ("https://cfg.example/constraints.txt",)}, "constraint file by URL"),
    ({"use-deprecated": ("legacy-resolver",)}, "sets use-deprecated (legacy-resolver), which uv has no flag for"),
    ({"require-hashes": ("true",)}, "require-hashes")])
def test_pip_when_uv_cannot_honour_the_config_and_says_which_key(conf: dict[str, tuple[str, ...]],
                                                                 needle: str) -> None:
    choice = choose_tool(spec(find_links=["/w"]), UV, PipConfig(conf))
    assert choice.tool == "pip" and needle in choice.why
    assert choice.flags == ("--find-links", "/w")            # pip reads its own config: only the profile's flags


def test_no_uv_no_pip_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="no uv on the target's PATH and python3 has no pip"):
        choose_tool(spec(), TargetTools(python_version="3.11.7"), PipConfig())
    assert choose_tool(spec(), PIP_ONLY, PipConfig()).why.startswith("pip 23.2.1")


def test_uv_plan_argv() -> None:
    s = spec(packages=["vllm==0.11.0", "Torch==2.8.0"])
    plan = plan_install(s, "/w", UV, PipConfig(), "b1")
    build = f"/w/.deployer/envs/{s.digest}.build-b1"
    assert plan.venv.argv == ("/usr/local/bin/uv", "venv", "--quiet", "--python", "python3", build)
    # uv resolves with `uv pip compile` of the packages on its stdin: no environment, no pip needed
    assert plan.resolve is not None and plan.resolve.argv == (
        "/usr/local/bin/uv", "pip", "compile", "--python", "python3", "--no-header", "--no-annotate", "--quiet", "-")
    assert plan.install.argv[-2:] == ("torch==2.8.0", "vllm==0.11.0") and "--dry-run" not in plan.install.argv
    assert plan.freeze.argv[-2:] == ("--format", "json")
    assert [s.name for s in plan.steps] == ["venv", "resolve", "install", "freeze"]
    assert all(isinstance(a, str) for step in plan.steps for a in step.argv)


def test_pip_plan_argv_and_the_report() -> None:
    s = spec(index_url="https://mirror/simple")
    plan = plan_install(s, "/w", PIP_ONLY, PipConfig(), "b2")
    py = f"/w/.deployer/envs/{s.digest}.build-b2/bin/python"
    assert plan.venv.argv == ("python3", "-m", "venv", f"/w/.deployer/envs/{s.digest}.build-b2")
    assert plan.resolve is not None
    assert plan.resolve.argv[:8] == (py, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-")
    assert plan.resolve.argv[-3:] == ("--index-url", "https://mirror/simple", "vllm==0.11.0")
    old = plan_install(s, "/w", TargetTools(python_version="3.8.10", pip_version="20.0.2"), PipConfig(), "b3")
    assert old.resolve is None and "no --dry-run --report" in old.notes[0]


def test_a_value_is_one_argv_item_never_shell_text() -> None:
    s = spec(packages=["vllm==0.11.0 ; python_version >= '3.10'"], find_links=["/opt/my;wheels$(x)"])
    plan = plan_install(s, "/w", PIP_ONLY, PipConfig(), "b4")
    assert "/opt/my;wheels$(x)" in plan.install.argv
    assert "vllm==0.11.0 ; python_version >= '3.10'" in plan.install.argv


def test_real_pip_report_with_its_warnings_in_front() -> None:
    dists = parse_pip_report(case("pip-dry-run-report"))
    assert [(d.name, d.version) for d in dists] == [("six", "1.16.0"), ("packaging", "24.1")]
    assert dists[0].filename == "six-1.16.0-py2.py3-none-any.whl"


def test_real_pip_report_of_torch_from_find_links() -> None:
    dists = parse_pip_report(case("pip-dry-run-report-torch"))
    torch = next(d for d in dists if d.key == "torch")
    assert torch.version == "2.13.0+cpu" and torch.url is not None and torch.url.startswith("file:///opt/wheels/")
    assert torch.filename == "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert {d.key for d in dists} >= {"jinja2", "markupsafe", "typing-extensions", "sympy"}
    with pytest.raises(ValueError):
        parse_pip_report(case("pip-no-such-version"))


def test_real_uv_dry_runs() -> None:
    assert [(d.name, d.version) for d in parse_uv_dry_run(case("uv-dry-run"))] == [("packaging", "24.1"),
                                                                                   ("six", "1.16.0")]
    dists = parse_uv_dry_run(case("uv-find-links-dry-run"))
    assert ("torch", "2.13.0+cpu") in [(d.name, d.version) for d in dists] and len(dists) == 10


def test_real_uv_compile() -> None:
    dists = parse_uv_compile(case("uv-compile"))
    assert [(d.name, d.version) for d in dists][-2:] == [("smg", "1.13.0"), ("typing-extensions", "4.16.0")]
    assert len(dists) == 7 and all(d.url is None and d.size is None for d in dists)
    direct = parse_uv_compile("# a comment\n--index-url x\nh25tiny @ file:///w/h25tiny-1.0-py3-none-any.whl\n"
                              "torch[cpu]==2.8.0 ; sys_platform == 'linux'\n")
    assert [(d.name, d.version, d.url) for d in direct] == [
        ("h25tiny", "", "file:///w/h25tiny-1.0-py3-none-any.whl"), ("torch", "2.8.0", None)]


def test_sizes_freeze_and_versions() -> None:
    dists = parse_uv_dry_run(case("uv-dry-run"))
    sized = with_sizes(dists, [100, None])
    assert [d.size for d in sized] == [100, None]
    with pytest.raises(ValueError):
        with_sizes(dists, [1])
    assert parse_freeze('[{"name": "six", "version": "1.16.0"}]') == {"six": "1.16.0"}
    assert parse_tool_version("uv 0.13.9 (x86_64-unknown-linux-gnu)") == "0.13.9"
    assert parse_tool_version("pip 23.2.1 from /x/pip (python 3.11)") == "23.2.1"
    assert probe_commands(spec(python="/usr/bin/python3.11"))["pip_config"] == [
        "/usr/bin/python3.11", "-m", "pip", "config", "list"]


def test_lock_protocol_names_its_steps() -> None:
    for needle in ("flock(LOCK_EX)", "rename(2)", ".build-<id>", "deployer-env.json", "not relocatable"):
        assert needle in LOCK_PROTOCOL


def test_the_record_of_a_build() -> None:
    s = spec(packages=["torch==2.13.0"], find_links=["/opt/wheels"])
    plan = plan_install(s, "/w", UV, parse_pip_config(case("pip-config-list")), "b5")
    resolved = with_sizes(parse_pip_report(case("pip-dry-run-report-torch")), [191794682] + [None] * 9)
    freeze = {"torch": "2.13.0+cpu", "Jinja2": "3.1.6", "pip": "23.2.1"}
    rec = record_for(plan, python_version="3.11.7", tool_version="0.13.9", freeze=freeze, resolved=resolved,
                     config=parse_pip_config(case("pip-config-list")), built_at="2026-12-01T23:59:00Z")
    assert rec.tool == "uv 0.13.9" and rec.intact and rec.digest == s.digest
    by_name = {d.name: d for d in rec.resolved}
    assert by_name["torch"].size == 191794682 and by_name["torch"].url is not None
    assert by_name["Jinja2"].url is not None and by_name["pip"].url is None       # pip: not in the resolution
    assert ("constraint", "/etc/xdg/pip/constraints.txt") in rec.pip_config
    assert rec.versions() == {"torch": "2.13.0+cpu", "jinja2": "3.1.6", "pip": "23.2.1"}
