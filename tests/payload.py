"""The supervisor's files as a deployment holds them (remote/program.py: `supervise.py`, one program, and the entry
files `supervise_guard.py`, `supervise_lease.py` that run it for another module), for tests that run them as the
target does (`python3 -B supervise.py start RUN`); and the snapshot as a program of its own (on the target the helper
answers it). Built once per content into a folder named by its hash, each file written atomically: tests running in
parallel share it and never see a half-written file."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from deployer.remote.program import ROOT_ENTRIES, payload_files, program


def _files() -> dict[str, bytes]:
    return {**payload_files(ROOT_ENTRIES), "snapshot.py": program(("snapshot",))}


def payload_program(name: str) -> Path:
    """The path of the file `name` (`supervise.py`), written with its siblings if they are not there yet."""
    files = _files()
    digest = hashlib.sha256(b"".join(hashlib.sha256(data).digest() for _, data in sorted(files.items()))).hexdigest()
    folder = Path(tempfile.gettempdir()) / f"deployer-test-payload-{os.geteuid()}" / digest
    if not all((folder / n).is_file() and (folder / n).read_bytes() == data for n, data in files.items()):
        folder.mkdir(parents=True, exist_ok=True, mode=0o755)
        for n, data in files.items():
            tmp = folder / f".{n}.{os.getpid()}.tmp"
            tmp.write_bytes(data)
            tmp.chmod(0o644)
            os.replace(tmp, folder / n)
    return folder / name
