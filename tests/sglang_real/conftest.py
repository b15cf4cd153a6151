"""The real-SGLang tier: a real SGLang release's own parser and resolution, on this CPU, as the target's engine.

The venv comes from `scripts/build-sglang-venv.sh DIR VERSION` (env SGLANG_VENV; `make test-sglang-real` runs
the tier once against 0.5.23 and once against the seed era's 0.5.10); without it every test here is skipped
with the reason (a failure under CI). Modules for one release are deselected on the other (sglang_release.py). The "target" is the SSH test
bed; its engine python is a wrapper that puts tests/sglang_real/h200 (a sitecustomize making SGLang see one H200) on PYTHONPATH.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deployer.remote.base import Remote
from deployer.remote.connect import connect
from realtier import engine_host, mark_tier
from sglang_release import VENV, deselect_other_releases
from sshbed import SSHD

H200_DIR = Path(__file__).resolve().parent / "h200"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mark_tier(items, Path(__file__).resolve().parent, pytest.mark.sglang_real, VENV, "scripts/build-sglang-venv.sh")
    deselect_other_releases(config, items)


@pytest.fixture(scope="module")
def h200_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    """An sshd whose sessions have the stand-in nvidia-smi and `sglang-python`, the H200-pretending venv."""
    yield from engine_host(tmp_path_factory.mktemp("sshd-sglang"), "sglang-python", f"PYTHONPATH={H200_DIR}", VENV)


@pytest.fixture(scope="module")
def remote(h200_host: SSHD) -> Iterator[Remote]:
    """One connection to the H200-pretending target, for a module's tests."""
    r = connect(h200_host.spec())
    try:
        yield r
    finally:
        r.close()
