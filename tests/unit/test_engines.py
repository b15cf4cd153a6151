"""The engine registry: engines are found by scanning deployer.engines, never named in code outside them."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import deployer.engines as engines
from deployer.engines import registry
from deployer.engines import engine_for
from deployer.engines import kinds
from deployer.profile.model import Profile

DEMO = '''
import re
from pathlib import Path
from deployer.engines.base import Engine, Install, Knowledge, Launch, LogFormat, Phase, Probe
HERE = Path(__file__).parent
ENGINE = Engine(kind="demo", launch=Launch(module="demo.serve", template=HERE / "launch.sh.j2"),
                log=LogFormat(ready_line="up", phases=(Phase("ready", re.compile("up")),)),
                knowledge=Knowledge(), install=Install(package="demo-serve"), probe=Probe(script=HERE / "probe.py"))
'''


@pytest.fixture()
def demo_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A new engine package dropped next to sglang/: nothing else changes."""
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "__init__.py").write_text(DEMO)
    monkeypatch.setattr(engines, "__path__", [*engines.__path__, str(tmp_path)])
    registry._registry.cache_clear()
    yield
    registry._registry.cache_clear()
    sys.modules.pop("deployer.engines.demo", None)


def test_sglang_is_registered() -> None:
    assert "sglang" in kinds()
    assert engine_for("sglang").launch.module == "sglang.launch_server"


def test_unknown_kind_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"unknown engine kind 'nope' \(known: .*sglang"):
        engine_for("nope")


def test_a_new_engine_package_is_found_by_the_scan(demo_engine: None) -> None:
    assert kinds() == ("demo", "sglang", "vllm")
    assert engine_for("demo").log.ready_line == "up"


def test_profile_kind_is_checked_against_the_registry(demo_engine: None) -> None:
    base = {"name": "x", "target": {"host": "gpu"}, "engine": {"model_path": "m"}}
    assert Profile.model_validate({**base, "engine": {"kind": "demo", "model_path": "m"}}).engine.kind == "demo"
    with pytest.raises(ValueError, match="unknown engine kind 'tgi'"):
        Profile.model_validate({**base, "engine": {"kind": "tgi", "model_path": "m"}})
