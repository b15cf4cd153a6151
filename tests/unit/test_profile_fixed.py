"""`--save-fixed`: the written profile loads on its own, now that `extends:` must stay inside a profile's folder:
the base is named relative to the saved file when it lies inside that file's folder, else merged in as written.
And the list of a profile's problems stays readable however many there are."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deployer.errors import ProfileProblems
from deployer.profile.fixed import save_fixed
from deployer.profile.loader import load_profile

BASE = """\
name: base
target: {host: gpu-box, workdir: /srv/deployer}
engine:
  model_path: Qwen/Qwen3-8B
  env: {HF_TOKEN: "${HF_TOKEN}"}
  args: {tp_size: 1}
"""


def profiles(tmp_path: Path) -> Path:
    folder = tmp_path / "profiles"
    (folder / "common").mkdir(parents=True)
    (folder / "common" / "base.yaml").write_text(BASE)
    top = folder / "p.yaml"
    top.write_text("extends: common/base.yaml\nname: top\nengine: {args: {mem_fraction_static: 0.8}}\n")
    return top


def fixed(top: Path, dest: Path) -> dict[str, object]:
    environ = {"HF_TOKEN": "hf-secret-1", "XDG_CONFIG_HOME": str(top.parent / "config")}
    before = load_profile(top, environ=environ)
    after = before.patched(args={"mem_fraction_static": 0.7})
    save_fixed(top, before, after, ["mem_fraction_static 0.8 -> 0.7"], dest)
    assert "hf-secret-1" not in dest.read_text()
    reloaded = load_profile(dest, environ=environ)   # loads on its own, inside its own folder
    assert reloaded.engine.args["mem_fraction_static"] == 0.7 and reloaded.engine.args["tp_size"] == 1
    data = yaml.safe_load(dest.read_text())
    assert isinstance(data, dict)
    return data


def test_a_base_inside_the_saved_files_folder_stays_an_extends(tmp_path: Path) -> None:
    top = profiles(tmp_path)
    data = fixed(top, top.parent / "p.fixed.yaml")
    assert data["extends"] == "common/base.yaml" and "target" not in data


def test_a_base_outside_the_saved_files_folder_is_merged_in_as_written(tmp_path: Path) -> None:
    top = profiles(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    data = fixed(top, tmp_path / "elsewhere" / "p.fixed.yaml")
    assert "extends" not in data and data["name"] == "top"
    engine = data["engine"]
    assert isinstance(engine, dict) and engine["env"] == {"HF_TOKEN": "${HF_TOKEN}"}   # as written: no secret


def test_a_profile_error_lists_at_most_twenty_problems_and_counts_the_rest(tmp_path: Path) -> None:
    """A profile of thousands of unknown keys: 20 lines and a count, not thousands of lines (validate's output)."""
    path = tmp_path / "p.yaml"
    path.write_text(BASE + "".join(f"k{i}: 1\n" for i in range(5000)))
    with pytest.raises(ProfileProblems) as info:
        load_profile(path, environ={"HF_TOKEN": "x", "XDG_CONFIG_HOME": str(tmp_path / "config")})
    lines = str(info.value).splitlines()
    assert len(lines) == 22 and lines[-1].endswith("... and 4980 more problems"), lines[-3:]
