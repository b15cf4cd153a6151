"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product.

The imitated version: env STANDIN_SGLANG_VERSION, default "0.5.23".
"""

import os

__version__ = os.environ.get("STANDIN_SGLANG_VERSION", "0.5.23")


def version_tuple(version: str = __version__) -> tuple:
    """'0.5.10' -> (0, 5, 10); non-numeric parts (rc1, post1) stop the tuple."""
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def is_old_era(version: str = __version__) -> bool:
    """Before 0.5.20: --mamba-scheduler-strategy and SGLANG_ENABLE_SPEC_V2 still exist."""
    return version_tuple(version) < (0, 5, 20)
