"""Engine version ranges (`>=0.5.10,<0.5.14`) as signatures and follow-on constraints write them. Pure."""

from __future__ import annotations

import re


def version_in(version: str, spec: str) -> bool:
    """`0.5.23` in `>=0.5.0,<0.5.20`? `*` (or empty) matches everything; unparsable versions match."""
    if spec.strip() in ("", "*"):
        return True
    have = _version_tuple(version)
    if have is None:
        return True
    for clause in spec.split(","):
        found = re.match(r"^\s*(>=|<=|==|!=|>|<)\s*(\S+)\s*$", clause)
        want = _version_tuple(found.group(2)) if found else None
        if found is None or want is None:
            raise ValueError(f"bad version range {spec!r}")
        if not _compare(have, found.group(1), want):
            return False
    return True


def _version_tuple(text: str) -> tuple[int, ...] | None:
    found = re.match(r"^v?(\d+(?:\.\d+)*)", text.strip())
    return tuple(int(p) for p in found.group(1).split(".")) if found else None


def _compare(have: tuple[int, ...], op: str, want: tuple[int, ...]) -> bool:
    width = max(len(have), len(want))
    a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
    return {">=": a >= b, "<=": a <= b, "==": a == b, "!=": a != b, ">": a > b, "<": a < b}[op]
