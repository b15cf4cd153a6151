"""The real-SGLang tier: a real SGLang release's own parser and resolution, on this CPU, as the target's engine.

The venv comes from `scripts/build-sglang-venv.sh DIR VERSION` (env SGLANG_VENV; `make test-sglang-real` runs
the tier once against 0.5.23 and once against the seed era's 0.5.10); without it every test here is skipped
with the reason. Modules for one release skip on the other (sglang_release.py). The "target" is the SSH test
bed; its engine python is a wrapper that puts tests/sglang_real/h200 (a sitecustomize making SGLang see one H200) on PYTHONPATH.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_release import ROOT, VENV

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
