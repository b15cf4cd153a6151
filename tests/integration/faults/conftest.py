"""Fixtures of the fault suite: a target host in its own network namespace (tests/netbed.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from netbed import NetHost, net_host, unavailable


@pytest.fixture()
def net(tmp_path: Path) -> Iterator[NetHost]:
    """A host in its own network namespace with a real sshd inside; skipped where netns cannot be made."""
    why = unavailable(nft=True)
    if why:
        pytest.skip(f"network fault tests: {why}")
    with net_host(tmp_path / "nethost") as host:
        yield host
