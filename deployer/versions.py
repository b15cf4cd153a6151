"""Engine release versions: the one ordering of version strings, and version ranges (`>=0.5.0,<0.5.20`).

Ordered the way PEP 440 orders releases, for the forms engines publish: `0.5.14.dev2 < 0.5.14rc1 < 0.5.14 <
0.5.14.post1`, `0.5 == 0.5.0`, a leading `v` and a `+local` suffix ignored.
"""

from __future__ import annotations

import re

_VERSION = re.compile(
    r"^\s*v?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre>a|alpha|b|beta|c|rc|pre|preview)[-_.]?(?P<pre_n>\d*))?"
    r"(?:(?:[-_.]?(?:post|rev|r)[-_.]?(?P<post>\d*))|-(?P<post_bare>\d+))?"
    r"(?:[-_.]?dev[-_.]?(?P<dev>\d*))?"
    r"(?:\+[a-z0-9.]+)?\s*$",
    re.IGNORECASE,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}

VersionKey = tuple[tuple[int, ...], tuple[int, ...], int, tuple[int, ...]]


def version_key(text: str) -> VersionKey | None:
    """A sort key for a version string; None when it is not a version (e.g. `unknown`)."""
    found = _VERSION.match(text)
    if found is None:
        return None
    release = tuple(int(p) for p in found.group("release").split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    pre_name, dev = found.group("pre"), found.group("dev")
    post = found.group("post") if found.group("post") is not None else found.group("post_bare")
    is_post = post is not None  # `.post` with no number is post-release 0
    if pre_name:
        pre: tuple[int, ...] = (0, _PRE_RANK[pre_name.lower()], int(found.group("pre_n") or 0))
    elif dev is not None and not is_post:
        pre = (-1,)  # 1.0.dev1 comes before 1.0a1
    else:
        pre = (1,)
    post_n = int(post) if post else (0 if is_post else -1)
    dev_key = (0, int(dev or 0)) if dev is not None else (1,)
    return release, pre, post_n, dev_key


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as version `a` sorts before, with or after `b`; ValueError when either is not a version."""
    key_a, key_b = version_key(a), version_key(b)
    if key_a is None or key_b is None:
        raise ValueError(f"not a version: {a if key_a is None else b!r}")
    return (key_a > key_b) - (key_a < key_b)


def at_least(version: str, floor: str) -> bool:
    """`version >= floor`; False when `version` is not a version."""
    have = version_key(version)
    want = version_key(floor)
    if want is None:
        raise ValueError(f"not a version: {floor!r}")
    return have is not None and have >= want


def version_in(version: str, spec: str) -> bool:
    """`0.5.23` in `>=0.5.0,<0.5.20`? `*` (or empty) matches everything; unparsable versions match."""
    if spec.strip() in ("", "*"):
        return True
    have = version_key(version)
    if have is None:
        return True
    for clause in spec.split(","):
        found = re.match(r"^\s*(>=|<=|==|!=|>|<)\s*(\S+)\s*$", clause)
        want = version_key(found.group(2)) if found else None
        if found is None or want is None:
            raise ValueError(f"bad version range {spec!r}")
        ok = {">=": have >= want, "<=": have <= want, "==": have == want, "!=": have != want,
              ">": have > want, "<": have < want}[found.group(1)]
        if not ok:
            return False
    return True
