"""Where a profile points, remembered by content (deployer/local/remembered.py): used only while nothing the load
read has changed; on-call reads tolerate an unset engine `${VAR}`, never an unset target one."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from deployer.errors import ProfileError
from deployer.local import remembered
from deployer.operate.deployment import make_ref, remembered_ref

BASE = """\
name: demo
target:
  host: ${GPU_HOST}
  user: ops
  port: 2222
  workdir: /srv/deployer
engine:
  kind: sglang
  model_path: Qwen/Qwen3-8B
  env:
    HF_TOKEN: ${HF_TOKEN}
"""


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPU_HOST", "gpu-a")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")
    (tmp_path / "base.yaml").write_text(BASE)
    top = tmp_path / "top.yaml"
    top.write_text("extends: base.yaml\nengine:\n  port: 31000\n")
    return top


def test_a_loaded_profile_is_remembered_and_found_without_loading(setup: Path) -> None:
    assert remembered_ref(str(setup), None, None) is None  # nothing loaded yet
    loaded = make_ref(str(setup), None, None, read_only=True)
    ref = remembered_ref(str(setup), None, None, trust_new_host=True)
    assert ref is not None and ref.profile is None
    assert (ref.name, ref.workdir) == (loaded.name, loaded.workdir) == ("demo", "/srv/deployer")
    assert (ref.spec.host, ref.spec.user, ref.spec.port, ref.spec.trust_new_host) == ("gpu-a", "ops", 2222, True)
    assert remembered_ref(str(setup), None, "/other", False).workdir == "/other"  # type: ignore[union-attr]


@pytest.mark.parametrize("change", ["top file", "extended file", "target var", "engine var", "var unset"])
def test_any_change_to_what_the_load_read_forgets_it(setup: Path, monkeypatch: pytest.MonkeyPatch,
                                                    change: str) -> None:
    make_ref(str(setup), None, None, read_only=True)
    if change == "top file":
        setup.write_text(setup.read_text() + "name: renamed\n")
    elif change == "extended file":
        base = setup.parent / "base.yaml"
        base.write_text(base.read_text().replace("port: 2222", "port: 2223"))
    elif change == "target var":
        monkeypatch.setenv("GPU_HOST", "gpu-b")
    elif change == "engine var":
        monkeypatch.setenv("HF_TOKEN", "hf_other")
    else:
        monkeypatch.delenv("HF_TOKEN")
    assert remembered_ref(str(setup), None, None) is None
    again = make_ref(str(setup), None, None, read_only=True)  # loads afresh, remembers the new answer
    found = remembered_ref(str(setup), None, None)
    assert found is not None and (found.name, found.spec.host, found.spec.port) == \
        (again.name, again.spec.host, again.spec.port)


def test_other_arguments_are_other_entries(setup: Path) -> None:
    make_ref(str(setup), None, None, read_only=True)
    assert remembered_ref(str(setup), "root@gpu-z:22", None) is None  # --host
    assert remembered_ref(str(setup), None, None, overrides=("engine.port=1",)) is None  # --set
    make_ref(str(setup), "root@gpu-z:22", None, read_only=True)
    ref = remembered_ref(str(setup), "root@gpu-z:22", None)
    assert ref is not None and (ref.spec.host, ref.spec.user, ref.spec.port) == ("gpu-z", "root", 22)


def test_no_secret_and_no_plain_digest_of_one_is_stored(setup: Path, tmp_path: Path) -> None:
    import hashlib

    make_ref(str(setup), None, None, read_only=True)
    refs = tmp_path / "home" / "cache" / "refs"
    text = "".join(p.read_text() for p in refs.glob("*.json"))
    assert "hf_secret_value_123" not in text
    assert hashlib.sha256(b"hf_secret_value_123").hexdigest() not in text
    assert "HF_TOKEN" in text  # the name is kept (its value's HMAC says whether it changed)
    assert stat.S_IMODE((refs / ".key").stat().st_mode) == 0o600


def test_a_damaged_entry_or_key_means_loading_again(setup: Path, tmp_path: Path) -> None:
    make_ref(str(setup), None, None, read_only=True)
    refs = tmp_path / "home" / "cache" / "refs"
    entry = next(refs.glob("*.json"))
    entry.write_text("{not json")
    assert remembered_ref(str(setup), None, None) is None
    make_ref(str(setup), None, None, read_only=True)
    (refs / ".key").write_bytes(b"short")
    assert remembered_ref(str(setup), None, None) is None
    data = json.loads(entry.read_text())
    assert data["pointer"]["name"] == "demo"


def test_on_call_reads_tolerate_an_unset_engine_var_but_not_a_target_one(setup: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN")
    assert make_ref(str(setup), None, None, read_only=True).name == "demo"
    with pytest.raises(ProfileError, match=r"HF_TOKEN\} is not set"):
        make_ref(str(setup), None, None)  # what changes an engine (restart, rollback) still needs it
    monkeypatch.delenv("GPU_HOST")
    with pytest.raises(ProfileError, match=r"target.host: \$\{GPU_HOST\} is not set"):
        make_ref(str(setup), None, None, read_only=True)


def test_a_fleet_profile_is_not_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path / "home"))
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("name: f\nreplicas:\n  - host: a\n  - host: b\nengine:\n  kind: sglang\n"
                     "  model_path: Qwen/Qwen3-8B\n")
    with pytest.raises(ProfileError):
        make_ref(str(fleet), None, None, read_only=True)
    assert remembered_ref(str(fleet), None, None) is None
    assert not list((tmp_path / "home").glob("cache/refs/*.json"))


@pytest.mark.parametrize("change", ["config file", "DEPLOYER_WORKDIR"])
def test_a_change_of_the_users_defaults_forgets_it(setup: Path, monkeypatch: pytest.MonkeyPatch,
                                                    change: str) -> None:
    """The config file and DEPLOYER_* defaults feed the load (deployer.local.settings): a change is a reload."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(setup.parent / "xdg"))
    make_ref(str(setup), None, None, read_only=True)
    assert remembered_ref(str(setup), None, None) is not None
    if change == "config file":
        (setup.parent / "xdg" / "deployer").mkdir(parents=True)
        (setup.parent / "xdg" / "deployer" / "config.yaml").write_text("engine_python: /opt/py\n")
    else:
        monkeypatch.setenv("DEPLOYER_WORKDIR", "/elsewhere")
    assert remembered_ref(str(setup), None, None) is None
    if change == "DEPLOYER_WORKDIR":
        assert make_ref(str(setup), None, None, read_only=True).workdir == "/elsewhere"  # env over the profile
