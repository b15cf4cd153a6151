"""Red team, issue #22 findings 1 and 2: another local user on the box plants directories, symlinks and programs
where deployer, running as root, creates, writes and runs things.

The attacker is the real unprivileged `nobody` (uid 65534), its actions run through `setpriv --reuid=65534
--regid=65534 --clear-groups`; deployer is the real CLI over the real sshd test bed, deploying the stand-in engine.
Every case keeps a root-only (0600) victim file the plant points at, and checks it is byte for byte and mode for mode
unchanged. Where deployer must refuse, it says so in one line (`error: ...`, no traceback) and exits 4 (a target
problem), having written nothing; where the plant no longer matters (the port claim is not a file any more, a
tampered compiled-code table is not loaded), the command does what it always did.
"""

from __future__ import annotations

import json
import marshal
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, free_port, write_profile
from deployer.remote.program import payload_bundle, supervisor_source
from deployer.supervisor import ports
from sshbed import SSHD, make_sshd

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                       reason="the red team needs root (to be the victim) and setpriv (to be nobody)"),
]

NOBODY = 65534
SECRET = "root only: nobody may read, write or replace this\n"
PWNED = "pwned"


def as_nobody(script: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """`script` under sh as the real unprivileged user nobody (no supplementary groups)."""
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
                           "sh", "-ec", script], capture_output=True, text=True, timeout=30, **kw)


class Victim:
    """A root-only file and what it must stay."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text(SECRET)
        path.chmod(0o600)
        self.before = self._seen()

    def _seen(self) -> tuple[bytes, int, int]:
        st = os.lstat(self.path)
        return self.path.read_bytes(), stat.S_IMODE(st.st_mode), st.st_uid

    def unchanged(self) -> bool:
        return self._seen() == self.before


@pytest.fixture()
def arena() -> Iterator[Path]:
    """A directory under /tmp that nobody can reach (0755, root's), holding the victim."""
    d = Path(tempfile.mkdtemp(prefix="deployer-redteam-", dir="/tmp"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture()
def victim(arena: Path) -> Victim:
    return Victim(arena / "victim")


def refused(proc: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a command that refused (exit 4, a target problem; no traceback)."""
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 4 and len(errors) == 1, (proc.returncode, proc.stderr)
    assert proc.stderr.strip().splitlines()[-1] == errors[0], proc.stderr
    return errors[0]


def up(tmp_path: Path, sshd: Any, workdir: Path, **kw: Any) -> tuple[Path, subprocess.CompletedProcess[str]]:
    prof = write_profile(tmp_path, sshd, name="demo", workdir=workdir, **kw)
    return prof, deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h", timeout=120)


def down(tmp_path: Path, prof: Path) -> None:
    deploy("down", str(prof), "--break-lock", home=tmp_path / "h", timeout=60)


def up_refused(tmp_path: Path, sshd: Any, workdir: Path) -> str:
    """`up` into `workdir` must refuse: its one error line (a deployment it made anyway is taken down first)."""
    prof, proc = up(tmp_path, sshd, workdir)
    if proc.returncode == 0:
        down(tmp_path, prof)
    return refused(proc)


# --- finding 1: the port claim ----------------------------------------------------------------------------------

LEGACY = Path("/dev/shm/deployer-ports")  # where the previous release kept its claim files


def test_a_claim_dir_planted_with_a_symlink_changes_nothing(tmp_path: Path, sshd: Any, victim: Victim) -> None:
    """nobody makes the old claim directory (or uses it, world-writable as the old release left it) and plants
    `<port> -> victim` in it: the claim is not a file any more, so `up` neither follows nor writes it, and status
    and down work with the old-kind directory there."""
    port = free_port()
    planted = as_nobody(f"mkdir -p -m 0777 {LEGACY} 2>/dev/null || true; ln -s {victim.path} {LEGACY}/{port}")
    if planted.returncode != 0:
        pytest.skip(f"{LEGACY} exists and nobody cannot write it: {planted.stderr.strip()}")
    prof = None
    try:
        prof, proc = up(tmp_path, sshd, tmp_path / "work", port=port)
        assert proc.returncode == 0, proc.stderr
        assert victim.unchanged()
        assert os.path.islink(LEGACY / str(port))  # not followed, not replaced
        status = deploy("status", str(prof), home=tmp_path / "h")
        assert status.returncode == 0, status.stderr
        gone = deploy("down", str(prof), home=tmp_path / "h")
        assert gone.returncode == 0, gone.stderr
        prof = None
        assert victim.unchanged()
    finally:
        if prof is not None:
            down(tmp_path, prof)
        as_nobody(f"rm -f {LEGACY}/{port}; rmdir {LEGACY} 2>/dev/null || true")


def _claim_as_nobody(arena: Path, port: int) -> subprocess.Popen[str]:
    """nobody's own deployment, as far as the claim goes: ports' claim_port, held while it sleeps."""
    lib = arena / "lib"
    lib.mkdir(exist_ok=True)
    (lib / "ports.py").write_text(supervisor_source("ports"))
    lib.chmod(0o755)
    code = (f"import sys, time; sys.path.insert(0, {str(lib)!r}); import ports as p; "
            f"fd = p.claim_port({port}, '/home/nobody/work/theirs/runs/r1', 'theirs'); print('held', flush=True); "
            "time.sleep(60)")
    proc = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
                             sys.executable, "-B", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd="/")
    assert proc.stdout is not None and proc.stdout.readline() == "held\n", proc.stderr.read() if proc.stderr else ""
    return proc


def _claim_holder_line(port: int, pid: int) -> str:
    return f"a process of user nobody (uid {NOBODY}, pid {pid}), not a deployment of root"


def test_claims_stay_host_wide_across_users_and_name_the_holder(arena: Path) -> None:
    """Another user's claim still stops ours (no collision during a long load), and names that user: its note says
    what that user wants (issue 34), so it is never shown as a deployment."""
    port = free_port()
    theirs = _claim_as_nobody(arena, port)
    try:
        with pytest.raises(ports.PortTaken) as taken:
            ports.claim_port(port, "/root/work/ours/runs/r2", "ours")
        assert str(taken.value) == f"port {port} taken by {_claim_holder_line(port, theirs.pid)}"
        assert ports.claimed_by(port) == _claim_holder_line(port, theirs.pid)
    finally:
        theirs.kill()
        theirs.wait(timeout=5)
        as_nobody(f"rm -f {ports._note_path(port, NOBODY)}")
    os.close(ports.claim_port(port, "/root/work/ours/runs/r2", "ours"))  # freed by the kernel with its holder


FORGED = {"run_dir": "/evil\x1b]8;;http://x\x07", "name": "\x1b[2Jforged"}


def _plant_note(port: int, uid: int, info: dict[str, Any]) -> None:
    """nobody writes a note under `uid`'s name; the planting must succeed (else the test proves nothing)."""
    note = ports._note_path(port, uid)
    planted = as_nobody(f"printf '%s' {json.dumps(json.dumps({**info, 'port': port}))} > {note}")
    assert planted.returncode == 0, planted.stderr
    st = os.lstat(note)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == NOBODY


def test_a_forged_note_never_names_roots_claim(arena: Path) -> None:
    """root holds the claim before its note is written; nobody plants notes under root's name and its own:
    neither is believed (the owner check of the note)."""
    port = free_port()
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    claim.bind(ports._address(port))
    claim.listen(4)
    try:
        for uid in (0, NOBODY):
            _plant_note(port, uid, FORGED)
        assert ports.claimed_by(port) == "another deployment"
        # root writes its own note (the old one goes, renamed over) and is named by it
        ports._write_note(port, {"port": port, "run_dir": "/root/work/ours/runs/r1", "name": "ours"})
        assert ports.claimed_by(port) == "deployment ours (/root/work/ours/runs/r1)"
    finally:
        claim.close()
        as_nobody(f"rm -f {ports._note_path(port, NOBODY)}")
        for left in (ports._note_path(port, 0),):
            if os.path.lexists(left):
                os.unlink(left)


def test_another_users_claim_with_a_note_naming_roots_deployment_names_that_user(arena: Path) -> None:
    """nobody takes the claim of the port root's deployment uses and writes a note saying it is root's
    deployment `demo`: root is told the port is held by user nobody, never "taken by deployment demo"."""
    port = free_port()
    theirs = _claim_as_nobody(arena, port)
    try:
        _plant_note(port, NOBODY, {"run_dir": "/root/work/demo/runs/r1", "name": "demo"})
        said = ports.claimed_by(port)
        assert said == _claim_holder_line(port, theirs.pid), said
        with pytest.raises(ports.PortTaken) as taken:
            ports.claim_port(port, "/root/work/demo/runs/r2", "demo")
        assert "deployment" not in str(taken.value).replace("not a deployment of root", "")
        assert "user nobody (uid 65534" in str(taken.value)
    finally:
        theirs.kill()
        theirs.wait(timeout=5)
        as_nobody(f"rm -f {ports._note_path(port, NOBODY)}")


def test_a_note_is_never_written_through_a_planted_link(arena: Path, victim: Victim,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """nobody plants root's next temp note name (made predictable here) and root's note name itself as links to
    the victim: the claim writes neither through them."""
    port = free_port()
    monkeypatch.setattr(ports.os, "urandom", lambda n: b"\x00" * n)
    name = os.path.basename(ports._note_path(port, 0))
    tmp = os.path.join(ports.SHM, ".%s.%d.%s.tmp" % (name, os.getpid(), "00" * 4))
    planted = as_nobody(f"ln -s {victim.path} {tmp}")
    assert planted.returncode == 0 and os.path.islink(tmp), planted.stderr
    try:
        fd = ports.claim_port(port, "/root/work/ours/runs/r1", "ours")
        os.close(fd)
        assert victim.unchanged()
    finally:
        as_nobody(f"rm -f {tmp}")
        if os.path.lexists(ports._note_path(port, 0)):
            os.unlink(ports._note_path(port, 0))


# --- finding 2: the workdir, the deployment dir and the lock ----------------------------------------------------

def test_a_workdir_owned_by_another_user_is_refused(tmp_path: Path, sshd: Any, arena: Path,
                                                   victim: Victim) -> None:
    shared = arena / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    workdir = shared / "w"
    as_nobody(f"mkdir -m 0777 {workdir} {workdir}/demo; ln -s {victim.path} {workdir}/demo/lock")
    line = up_refused(tmp_path, sshd, workdir)
    assert f"{workdir} is owned by nobody, not root" in line, line
    assert victim.unchanged()
    assert sorted(os.listdir(workdir / "demo")) == ["lock"]  # nothing was written there


def test_a_deployment_dir_planted_in_a_shared_sticky_workdir_is_refused(tmp_path: Path, sshd: Any, arena: Path,
                                                                      victim: Victim) -> None:
    """The workdir is root's and sticky (like /tmp): nobody makes `<workdir>/demo` first, with `lock -> victim`."""
    workdir = arena / "sticky"
    workdir.mkdir()
    workdir.chmod(0o1777)
    as_nobody(f"mkdir -m 0777 {workdir}/demo; ln -s {victim.path} {workdir}/demo/lock")
    line = up_refused(tmp_path, sshd, workdir)
    assert f"{workdir}/demo is owned by nobody, not root" in line, line
    assert victim.unchanged()
    assert sorted(os.listdir(workdir / "demo")) == ["lock"]


def test_a_lock_symlink_is_never_followed(tmp_path: Path, sshd: Any, arena: Path, victim: Victim) -> None:
    """A `lock -> victim` symlink in root's own deployment dir (left there while the dir was shared, say)."""
    workdir = arena / "mine"
    (workdir / "demo").mkdir(parents=True)
    (workdir / "demo" / "lock").symlink_to(victim.path)
    line = up_refused(tmp_path, sshd, workdir)
    assert f"the lock {workdir}/demo/lock is a symbolic link" in line, line
    assert victim.unchanged()


@pytest.mark.parametrize("mode, gid", [(0o777, 0), (0o775, NOBODY)], ids=["world-writable", "group-writable"])
def test_a_workdir_under_a_writable_parent_without_sticky_is_refused(tmp_path: Path, sshd: Any, arena: Path,
                                                                     victim: Victim, mode: int, gid: int) -> None:
    """nobody can write the workdir's parent (no sticky bit): it puts its own dir there as the workdir."""
    parent = arena / "pub"
    parent.mkdir()
    os.chown(parent, 0, gid)
    parent.chmod(mode)
    theirs = arena / "theirs"
    theirs.mkdir(mode=0o777)
    theirs.chmod(0o777)
    as_nobody(f"mkdir -m 0777 {theirs}/w {theirs}/w/demo; ln -s {victim.path} {theirs}/w/demo/lock; "
              f"ln -s {theirs}/w {parent}/w")
    line = up_refused(tmp_path, sshd, parent / "w")
    assert f"{parent} is writable by" in line and "without the sticky bit" in line, line
    assert victim.unchanged()
    assert sorted(os.listdir(theirs / "w" / "demo")) == ["lock"]


# --- finding 2: what deployer runs on the target is its own verified copy ---------------------------------------

EVIL_LEASE = """import sys
open({victim!r}, "a").write("{pwned} by the lease program on disk\\n")
print('LEASE {{"held": false}}', flush=True)
"""


def test_a_swapped_lease_program_is_never_run(tmp_path: Path, sshd: Any, victim: Victim) -> None:
    """The deployment's `supervise_lease.py` is replaced by a program that writes the victim, while the lock holds
    a live lease (an `up` in flight): `status` (which asks the lease how long it has left) and `down` never run it."""
    prof, proc = up(tmp_path, sshd, tmp_path / "work")
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "work" / "demo"
    try:
        now = time.time()
        lease = {"owner": "mallory@elsewhere", "pid": 4242, "host_id": "elsewhere/boot", "command": "up",
                 "token": "f" * 32, "since": now, "lease_s": 600, "renewed_at": now, "expires_at": now + 600}
        body = json.dumps(lease).encode()
        (root / "lock").write_bytes(body + b"\n" + b" " * (2048 - len(body) - 1))
        (root / "supervise_lease.py").write_text(EVIL_LEASE.format(victim=str(victim.path), pwned=PWNED))
        status = deploy("status", str(prof), "--json", home=tmp_path / "h")
        assert status.returncode == 0, status.stderr
        assert "mallory@elsewhere" in json.loads(status.stdout)["lock"]["text"]  # deployer's own copy answered
        assert victim.unchanged()
        busy = deploy("down", str(prof), home=tmp_path / "h")
        assert "deployment is locked by mallory@elsewhere" in refused(busy)
        assert victim.unchanged()
    finally:
        down(tmp_path, prof)
    assert victim.unchanged()


@pytest.fixture()
def own_home_sshd(arena: Path) -> Iterator[SSHD]:
    """A private sshd whose sessions' HOME (and so the helper cache) lies in the arena, reachable by nobody."""
    bed = make_sshd(arena / "sshd", rc_cost=0.0)
    try:
        yield bed
    finally:
        bed.stop()


def _cache(bed: SSHD) -> Path:
    assert bed.home is not None
    return bed.home / ".cache" / "deployer"


def _evil_table(python: str, victim: Path) -> bytes:
    """A compiled-code table (the previous release's format: a bare marshal of name -> code) whose helper module
    writes the victim before it serves, built by the target's own interpreter."""
    future = "from __future__ import annotations\n"
    source = supervisor_source("helper").replace(
        future, future + f"open({str(victim)!r}, 'a').write('{PWNED} by the code table\\n')\n", 1)
    code = ("import marshal, sys; src = sys.stdin.read(); "
            "sys.stdout.buffer.write(marshal.dumps({'helper': compile(src, 'x', 'exec')}))")
    return subprocess.run([python, "-c", code], input=source.encode(), capture_output=True, check=True,
                          timeout=30).stdout


def test_a_tampered_code_table_is_never_loaded(tmp_path: Path, own_home_sshd: SSHD, victim: Victim) -> None:
    """The helper's compiled-code table beside the cached helper is replaced (old format, and with a made-up hash in
    front): the next command's helper compiles its modules again instead of running the table's code."""
    bed = own_home_sshd
    prof = write_profile(tmp_path, bed, name="demo", workdir=tmp_path / "work")
    first = deploy("status", str(prof), home=tmp_path / "h")
    tables = sorted(_cache(bed).glob(f"helper-{payload_bundle()[1]}.*.code"))
    assert len(tables) == 1, first.stderr
    python = (_cache(bed) / "python").read_text().strip()
    evil = _evil_table(python, victim.path)
    for planted in (evil, os.urandom(32) + evil):
        tables[0].write_bytes(planted)
        again = deploy("status", str(prof), home=tmp_path / "h")
        assert (again.returncode, again.stderr) == (first.returncode, first.stderr)
        assert victim.unchanged()
        assert tables[0].read_bytes() != planted  # compiled again and saved, under the cache's own key


def test_a_cache_another_user_can_write_is_not_used(tmp_path: Path, own_home_sshd: SSHD, victim: Victim) -> None:
    """The helper cache made world-writable: nobody plants an interpreter record (`python` -> its script) and a
    code table; deployer runs neither (it runs the helper from memory and finds python3 on PATH)."""
    bed = own_home_sshd
    prof = write_profile(tmp_path, bed, name="demo", workdir=tmp_path / "work")
    first = deploy("status", str(prof), home=tmp_path / "h")
    cache = _cache(bed)
    table = next(cache.glob(f"helper-{payload_bundle()[1]}.*.code"))
    evil = _evil_table((cache / "python").read_text().strip(), victim.path)
    cache.chmod(0o777)
    (victim.path.parent / "evil.code").write_bytes(evil)
    (victim.path.parent / "evil.code").chmod(0o644)
    script = cache / "evil-python"
    planted = as_nobody(f"printf '#!/bin/sh\\necho {PWNED} by the interpreter record >> {victim.path}\\n"
                        f"exec python3 \"$@\"\\n' > {script}; chmod 755 {script}; rm -f {cache}/python; "
                        f"echo {script} > {cache}/python; rm -f {table}; cat {victim.path.parent}/evil.code > {table}")
    assert planted.returncode == 0, planted.stderr
    again = deploy("status", str(prof), home=tmp_path / "h")
    assert (again.returncode, again.stderr) == (first.returncode, first.stderr)
    assert victim.unchanged()


def test_the_claim_socket_is_freed_with_its_last_holder() -> None:
    """The claim is a kernel object: nothing of it outlives its holders (no file left to plant or to age out)."""
    port = free_port()
    fd = ports.claim_port(port, "/w/runs/r", "once")
    os.close(fd)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(b"\0deployer-port-%d" % port)  # free again at once
    os.close(ports.claim_port(port, "/w/runs/r", "twice"))
