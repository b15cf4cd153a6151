"""Where each round trip of a command comes from: runs `deploy` in-process against an rc-cost test sshd and
prints every exec channel / SFTP session it opened with the deployer call site that opened it.

    .venv/bin/python bench/round_trips.py

Wraps SSHRemote's channel openers for this process only (deployer code is not changed) and cross-checks the
total against sshd's own log. Requests on the helper conversation (`req`: no channel, no login shell of their
own) are listed too, with their call sites. docs/round-trips.md is written from its output.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO, bench_profile  # noqa: E402
from sshbed import make_sshd  # noqa: E402

from deployer.cli.main import main as cli_main  # noqa: E402
from deployer.remote.conversation import Conversation  # noqa: E402
from deployer.remote.ssh.connection import SSHRemote  # noqa: E402

STANDIN_BIN = REPO / "tests" / "standin" / "bin"
SITES: list[str] = []
GUARDED = {"run", "put", "put_all", "read", "size", "request", "spawn"}  # lock.Guarded passes calls on


def _site() -> str:
    """The innermost deployer frame outside remote/ (what asked for the channel), and its caller."""
    frames = [f for f in traceback.extract_stack()[:-2] if "/deployer/" in f.filename and "/remote/" not in f.filename
              and not (f.filename.endswith("/lock.py") and f.name in GUARDED)]
    return " <- ".join(f"{Path(f.filename).relative_to(REPO)}:{f.lineno} {f.name}" for f in frames[-1:-3:-1])


def _wrap(name: str, kind: str, describe: Callable[..., str]) -> None:
    original = getattr(SSHRemote, name)

    def wrapped(self: SSHRemote, *args: Any, **kw: Any) -> Any:
        if kind != "sftp" or self._conn is None or getattr(self._conn, "_sftp", None) is None:
            SITES.append(f"{kind:<5} {describe(*args)[:60]:<60} {_site()}")
        return original(self, *args, **kw)

    setattr(SSHRemote, name, wrapped)


def _describe_request(op: str, fields: dict[str, Any]) -> str:
    what = fields.get("cmd") or fields.get("mode") or ",".join(str(p).rsplit("/", 1)[-1] for p in fields.get("paths", ()))
    return f"{op} {str(what or '').replace(chr(10), ' ')}"


def _wrap_requests() -> None:
    """Requests on the helper conversation (no login shell each: listed so the flow stays readable)."""
    original = Conversation.send

    def wrapped(self: Conversation, op: str, fields: dict[str, Any]) -> Any:
        SITES.append(f"{'req':<5} {_describe_request(op, fields)[:60]:<60} {_site()}")
        return original(self, op, fields)

    setattr(Conversation, "send", wrapped)


def install() -> None:
    _wrap("run", "exec", lambda cmd, *a, **k: cmd.replace("\n", " "))
    _wrap("spawn", "exec", lambda cmd, *a, **k: cmd.replace("\n", " "))
    _wrap("_sftp", "sftp", lambda *a, **k: "(SFTP session)")
    _wrap_requests()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def main() -> int:
    install()
    tmp = Path(tempfile.mkdtemp(prefix="deployer-rt-", dir="/tmp"))
    os.environ["DEPLOYER_HOME"] = str(tmp / "home")
    bed = make_sshd(tmp / "sshd", rc_cost=0.15)
    (bed.bin_dir / "nvidia-smi").symlink_to(STANDIN_BIN / "nvidia-smi")
    try:
        profile = str(bench_profile(tmp, bed, "rt", {}))
        flow = [["up", "--skip-preflight"], ["status"], ["logs", "-n", "5"], ["history"], ["down"], ["up"], ["down"]]
        for argv in flow:
            SITES.clear()
            offset = bed.log_offset()
            with quiet(), contextlib.suppress(SystemExit):
                cli_main([*argv, profile])
            print(f"\n## deploy {' '.join(argv)}: {bed.sessions_since(offset)} (sshd log)")
            for i, site in enumerate(SITES, 1):
                print(f"{i:3} {site}")
    finally:
        bed.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
