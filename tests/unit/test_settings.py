"""The user's defaults (deployer/settings.py): the config file checked with file:line, and the precedence
command line > environment > profile > config file > built-in, as the profile loader applies it."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployer.errors import ProfileError
from deployer.profile.loader import load_profile
from deployer.local.settings import config_path, load_config

PROFILE = "name: p\ntarget:\n  host: box1\nengine:\n  model_path: m\n"


@pytest.fixture()
def xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in ("DEPLOYER_CONFIG", "DEPLOYER_HOST", "DEPLOYER_WORKDIR", "DEPLOYER_ENGINE_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "xdg" / "deployer").mkdir(parents=True)
    return tmp_path / "xdg" / "deployer" / "config.yaml"


def test_where_the_config_file_is(tmp_path: Path) -> None:
    assert config_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "deployer" / "config.yaml"
    assert config_path({"XDG_CONFIG_HOME": "relative/ignored", "HOME": str(tmp_path)}).parts[-3:] == \
        (".config", "deployer", "config.yaml")
    assert config_path({"DEPLOYER_CONFIG": str(tmp_path / "c.yaml")}) == tmp_path / "c.yaml"


@pytest.mark.parametrize("text, line, message", [
    ("host: a\nhots: b\n", 2, "unknown key 'hots' (did you mean 'host'?)"),
    ("host: a\nworkdir: 3\n", 2, "workdir: must be a non-empty string"),
    ("workdir:\n  - a\n", 2, "workdir: must be a non-empty string"),
    ("- host\n", 1, "must be a mapping"),
    ("host: [a\n", 2, "YAML syntax error"),
    ("colour: red\n", 1, "unknown key 'colour' (known: host, workdir, engine_python)"),
])
def test_a_bad_config_file_is_one_error_with_file_and_line(xdg: Path, text: str, line: int, message: str) -> None:
    xdg.write_text(text)
    with pytest.raises(ProfileError) as caught:
        load_config()
    assert str(caught.value).startswith(f"{xdg}:{line}: ") and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_no_file_is_no_defaults(xdg: Path) -> None:
    config = load_config()
    assert config.values == {} and config.digest is None and config.path == xdg


def test_precedence_cli_env_profile_config_builtin(xdg: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    xdg.write_text("host: cfg-box\nworkdir: /cfg\nengine_python: /cfg/python\n")
    prof = tmp_path / "p.yaml"
    prof.write_text(PROFILE)
    loaded = load_profile(prof)
    assert (loaded.target.host, loaded.target.workdir, loaded.engine.python) == ("box1", "/cfg", "/cfg/python")
    assert loaded.written("target.host") == (str(prof), 3) and loaded.written("target.workdir") == (str(xdg), 2)
    monkeypatch.setenv("DEPLOYER_HOST", "ops@env-box:2200")
    monkeypatch.setenv("DEPLOYER_ENGINE_PYTHON", "/env/python")
    loaded = load_profile(prof)
    assert (loaded.target.host, loaded.target.user, loaded.target.port) == ("env-box", "ops", 2200)
    assert loaded.engine.python == "/env/python"
    assert loaded.written("engine.python") == ("env DEPLOYER_ENGINE_PYTHON", None)
    loaded = load_profile(prof, host="cli-box", overrides=["engine.python=/cli/python"])
    assert (loaded.target.host, loaded.engine.python) == ("cli-box", "/cli/python")
    assert loaded.written("target.host") == ("--host", None) and loaded.written("engine.python") == ("--set", None)
    xdg.unlink()
    monkeypatch.delenv("DEPLOYER_HOST")
    monkeypatch.delenv("DEPLOYER_ENGINE_PYTHON")
    loaded = load_profile(prof)
    assert (loaded.target.workdir, loaded.engine.python) == ("/workspace/deployer", "python3")
    assert loaded.written("target.workdir") == (None, None)


def test_the_config_host_fills_a_profile_without_one(xdg: Path, tmp_path: Path) -> None:
    prof = tmp_path / "p.yaml"
    prof.write_text("name: p\nengine:\n  model_path: m\n")
    with pytest.raises(ProfileError, match="target"):
        load_profile(prof)
    xdg.write_text("host: root@cfg-box\n")
    loaded = load_profile(prof)
    assert (loaded.target.host, loaded.target.user) == ("cfg-box", "root")


def test_a_profile_value_the_environment_replaced_is_said(xdg: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    prof = tmp_path / "p.yaml"
    prof.write_text(PROFILE)
    env = {**os.environ, "DEPLOYER_HOST": "env-box", "XDG_CONFIG_HOME": str(xdg.parent.parent),
           "DEPLOYER_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-m", "deployer.cli", "validate", str(prof)], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert "note: target.host from DEPLOYER_HOST (the environment outranks the profile)" in out.stderr
    assert "-> env-box:" in out.stdout
