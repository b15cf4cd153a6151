"""The lock's client-side words: busy, takeover and status lines, and the lease length setting."""

from __future__ import annotations

import time

import pytest

from deployer.errors import ProfileError
from deployer.box.lock import LEASE_S, busy_message, describe_lease, lease_seconds, takeover_message

SINCE = time.mktime((2026, 11, 30, 23, 40, 1, 0, 0, -1))
HOLDER = {"owner": "alice@laptop", "pid": 4242, "command": "up", "since": SINCE}


def test_busy_keeps_locked_by_who_since_when_and_says_when_it_expires() -> None:
    line = busy_message({**HOLDER, "held": True, "expires_in": 27.9, "renewed_ago": 2.1})
    assert line == ("deployment is locked by alice@laptop pid 4242 (up) since 2026-11-30 23:40:01 (heartbeat 2.1s "
                    "ago; the lease expires in 27.9s unless renewed)")
    assert busy_message({"who": "bob@old (up)", "since": SINCE}) == \
        "deployment is locked by bob@old (up) since 2026-11-30 23:40:01"  # a lock written by an older deployer


@pytest.mark.parametrize("reason, words", [
    ("expired", "took over the deployment lock from alice@laptop pid 4242 (up) since 2026-11-30 23:40:01: its "
                "lease expired 3s ago (no heartbeat for 33.0s)"),
    ("holder-gone", "took over the deployment lock from alice@laptop pid 4242 (up) since 2026-11-30 23:40:01: "
                    "that process is gone from this machine"),
    ("broken", "broke the deployment lock held by alice@laptop pid 4242 (up) since 2026-11-30 23:40:01 "
               "(--break-lock; recorded in the deployment's history)"),
])
def test_takeover_lines_say_from_whom(reason: str, words: str) -> None:
    previous = {**HOLDER, "held": reason != "expired", "expires_in": -3.2, "renewed_ago": 33.0}
    assert takeover_message({"reason": reason, "previous": previous}) == words
    assert takeover_message({"reason": None, "previous": None}) is None


def test_status_words_for_a_held_and_an_expired_lease() -> None:
    held = describe_lease({**HOLDER, "held": True, "expires_in": 20.0, "renewed_ago": 1.0})
    assert held.startswith("locked by alice@laptop pid 4242 (up) since") and "expires in 20.0s" in held
    assert describe_lease({**HOLDER, "held": False, "expires_in": -5.0}).startswith("expired lease of alice@laptop")


@pytest.mark.parametrize("text, value", [("", LEASE_S), ("5", 5.0), (" 3600 ", 3600.0), ("0.5", None),
                                         ("soon", None), ("99999", None), ("nan", None)])
def test_lease_length_from_the_environment(monkeypatch: pytest.MonkeyPatch, text: str, value: float | None) -> None:
    monkeypatch.setenv("DEPLOYER_LOCK_LEASE_S", text)
    if value is None:
        with pytest.raises(ProfileError, match="DEPLOYER_LOCK_LEASE_S=.*from 1 to 3600"):
            lease_seconds()
    else:
        assert lease_seconds() == value
