"""Red team, issue #34 finding 5: the target-side helper answers every request.

The real helper bundle (remote/program.py) under the system python3, spoken to over a local pipe as the target
runs it (tests/unit/test_supervise_helper.py does the same for its ordinary ops). Requests a client would never
send, but a broken or hostile one can: a 100k-deep JSON, numbers beyond any size (`limit: 1e30`), `lease_s: NaN`
or infinite (a lease that never expires, or one anyone may take at once). Each gets one error reply with its id
within a second or two; silence (the client waiting for its timeout) or a lease taken is the bug.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.remote.program import payload_bundle

pytestmark = pytest.mark.integration

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
ANSWER_S = 10.0


class HelperPipe:
    """One helper process over a pipe; `answer` sends a raw line and waits (bounded) for the one reply."""

    def __init__(self, tmp: Path) -> None:
        payload, digest = payload_bundle()
        program = tmp / f"helper-{digest}.py"
        program.write_bytes(payload)
        self.proc = subprocess.Popen([PY, "-B", str(program), "serve", digest], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env={"PATH": os.environ["PATH"], "HOME": str(tmp)})
        assert "hello" in json.loads(self._line(ANSWER_S) or b"{}")

    def _line(self, timeout: float) -> bytes | None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if ready else None

    def answer(self, raw: bytes) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw + b"\n")
        self.proc.stdin.flush()
        line = self._line(ANSWER_S)
        assert line, f"no answer within {ANSWER_S:g} s to {raw[:80]!r}"
        reply: dict[str, Any] = json.loads(line)
        return reply


@pytest.fixture
def helper(tmp_path: Path) -> Iterator[HelperPipe]:
    h = HelperPipe(tmp_path)
    try:
        yield h
    finally:
        h.proc.kill()
        h.proc.wait(timeout=5)


def refused(reply: dict[str, Any], rid: int, needle: str) -> None:
    assert reply["id"] == rid and reply["ok"] is False and reply["kind"] == "bad-request", reply
    assert needle in reply["error"], reply


def test_a_100k_deep_request_is_answered(helper: HelperPipe) -> None:
    deep = b'{"id": 7, "op": "run", "cmd": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    refused(helper.answer(deep), 7, "nested deeper than 64")
    assert helper.answer(b'{"id": 8, "op": "run", "cmd": "echo still", "timeout": 5}')["stdout"] == "still\n"


@pytest.mark.parametrize("number", [b"1e30", b"1e400", b"-1e400", b"100000000000000000000000000000"])
def test_a_number_beyond_bounds_is_answered(helper: HelperPipe, tmp_path: Path, number: bytes) -> None:
    (tmp_path / "f").write_bytes(b"data")
    raw = b'{"id": 3, "op": "read", "path": %s, "offset": 0, "limit": %s}' % (json.dumps(str(tmp_path / "f"))
                                                                                .encode(), number)
    refused(helper.answer(raw), 3, "out of range")


def test_a_large_read_limit_within_bounds_is_capped_not_fatal(helper: HelperPipe, tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"data")
    raw = b'{"id": 4, "op": "read", "path": %s, "limit": 1e15}' % json.dumps(str(tmp_path / "f")).encode()
    reply = helper.answer(raw)
    assert reply["id"] == 4 and reply["ok"] is True, reply


HOLDER = {"owner": "mallory@elsewhere", "pid": 1, "host_id": "elsewhere/boot", "command": "up"}


@pytest.mark.parametrize("lease_s", [b"NaN", b"Infinity", b"-Infinity", b'"nan"', b'"inf"', b"1e300"])
def test_a_lease_that_never_or_always_expires_is_refused(helper: HelperPipe, tmp_path: Path,
                                                         lease_s: bytes) -> None:
    lock = tmp_path / "demo" / "lock"
    lock.parent.mkdir(mode=0o700)
    raw = b'{"id": 5, "op": "lease_take", "path": %s, "holder": %s, "token": "%s", "lease_s": %s, "mode": "take"}' % (
        json.dumps(str(lock)).encode(), json.dumps(HOLDER).encode(), b"a" * 32, lease_s)
    reply = helper.answer(raw)
    assert reply["id"] == 5 and reply["ok"] is False and reply["kind"] == "bad-request", reply
    assert not lock.exists() or b"mallory" not in lock.read_bytes()  # no lease was written


def test_an_unforeseen_failure_is_answered_too(helper: HelperPipe, tmp_path: Path) -> None:
    """An op that fails in a way nobody wrote a reply for (a file mode no chmod takes: OverflowError) still gets
    an error reply carrying its id, and the helper carries on."""
    data = b"x"
    files = [{"path": str(tmp_path / "x"), "mode": 1 << 52, "sha256": hashlib.sha256(data).hexdigest(),
              "data_b64": base64.b64encode(data).decode()}]
    reply = helper.answer(json.dumps({"id": 9, "op": "install", "files": files}).encode())
    assert reply["id"] == 9 and reply["ok"] is False and reply["kind"] == "internal", reply
    assert not (tmp_path / "x").exists()
    assert helper.answer(b'{"id": 10, "op": "run", "cmd": "echo still", "timeout": 5}')["stdout"] == "still\n"


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_are_refused_wherever_they_stand(helper: HelperPipe, constant: bytes) -> None:
    raw = b'{"id": 6, "op": "run", "cmd": "echo ran", "timeout": %s}' % constant
    refused(helper.answer(raw), 6, f"{constant.decode()} is not a number a request may carry")
