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
    return pytest.mark.skipif(RELEASE != version, reason=f"for SGLang {version}; this venv has {RELEASE}")
