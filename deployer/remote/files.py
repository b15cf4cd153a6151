"""`FileOps`: the typed file requests of the target-side helper (supervisor/supervise_files.py answers them): the
deployment dir's symlink, removals, free space and hashes, a new run dir, listings, a byte search in a log, the
kernel log, the lock's lease and retention's run summary. Each is one request with a typed reply instead of a shell
line; the ones that change something take `within` (the deployment dir) and the helper refuses a path outside it or
a symlink on the way (kind "unsafe").

Built on one primitive, `call(op, fields, wait_s, what)`: the Conversation's (its helper process), a bare
connection's ProgramHelper (one program per request, remote/oneshot.py) and the lock's GuardedHelper (the lock
checked first) all inherit these methods from it.
"""

from __future__ import annotations

import base64
from typing import Any

from deployer.errors import TargetError
from deployer.remote.base import DiskFacts, NewDir, NoLine

FILE_WAIT_S = 30.0
REMOVE_WAIT_S = 120.0


class FileOps:
    """The helper's file requests; subclasses give `call` (the helper's errors: HelperRefused, NoLine, ...)."""

    def call(self, op: str, fields: dict[str, Any], wait_s: float, what: str) -> dict[str, Any]:
        raise NotImplementedError

    def _ask(self, op: str, fields: dict[str, Any], what: str, wait_s: float = FILE_WAIT_S) -> dict[str, Any]:
        try:
            return self.call(op, fields, wait_s, what)
        except NoLine:
            raise TargetError(f"{what}: no answer from the deployer helper within {wait_s:g}s") from None

    def link(self, path: str, target: str, within: str) -> None:
        """`path` atomically replaced by a symlink to `target` (relative to its folder; the old link not followed)."""
        self._ask("link", {"path": path, "target": target, "within": within}, f"pointing {path} at {target}")

    def readlink(self, path: str) -> str | None:
        """Where the symlink `path` points; None when it is missing or not a symlink."""
        target = self._ask("readlink", {"path": path}, f"reading the link {path}").get("target")
        return target if isinstance(target, str) else None

    def remove(self, paths: list[str], within: str) -> int:
        """Remove files, symlinks and whole dirs below `within` (none followed, missing ones fine): how many went."""
        if not paths:
            return 0
        reply = self._ask("remove", {"paths": list(paths), "within": within}, f"removing {paths[0]}", REMOVE_WAIT_S)
        return int(reply.get("removed") or 0)

    def disk(self, path: str, files: list[str]) -> DiskFacts:
        """The free bytes under `path` and the sha256 of each of `files`, in one request."""
        reply = self._ask("disk", {"path": path, "files": list(files)}, f"reading the disk under {path}")
        free, digests = reply.get("free"), reply.get("digests") or []
        return DiskFacts(free if isinstance(free, int) else None,
                         [d if isinstance(d, str) else None for d in digests][:len(files)])

    def mkdir(self, path: str, within: str, need: int) -> NewDir:
        """A new 0700 dir `path` below `within`, made only when `need` bytes are free there (HelperRefused, kind
        "exists", when it exists)."""
        reply = self._ask("mkdir", {"path": path, "within": within, "need": need}, f"creating {path}")
        free = reply.get("free")
        return NewDir(bool(reply.get("made")), free if isinstance(free, int) else None)

    def listdir(self, path: str) -> list[str] | None:
        """The folder's entries, sorted, hidden ones left out; None when it cannot be listed."""
        names = self._ask("listdir", {"path": path}, f"listing {path}").get("names")
        return [str(n) for n in names] if isinstance(names, list) else None

    def find_bytes(self, path: str, needle: bytes, offset: int = 0) -> int | None:
        """The file offset of the first `needle` at or after `offset` (None: not found)."""
        reply = self._ask("find_bytes", {"path": path, "needle_b64": base64.b64encode(needle).decode("ascii"),
                                         "offset": offset}, f"searching {path}", 60.0)
        at = reply.get("at")
        return at if isinstance(at, int) else None

    def kernel_log(self, lines: int = 300) -> str:
        """The kernel ring buffer's last lines ("" when the target does not let this user read it)."""
        return str(self._ask("kernel_log", {"lines": lines}, "reading the kernel log").get("text") or "")

    def lease_show(self, path: str) -> dict[str, Any]:
        """The lock's lease as the target's clock judges it (`held`, `expires_in`, ...; {"held": False}: no file)."""
        lease = self._ask("lease_show", {"path": path}, f"reading the lock {path}").get("lease")
        if not isinstance(lease, dict):
            raise TargetError(f"reading the lock {path}: the deployer helper answered no lease")
        return lease

    def runs(self, path: str) -> dict[str, Any]:
        """Retention's summary of the runs dir `path`: {"runs": [{id, hash, ready, status, env}], "current"}."""
        return self._ask("runs", {"path": path}, f"listing the runs of {path}", 60.0)
