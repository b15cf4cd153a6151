"""What the real-engine tiers (tests/sglang_real, tests/vllm_real) share: marking and skipping their tests by
whether the engine's CPU venv exists, and the SSH target whose engine python is a wrapper around that venv."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sshbed import SSHD, make_sshd

ROOT = Path(__file__).resolve().parents[1]
NVIDIA_SMI = ROOT / "tests" / "standin" / "bin" / "nvidia-smi"


def mark_tier(items: list[pytest.Item], here: Path, marker: pytest.MarkDecorator, venv: Path,
              build: str) -> None:
    """Mark every test under `here`; skip them all (saying how to build it) when `venv` has no python."""
    skip = None
    if not (venv / "bin" / "python").exists():
        skip = pytest.mark.skip(reason=f"no venv at {venv} (run {build} {venv})")
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(marker)
            if skip is not None:
                item.add_marker(skip)


def engine_host(root: Path, python_name: str, env: str, venv: Path) -> Iterator[SSHD]:
    """An sshd whose sessions have the stand-in nvidia-smi and `python_name`: the venv's python run with `env`
    (`NAME=value` words put before it), the engine python a profile of the tier names."""
    bed = make_sshd(root)
    os.symlink(NVIDIA_SMI, bed.bin_dir / "nvidia-smi")
    wrapper = bed.bin_dir / python_name
    wrapper.write_text(f'#!/bin/sh\n{env} exec {venv / "bin" / "python"} "$@"\n')
    wrapper.chmod(0o755)
    try:
        yield bed
    finally:
        bed.stop()
