"""`ProgramHelper`: the helper's typed requests (base.Helper) on a bare connection, each one program of its own.

A Conversation answers supervise/snapshot/lease/mkdirs inside its target-side helper. A bare connection (SSHRemote,
LocalRemote: what tests and the Conversation's own process-starting commands use) answers the quick ones with this
deployer's own copy of the payload's modules (remote/program.py), sent over stdin (`python3 -B -`): nothing on the
target's disk runs. The snapshot, mkdirs and the file ops are one helper request each, answered by the helper's own
table of operations (protocol.OPS) run for that one request. The requests that last (the lease, the program
ops fetch and push) need a helper that stays: conversation.BareHelper adds them on a conversation of their own.
Callers never tell these apart: `remote.helper` is always one or the other.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from deployer.errors import TargetError
from deployer.remote.base import CommandTimedOut, Helper, HelperRefused, Remote, Result
from deployer.remote.program import SUPERVISOR_PYTHON, payload_bundle
from deployer.supervisor.protocol import OPS

UNSAFE_HINT = "use a target.workdir that only the deploying user can write"


def known(op: str) -> None:
    """`op` is a name of the helper's one table of operations (protocol.OPS), or a ValueError here: a
    misspelt op is this deployer's bug, found before anything is sent."""
    if op not in OPS:
        raise ValueError(f"{op!r} is not an operation of the deployer helper (protocol.OPS)")


def _line(*words: str) -> str:
    return " ".join([SUPERVISOR_PYTHON, "-", *(shlex.quote(w) for w in words)])


class ProgramHelper(Helper):
    """base.Helper over `remote`'s exec channels (see the module's docstring)."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote

    def supervise(self, argv: Sequence[str], timeout: float) -> Result:
        """A supervisor command from this deployer's payload, sent over stdin (nothing on disk is used)."""
        return self.remote.run(_line("supervise", *argv), timeout=timeout, check=False, stdin=payload_bundle()[0])

    def snapshot(self, argv: Sequence[str], timeout: float) -> dict[str, Any]:
        """The helper's `snapshot` request, answered by this deployer's copy of the helper (a program of its own)."""
        what = f"cannot read {argv[0] if argv else 'a snapshot'}"
        try:
            reply = self.call("snapshot", {"argv": list(argv)}, timeout, what)
        except CommandTimedOut:  # its message would quote the output so far: an env file's text, maybe
            raise TargetError(f"{what} on {self.remote.label}: no answer within {timeout:g} s") from None
        except HelperRefused as e:  # the helper's own words: a usage error, a dir it cannot read
            raise TargetError(f"{what} on {self.remote.label}: {e.said}") from None
        data = reply.get("data")
        if not isinstance(data, dict):
            raise TargetError(f"{what} on {self.remote.label}: the snapshot was not JSON")
        return data

    def call(self, op: str, fields: dict[str, Any], wait_s: float, what: str) -> dict[str, Any]:
        """One helper request answered by this deployer's copy of the helper, as a program of its own."""
        known(op)
        request = json.dumps({"id": 0, "op": op, **fields})
        result = self.remote.run(_line("request", request), timeout=wait_s, check=False, stdin=payload_bundle()[0])
        try:
            reply = json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            reply = None
        if not isinstance(reply, dict):
            tail = " | ".join(result.stderr.strip().splitlines()[-2:]) or f"exit {result.exit_code}"
            raise TargetError(f"{what} on {self.remote.label}: {tail}")
        if not reply.get("ok"):
            said = str(reply.get("error"))
            raise HelperRefused(f"{what} on {self.remote.label}: the deployer helper said: {said}", said,
                                str(reply.get("kind") or ""))
        return reply

    def mkdirs(self, path: str, owned_from: str) -> None:
        """The helper's `mkdirs` request as a program of its own; TargetError (one line, nothing written) when it
        refuses."""
        label = self.remote.label
        try:
            self.call("mkdirs", {"path": path, "owned_from": owned_from}, 20.0, f"cannot create {path}")
        except HelperRefused as e:
            if e.kind == "unsafe":
                raise TargetError(f"unsafe workdir on {label}: {e.said}; nothing was written",
                                  hint=UNSAFE_HINT) from None
            raise TargetError(f"cannot create {path} on {label}: {e.said}",
                              hint="check target.workdir and its permissions") from None

