"""One ordering of engine versions (pre-releases before the release, post-releases after) and version ranges."""

from __future__ import annotations

import pytest

from deployer.versions import at_least, compare, version_in, version_key

ASCENDING = ["0.5.13", "0.5.14.dev2", "0.5.14a1", "0.5.14b2", "0.5.14rc1", "0.5.14rc2", "0.5.14",
             "0.5.14.post1", "0.5.14.post2", "0.5.15.dev0", "0.5.15", "0.10.0"]


def test_release_candidates_sort_before_their_release() -> None:
    assert compare("0.5.14rc1", "0.5.14") == -1
    assert not at_least("0.5.14rc1", "0.5.14") and at_least("0.5.14", "0.5.14rc1")
    assert version_in("0.5.14rc1", "<0.5.14") and not version_in("0.5.14rc1", ">=0.5.14")


def test_versions_sort_in_release_order() -> None:
    keys = [version_key(v) for v in ASCENDING]
    assert all(k is not None for k in keys)
    assert sorted(ASCENDING, key=lambda v: version_key(v) or ()) == ASCENDING
    assert [compare(a, b) for a, b in zip(ASCENDING, ASCENDING[1:])] == [-1] * (len(ASCENDING) - 1)


@pytest.mark.parametrize("a, b", [("0.5", "0.5.0"), ("v0.5.14", "0.5.14"), ("0.5.14+cu124", "0.5.14"),
                                  ("0.5.14-1", "0.5.14.post1"), ("0.5.14RC1", "0.5.14rc1")])
def test_equal_spellings(a: str, b: str) -> None:
    assert compare(a, b) == 0


def test_not_a_version() -> None:
    assert version_key("unknown") is None and not at_least("unknown", "0.5.14")
    assert version_in("unknown", ">=0.5.0")  # a range cannot rule out what it cannot read
    with pytest.raises(ValueError):
        compare("unknown", "0.5.14")
    with pytest.raises(ValueError):
        version_in("0.5.14", ">=zero")
