"""The real-SGLang tier: SGLang 0.5.23's own parser and resolution, on this CPU, as the target's engine.

The venv comes from `scripts/build-sglang-venv.sh .cache/sglang-venv` (or env SGLANG_VENV); without it
every test here is skipped with the reason. The "target" is the SSH test bed; its engine python is a
wrapper that puts tests/sglang_real/h200 (a sitecustomize making SGLang see one H200) on PYTHONPATH.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("SGLANG_VENV", ROOT / ".cache" / "sglang-venv"))
H200_DIR = Path(__file__).resolve().parent / "h200"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    skip = None
    if not (VENV / "bin" / "python").exists():
        skip = pytest.mark.skip(reason=f"no SGLang venv at {VENV} (run scripts/build-sglang-venv.sh {VENV})")
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.sglang_real)
            if skip is not None:
                item.add_marker(skip)


@pytest.fixture(scope="module")
def h200_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An sshd whose sessions have the stand-in nvidia-smi and `sglang-python`, the H200-pretending venv."""
    from sshbed import make_sshd

    bed = make_sshd(tmp_path_factory.mktemp("sshd-sglang"))
    os.symlink(ROOT / "tests" / "standin" / "bin" / "nvidia-smi", bed.bin_dir / "nvidia-smi")
    wrapper = bed.bin_dir / "sglang-python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={H200_DIR} exec {VENV / "bin" / "python"} "$@"\n')
    wrapper.chmod(0o755)
    try:
        yield bed
    finally:
        bed.stop()
