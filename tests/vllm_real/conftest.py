"""The real-vLLM tier: vLLM 0.33.0's own serve parser on this CPU, as the target's engine.

The venv comes from `scripts/build-vllm-venv.sh ~/.cache/deployer/vllm-venv` (or env VLLM_VENV); without it
every test here is skipped with the reason. The "target" is the SSH test bed; its engine python is a wrapper
that sets VLLM_TARGET_DEVICE=cpu (no GPU to infer vLLM's platform from; the CPU platform changes no flag).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from realtier import engine_host, mark_tier
from sshbed import SSHD

VENV = Path(os.environ.get("VLLM_VENV", Path.home() / ".cache" / "deployer" / "vllm-venv"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_tier(items, Path(__file__).resolve().parent, pytest.mark.vllm_real, VENV, "scripts/build-vllm-venv.sh")


@pytest.fixture(scope="module")
def vllm_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    """An sshd whose sessions have the stand-in nvidia-smi and `vllm-python`, the real-vLLM CPU venv."""
    yield from engine_host(tmp_path_factory.mktemp("sshd-vllm"), "vllm-python", "VLLM_TARGET_DEVICE=cpu", VENV)
