"""The conversation's greeting lock is bounded (issue 22, 10): a wait for the helper's hello that never returns
(an interrupt that landed inside the SSH library leaves the channel's read wedged) must not leave every later
request of that conversation (the lock's release among them) stuck behind it: they fail in bounded time with one
clear TargetError."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from deployer.errors import TargetError
from deployer.remote import conversation
from deployer.remote.conversation import Conversation


class WedgedSession:
    """A channel whose read never returns, whatever its timeout says."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.release = threading.Event()

    def readline(self, timeout: float) -> str | None:
        self.release.wait()
        return None

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def close(self) -> None:
        self.release.set()


class OneChannel:
    label = "wedged-host"

    def __init__(self) -> None:
        self.session = WedgedSession()

    def spawn(self, cmd: str) -> WedgedSession:
        return self.session

    def close(self) -> None:
        self.session.close()


def test_a_request_behind_a_wedged_greeting_fails_in_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conversation, "START_TIMEOUT_S", 0.4)
    monkeypatch.setattr(conversation, "REPLY_MARGIN_S", 0.4)
    transport = OneChannel()
    conv = Conversation(transport)  # type: ignore[arg-type]
    session = conv._ensure()
    def wedged() -> None:
        try:
            conv._greeted(session)
        except TargetError:  # once the test lets the channel go
            pass

    first = threading.Thread(target=wedged, daemon=True)  # wedged until the end of the test
    first.start()
    deadline = time.monotonic() + 5
    while not conv._greet_lock.locked() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert conv._greet_lock.locked(), "the first greeting never took the lock"
    outcome: dict[str, Any] = {}

    def later() -> None:
        began = time.monotonic()
        try:
            conv.call("snapshot", {"argv": ["x"]}, 30, "reading a snapshot")
        except TargetError as e:
            outcome["error"] = e
        outcome["took"] = time.monotonic() - began

    second = threading.Thread(target=later, daemon=True)
    second.start()
    second.join(10)
    try:
        assert not second.is_alive(), "a request waited forever behind a wedged greeting"
        error = outcome.get("error")
        assert isinstance(error, TargetError) and outcome["took"] < 3, outcome
        assert str(error) == "the deployer helper did not start on wedged-host: no hello within 0.8s", str(error)
        assert first.is_alive()  # the wedged one is still wedged: the later request did not wait for it
    finally:
        transport.close()
        first.join(5)


class NologinSession:
    """A channel to an account whose shell is nologin: it printed its refusal and exited before the first request
    could be written (the race CI met: the send fails, the refusal is still there to be read)."""

    def __init__(self) -> None:
        self.lines = ["This account is currently not available."]

    def readline(self, timeout: float) -> str | None:
        return self.lines.pop(0) if self.lines else None

    def send(self, data: bytes) -> None:
        raise conversation.RemoteError("session closed", host="nologin-host")

    def close(self) -> None:
        pass


class NologinChannel(OneChannel):
    label = "deploy@nologin-host"

    def __init__(self) -> None:
        self.session = NologinSession()  # type: ignore[assignment]


def test_a_first_request_that_cannot_be_sent_says_why_the_helper_never_started() -> None:
    conv = Conversation(NologinChannel())  # type: ignore[arg-type]
    with pytest.raises(TargetError) as raised:
        conv.send("snapshot", {"argv": ["x"]})
    assert "did not start on deploy@nologin-host: This account is currently not available." in str(raised.value)
    assert "refuses logins" in str(raised.value.hint) and "usermod -s /bin/bash deploy" in str(raised.value.hint)
