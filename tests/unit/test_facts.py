"""Parsing the facts script's output: noise that real targets print must not become a version."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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
