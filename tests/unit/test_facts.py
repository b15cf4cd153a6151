"""Parsing the facts script's output: noise that real targets print must not become a version."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from deployer.preflight.facts import PROBES_KEPT, STORE_SH, parse_facts
from deployer.profile.model import Profile

PROFILE = Profile.model_validate({"name": "p", "target": {"host": "h"}, "engine": {"model_path": "m",
                                                                                 "python": "/venv/bin/python"}})

GPUS = "\n@@@gpus\n0, NVIDIA H200, GPU-1, 143771, 1, 143770\n@@rc 0\n@@@apps\n"


def test_warnings_around_the_version_lines_are_ignored() -> None:
    # seen with real SGLang 0.5.23: huggingface_hub warns on stderr when a sitecustomize imports it
    noisy = (GPUS + "@@@python\n/venv/lib/python3.11/site-packages/huggingface_hub/constants.py:302: FutureWarning: "
             "The `HF_HUB_ENABLE_HF_TRANSFER` environment variable is deprecated\n  warnings.warn(\n"
             "@@python 3.11.7\n@@engine 0.5.23\n@@@port\n@@@end\n")
    facts = parse_facts(noisy, PROFILE)
    assert (facts.python_version, facts.engine_version) == ("3.11.7", "0.5.23")
    assert not facts.problems


def test_python_that_cannot_run_says_why() -> None:
    broken = GPUS + "@@@python\nbash: /venv/bin/python: cannot execute: required file not found\n@@@port\n"
    facts = parse_facts(broken, PROFILE)
    assert facts.engine_version is None
    assert facts.problems == ["engine python '/venv/bin/python' not found on the target "
                              "(bash: /venv/bin/python: cannot execute: required file not found)"]


def test_engine_missing_and_version_pinned() -> None:
    missing = parse_facts(GPUS + "@@@python\n@@python 3.11.7\n@@engine -\n@@@port\n", PROFILE)
    assert missing.problems == ["sglang is not installed for /venv/bin/python (python 3.11.7)"]
    pinned = PROFILE.model_copy(update={"engine": PROFILE.engine.model_copy(update={"version": "0.5.22"})})
    other = parse_facts(GPUS + "@@@python\n@@python 3.11.7\n@@engine 0.5.23\n@@@port\n", pinned)
    assert other.problems == ["the profile expects sglang 0.5.22, the target has 0.5.23"]


def test_the_probe_cache_keeps_its_newest_answers_only(tmp_path: Path) -> None:
    probes = tmp_path / "probes"
    probes.mkdir()
    for i in range(PROBES_KEPT + 5):
        (probes / f"old-{i}.out").write_text("x\n")
        os.utime(probes / f"old-{i}.out", (1_000_000 + i, 1_000_000 + i))
    script = STORE_SH + f'store {probes}/new.out "$(printf "two\\nlines")"\n'
    subprocess.run(["bash", "-c", script], check=True, timeout=30)
    assert (probes / "new.out").read_text() == "two\nlines\n"
    names = {p.name for p in probes.iterdir()}
    assert len(names) == PROBES_KEPT and "new.out" in names and "old-0.out" not in names
    assert not [n for n in names if n.endswith(".tmp")]


def _store(probes: Path, before: str = "") -> None:
    script = STORE_SH + before + f'store {probes}/new.out "answer"\n'
    subprocess.run(["bash", "-c", script], check=False, timeout=30)


def test_the_probe_cache_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    probes, victim = tmp_path / "probes", tmp_path / "victim"
    probes.mkdir(mode=0o700)
    victim.write_text("root's own\n")
    # a link planted at the temporary file's name (it holds the shell's pid, $$, known here in the same shell)
    _store(probes, before=f'ln -s {victim} {probes}/new.out.$$.tmp\n')
    assert victim.read_text() == "root's own\n"
    assert not (probes / "new.out").exists()


@pytest.mark.parametrize("unsafe", ["group-writable", "a symlink"])
def test_the_probe_cache_stores_nothing_in_a_directory_others_control(tmp_path: Path, unsafe: str) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    probes = tmp_path / "probes"
    if unsafe == "a symlink":
        probes.symlink_to(real)
    else:
        probes.mkdir()
        probes.chmod(0o770)
    _store(probes)
    assert list(real.iterdir()) == [] and not (probes / "new.out").exists()
