"""The supervisor's files as a deployment's root holds them (remote/program.py: the payload, `payload/<sha256>.py`,
and the entry files that name its hash and run one module's main from it: `supervise.py`, `supervise_guard.py`,
`supervise_lease.py`), for tests that run them as the target does (`python3 -B supervise.py start RUN`); and the snapshot as a program of its own (on the target the helper
answers it). Built once per content into a folder named by its hash, each file written atomically: tests running in
parallel share it and never see a half-written file."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from deployer.remote.program import ROOT_ENTRIES, RUN_DIR_ENTRIES, payload_bundle, payload_files, payload_name, program


def _files() -> dict[str, bytes]:
    return {payload_name(): payload_bundle()[0], **payload_files(ROOT_ENTRIES, in_run_dir=False),
            "snapshot.py": program(("snapshot",))}


def payload_program(name: str) -> Path:
    """The path of the file `name` (`supervise.py`), written with its siblings if they are not there yet."""
    files = _files()
    digest = hashlib.sha256(b"".join(hashlib.sha256(data).digest() for _, data in sorted(files.items()))).hexdigest()
    folder = Path(tempfile.gettempdir()) / f"deployer-test-payload-{os.geteuid()}" / digest
    if not all((folder / n).is_file() and (folder / n).read_bytes() == data for n, data in files.items()):
        (folder / "payload").mkdir(parents=True, exist_ok=True, mode=0o755)
        for n, data in files.items():
            tmp = (folder / n).with_name(f".{(folder / n).name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.chmod(0o644)
            os.replace(tmp, folder / n)
    return folder / name


def hold_like_a_deployment(root: Path, run: Path) -> None:
    """`root` and its run dir `run` as a push leaves them: the payload once at root/payload/<sha256>.py, the run dir's
    entry files naming it (the @reboot entry and a guard run the run dir's own supervise.py)."""
    data, digest = payload_bundle()
    (root / "payload").mkdir(mode=0o700, exist_ok=True)
    held = root / "payload" / f"{digest}.py"
    if not held.exists():
        held.write_bytes(data)
        held.chmod(0o644)
    for name, text in payload_files(RUN_DIR_ENTRIES, in_run_dir=True).items():
        (run / name).write_bytes(text)
