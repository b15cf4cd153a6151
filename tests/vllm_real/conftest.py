"""The real-vLLM tier: vLLM 0.33.0's own serve parser on this CPU, as the target's engine.

The venv comes from `scripts/build-vllm-venv.sh ~/.cache/deployer/vllm-venv` (or env VLLM_VENV); without it
every test here is skipped with the reason. The "target" is the SSH test bed; its engine python is a wrapper
that sets VLLM_TARGET_DEVICE=cpu (no GPU to infer vLLM's platform from; the CPU platform changes no flag).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("VLLM_VENV", Path.home() / ".cache" / "deployer" / "vllm-venv"))
STANDIN = ROOT / "tests" / "standin"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    skip = None
    if not (VENV / "bin" / "python").exists():
        skip = pytest.mark.skip(reason=f"no vLLM venv at {VENV} (run scripts/build-vllm-venv.sh {VENV})")
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.vllm_real)
            if skip is not None:
                item.add_marker(skip)


@pytest.fixture(scope="module")
def vllm_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An sshd whose sessions have the stand-in nvidia-smi and `vllm-python`, the real-vLLM CPU venv."""
    from sshbed import make_sshd

    bed = make_sshd(tmp_path_factory.mktemp("sshd-vllm"))
    os.symlink(STANDIN / "bin" / "nvidia-smi", bed.bin_dir / "nvidia-smi")
    wrapper = bed.bin_dir / "vllm-python"
    wrapper.write_text(f'#!/bin/sh\nVLLM_TARGET_DEVICE=cpu exec {VENV / "bin" / "python"} "$@"\n')
    wrapper.chmod(0o755)
    try:
        yield bed
    finally:
        bed.stop()
