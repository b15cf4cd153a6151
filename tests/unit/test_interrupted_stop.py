"""runner/interrupted.py: the bring-back after Ctrl-C stops the old version (a stop still in progress ends first)
as part of the replace (`--why replace`), so a bring-back that then fails (the port taken meanwhile) leaves the
deployment `interrupted` (5), never a `down`'s `stopped` (8) (issue #34)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from deployer.errors import PortBusy
from deployer.runner import interrupted
from deployer.runner.interrupted import Interrupted


def test_the_bring_backs_stop_is_for_the_replace(monkeypatch: pytest.MonkeyPatch) -> None:
    stops: list[dict[str, Any]] = []
    monkeypatch.setattr(interrupted, "status", lambda remote, run: {"alive": False})
    monkeypatch.setattr(interrupted, "stop", lambda remote, run, grace, why=None: stops.append({"why": why}) or {})
    monkeypatch.setattr(interrupted, "set_current", lambda remote, layout, run: None)

    def squatted(remote: Any, layout: Any, port: int, wait_s: float = 0.0) -> None:
        raise PortBusy(f"port {port} taken by pid 7 (python3) of user nobody")
    monkeypatch.setattr(interrupted, "check_port", squatted)
    old = SimpleNamespace(run_id="r1")
    target = SimpleNamespace(remote=None, layout=None, run=SimpleNamespace(run_id="r2"),
                             serving=SimpleNamespace(run=old, reached_ready=True, record={"port": 8000}))
    said: list[Any] = []
    shape = SimpleNamespace(targets=[target], each=lambda work, items: [work(i) for i in items])
    Interrupted(shape, 3.0, said.append).bring_back()  # type: ignore[arg-type]
    assert stops == [{"why": "replace"}]
    assert "bringing back the stopped version failed" in said[0].message and "of user nobody" in said[0].message
