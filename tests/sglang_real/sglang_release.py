"""Which real SGLang release this run of the tier has (the venv named by env SGLANG_VENV)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("SGLANG_VENV", ROOT / ".cache" / "sglang-venv"))
SEED_ERA = "0.5.10"


def _release() -> str | None:
    """The SGLang version installed in the venv (its dist-info), without importing it."""
    for info in sorted(VENV.glob("lib/python*/site-packages/sglang-*.dist-info")):
        return info.name[len("sglang-"):-len(".dist-info")]
    return None


RELEASE = _release()


def only_release(version: str) -> pytest.MarkDecorator:
    """Marks a module's tests as written for one release: on a venv of another release they are deselected (not
    skipped: under CI a skip is a failure), see `deselect_other_releases`."""
    return pytest.mark.sglang_release(version)


def deselect_other_releases(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drops (deselects) the tests marked for a release this venv does not have; the tier runs once per release."""
    other = [item for item in items
             if (mark := item.get_closest_marker("sglang_release")) is not None and mark.args[0] != RELEASE]
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = [item for item in items if item not in other]
