"""`deploy upgrade` on real code (issue 39): the seed-era profile (profiles/qwen36-mtp.yaml, written for SGLang
0.5.10's `--mamba-scheduler-strategy`) moved to 0.5.23 with both releases' own parsers and resolutions on one test
bed; every change is shown with its source, and the saved profile is what 0.5.23 accepts.

Runs in the tier's 0.5.23 pass (SGLANG_VENV); the seed-era venv is SGLANG_SEED_VENV, else the one beside it
named like the Makefile's (`sglang-venv-0.5.10`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from realtier import engine_host
from sglang_release import ROOT, SEED_ERA, VENV, only_release
from sshbed import SSHD, free_port

pytestmark = [only_release("0.5.23"), pytest.mark.timeout(900),
              pytest.mark.slow("two real releases' parsers and dry resolutions, three preflights")]
QWEN36 = ROOT / "tests" / "fixtures" / "models" / "qwen36-27b-like"
H200_DIR = Path(__file__).resolve().parent / "h200"
SEED_VENV = Path(os.environ.get("SGLANG_SEED_VENV", VENV.parent / f"sglang-venv-{SEED_ERA}"))


@pytest.fixture(scope="module")
def two_releases(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    """The H200-pretending bed with `sglang-python` (0.5.23) and `sglang-python-seed` (0.5.10)."""
    assert (SEED_VENV / "bin" / "python").exists(), f"no seed-era venv at {SEED_VENV} (scripts/build-sglang-venv.sh " \
                                                    f"{SEED_VENV} {SEED_ERA}; or set SGLANG_SEED_VENV)"
    for bed in engine_host(tmp_path_factory.mktemp("sshd-upgrade"), "sglang-python", f"PYTHONPATH={H200_DIR}", VENV):
        seed = bed.bin_dir / "sglang-python-seed"
        seed.write_text(f'#!/bin/sh\nPYTHONPATH={H200_DIR} exec {SEED_VENV / "bin" / "python"} "$@"\n')
        seed.chmod(0o755)
        yield bed


def seed_profile(bed: SSHD, tmp_path: Path) -> Path:
    """profiles/qwen36-mtp.yaml's engine args and env as shipped, on the bed's seed-era python."""
    shipped = yaml.safe_load((ROOT / "profiles" / "qwen36-mtp.yaml").read_text())["engine"]
    data = {"name": "qwen36-mtp", "target": bed.target(tmp_path / "work"),
            "engine": {"kind": "sglang", "python": "sglang-python-seed", "model_path": str(QWEN36),
                       "port": free_port(), "gpus": [0], "args": {**shipped["args"], "device": "cuda"},
                       "env": {"SGLANG_ENABLE_SPEC_V2": shipped["env"]["SGLANG_ENABLE_SPEC_V2"],
                               "HF_TOKEN": "${HF_TOKEN}"}}}
    path = tmp_path / "qwen36-mtp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def deploy(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEPLOYER_HOME": str(home), "HF_TOKEN": "hf_test"}
    return subprocess.run([sys.executable, "-m", "deployer.cli", *argv], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One workdir and DEPLOYER_HOME for the module: the second run reads the flag tables the first cached."""
    return tmp_path_factory.mktemp("upgrade")


def test_seed_profile_upgraded_to_0523_shows_every_change_with_its_source(two_releases: SSHD,
                                                                          shared: Path) -> None:
    profile, saved = seed_profile(two_releases, shared), shared / "upgraded.yaml"
    ran = deploy("upgrade", str(profile), "--engine", "sglang==0.5.23", "--python", "sglang-python", "--json",
                 "--save", str(saved), home=shared / "home")
    assert ran.returncode == 0, ran.stderr[-3000:]
    plan = json.loads(ran.stdout.splitlines()[-1])
    assert plan["event"] == "report"
    assert (plan["from"], plan["to"], plan["ok"]) == (SEED_ERA, "0.5.23", True)
    by = {(c["what"], c["name"]): c for c in plan["changes"]}
    # the rename, value carried, from the renames table's row
    renamed = by["renamed", "mamba_scheduler_strategy"]
    assert renamed["after"] == "mamba_radix_cache_strategy" and renamed["before"] == "extra_buffer"
    assert "PR #27418" in renamed["source"] and "renames.yaml" in renamed["source"]
    # the retired environment variable, dropped loudly
    retired = by["env retired", "SGLANG_ENABLE_SPEC_V2"]
    assert retired["loud"] and "PR #27964" in retired["source"]
    # values each release's own dry resolution gives, side by side
    resolves = {c["name"]: c for c in plan["changes"] if c["what"] == "resolves"}
    assert resolves, plan["changes"]
    assert all("dry resolution on both releases" in c["source"] for c in resolves.values())
    assert "mem_fraction_static" in resolves, sorted(resolves)
    assert round(resolves["mem_fraction_static"]["before"], 3) == 0.812          # 0.5.10's formula
    assert resolves["mem_fraction_static"]["after"] != resolves["mem_fraction_static"]["before"]
    # follow-on checks only 0.5.23 has, each with the source line it is raised at
    checks = [c for c in plan["changes"] if c["what"] == "check"]
    assert checks and all("(0.5.23)" in c["source"] or "0.5.1" in c["source"] for c in checks), checks
    assert plan["resolution"] == {"from": "done", "to": "done"}
    rows = {m["row"]: m for m in plan["memory"]}
    assert "mem_fraction_static" in rows and rows["mem_fraction_static"]["from"] != rows["mem_fraction_static"]["to"]
    # the saved profile: the new name with the value, the retired env gone, the release pinned; 0.5.23 takes it
    written = yaml.safe_load(saved.read_text())
    assert written["engine"]["args"]["mamba_radix_cache_strategy"] == "extra_buffer"
    assert "mamba_scheduler_strategy" not in written["engine"]["args"]
    assert "SGLANG_ENABLE_SPEC_V2" not in written["engine"]["env"]
    assert written["engine"]["env"]["HF_TOKEN"] == "${HF_TOKEN}"                 # never the secret
    assert (written["engine"]["version"], written["engine"]["python"]) == ("0.5.23", "sglang-python")
    assert saved.read_text().startswith("# Written by `deploy upgrade --engine sglang==0.5.23 --save`")
    planned = deploy("plan", str(saved), "--json", home=shared / "home")
    assert planned.returncode == 0, planned.stderr[-2000:]


def test_the_text_names_each_source(two_releases: SSHD, shared: Path) -> None:
    ran = deploy("upgrade", str(seed_profile(two_releases, shared)), "--engine", "sglang==0.5.23", "--python",
                 "sglang-python", home=shared / "home")
    assert ran.returncode == 0, ran.stderr[-3000:]
    text = ran.stdout
    assert f"upgrade of qwen36-mtp: sglang {SEED_ERA} -> 0.5.23" in text
    assert "--mamba-scheduler-strategy -> --mamba-radix-cache-strategy (value extra_buffer carried)" in text
    assert "DROPPED env SGLANG_ENABLE_SPEC_V2=1" in text
    assert "memory plan (one GPU): 0.5.10 | 0.5.23" in text
    assert "mem_fraction_static: 0.8119 -> 0.8406  [dry resolution on both releases (0.5.10: prepare_server_args; " \
           "0.5.23: _handle_gpu_memory_settings)]" in text
    assert "disable_piecewise_cuda_graph: true -> absent" in text     # a flag 0.5.23 no longer has
