"""The helper conversation (deployer/remote/conversation.py) over the real sshd: one exec channel for everything,
the helper shipped once and kept by its content hash, a login shell that talks, a target without python3, a link
that drops mid-command, requests that do not wait for each other. The Remote contract itself (run, put_all, ...)
is tests/integration/test_remote.py's, which runs over a Conversation too."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployer.errors import ConnectFailed, TargetError
from deployer.box.lock import DeploymentLock
from deployer.box.push import Layout
from deployer.remote.base import Remote, Session
from deployer.host import TargetSpec
from deployer.remote.connect import connect
from deployer.remote.conversation import HELPERS_KEPT, PROGRAM_MARKER, Conversation, start_line
from deployer.remote.program import SUPERVISOR_PYTHON, payload_bundle
from deployer.remote.ssh.connection import SSHRemote
from sshbed import SSHD

pytestmark = pytest.mark.integration

CACHED = '"${XDG_CACHE_HOME:-$HOME/.cache}/deployer/helper-%s.py"' % payload_bundle()[1]
RECORD = '"${XDG_CACHE_HOME:-$HOME/.cache}/deployer/python"'


@pytest.fixture
def ssh(sshd: SSHD) -> Iterator[SSHRemote]:
    r = SSHRemote(sshd.spec())
    try:
        yield r
    finally:
        r.close()


def test_first_contact_ships_the_helper_in_the_same_exec_and_later_ones_reuse_it(ssh: SSHRemote, sshd: SSHD) -> None:
    payload, digest = payload_bundle()
    ssh.run(f"rm -f {CACHED}")
    offset = sshd.log_offset()
    first = Conversation.open(ssh)
    try:
        assert first.shipped == 1 and first.version == digest
        assert first.run("echo $((6 * 7))").stdout == "42\n"
        assert first.run(f"sha256sum {CACHED}").stdout.split()[0] == digest  # stored, intact
    finally:
        first.close()
    again = Conversation.open(ssh)
    try:
        assert again.shipped == 0 and again.run("true").ok
    finally:
        again.close()
    seen = sshd.sessions_since(offset)
    assert (seen.exec, seen.sftp) == (2, 0), seen  # one exec channel per conversation, nothing else


def test_a_damaged_cached_helper_is_replaced(ssh: SSHRemote) -> None:
    ssh.run(f"mkdir -p $(dirname {CACHED}) && printf 'import sys; sys.exit(9)' > {CACHED}")
    conv = Conversation.open(ssh)
    try:
        assert conv.shipped == 1 and conv.run("echo ok").stdout == "ok\n"
    finally:
        conv.close()
    assert hashlib.sha256(ssh.run(f"cat {CACHED}").stdout.encode()).hexdigest() == payload_bundle()[1]


def test_the_interpreter_is_recorded_and_used_while_it_exists(ssh: SSHRemote, tmp_path: Path) -> None:
    """`python3` on PATH may be a pyenv shim (a bash script, ~50 ms a start): the helper records the interpreter it
    ran under, and the helper's start line and every supervisor command line use that while it is executable."""
    ssh.run(f"rm -f {RECORD}")
    conv = Conversation.open(ssh)
    try:
        real = str(conv.hello["python"])
        assert conv.run(f"cat {RECORD}").stdout == real + "\n"
        wrapper, calls = tmp_path / "py", tmp_path / "calls"  # the sshd runs on this machine: same files
        wrapper.write_text(f"#!/bin/sh\necho used >> {calls}\nexec {real} \"$@\"\n")
        wrapper.chmod(0o755)
        conv.run(f"echo {wrapper} > {RECORD}")
        out = conv.run(f"{SUPERVISOR_PYTHON} -c 'print(42)'").stdout
        assert out == "42\n" and calls.read_text() == "used\n"
    finally:
        conv.close()
    again = Conversation.open(ssh)  # started through the wrapper, which exec's the real one: that is recorded
    try:
        assert calls.read_text() == "used\nused\n"
        assert again.run(f"cat {RECORD}").stdout == real + "\n"
        again.run(f"echo /nonexistent/python3 > {RECORD}")
    finally:
        again.close()
    third = Conversation.open(ssh)  # a record that is no longer executable: found on PATH again, recorded anew
    try:
        assert third.run(f"cat {RECORD}").stdout == real + "\n"
    finally:
        third.close()


def test_compiled_modules_are_kept_beside_the_helper_and_a_damaged_table_is_rebuilt(ssh: SSHRemote) -> None:
    codes = CACHED[:-4] + '".*.code'  # helper-<sha256>.cpython-XY.code
    ssh.run(f"rm -f {codes}")
    Conversation.open(ssh).close()
    listed = ssh.run(f"ls {codes}").stdout.split()
    assert len(listed) == 1
    size = int(ssh.run(f"stat -c %s {listed[0]}").stdout)
    assert size > 10_000  # every module's code, marshalled
    ssh.run(f"printf 'garbage' > {listed[0]}")
    conv = Conversation.open(ssh)
    try:
        assert conv.run("echo still-starts").stdout == "still-starts\n"
        assert int(conv.run(f"stat -c %s {listed[0]}").stdout) == size  # compiled again and saved
    finally:
        conv.close()


def test_an_unwritable_cache_runs_the_helper_from_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not-a-dir"))
    local = connect(TargetSpec("local"))
    conv = Conversation.open(local)
    try:
        assert conv.shipped == 1 and conv.run("echo from-memory").stdout == "from-memory\n"
        receiver = conv.helper.program("push")   # a program op: the helper runs itself again, from the same memory
        receiver.send(b"{}\n")
        assert json.loads(receiver.readline(30) or "{}")["error"] == "request"   # push.py's own answer
        assert receiver.readline(30) is None    # and its end
        receiver.close()
    finally:
        conv.close()


class Prefixed:
    """A Remote whose exec channels first run `prefix` (a login shell's rc file that prints, a PATH without
    python3)."""

    def __init__(self, inner: Remote, prefix: str) -> None:
        self.inner, self.prefix, self.label = inner, prefix, inner.label

    def spawn(self, cmd: str) -> Session:
        return self.inner.spawn(f"{self.prefix}\n{cmd}")

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_a_login_shell_that_prints_does_not_confuse_the_conversation(ssh: SSHRemote) -> None:
    chatty = Prefixed(ssh, "echo '(base) conda: environment activated'; echo '{\"not\": \"the helper\"}'")
    conv = Conversation.open(chatty)  # type: ignore[arg-type]
    try:
        assert conv.run("echo fine").stdout == "fine\n"
    finally:
        conv.close()


def test_a_target_without_python3_is_one_clear_error(ssh: SSHRemote) -> None:
    ssh.run(f"rm -f {RECORD}")  # a target that never ran python has no interpreter record either
    bare = Prefixed(ssh, "PATH=/nonexistent")
    t0 = time.monotonic()
    with pytest.raises(TargetError, match="deployer helper did not start on .*python3") as e:
        Conversation.open(bare)  # type: ignore[arg-type]
    assert e.value.hint and "python3" in e.value.hint
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("cached", [False, True])
def test_requests_sent_before_the_hello_are_answered(ssh: SSHRemote, cached: bool) -> None:
    """A command's first requests go out with the exec (one round trip less on a real link); when the target asks
    for the program, the loader keeps the lines that came before it for the helper."""
    if not cached:
        ssh.run(f"rm -f {CACHED}")
    else:
        Conversation.open(ssh).close()
    conv = Conversation.open(ssh, wait=False)
    try:
        first = conv.send("run", {"cmd": "echo early", "timeout": 10})
        second = conv.send("run", {"cmd": "echo second", "timeout": 10})
        assert conv.hello == {}  # nothing awaited yet: both lines are on their way with the exec
        assert conv.wait(second, 30, "second")["stdout"] == "second\n"
        assert conv.wait(first, 30, "first")["stdout"] == "early\n"
        assert conv.shipped == (0 if cached else 1) and conv.starts == 1
        assert conv.run("echo after").stdout == "after\n"
    finally:
        conv.close()


def test_a_helper_that_cannot_start_fails_the_requests_sent_ahead(ssh: SSHRemote) -> None:
    ssh.run(f"rm -f {RECORD}")
    conv = Conversation.open(Prefixed(ssh, "PATH=/nonexistent"), wait=False)  # type: ignore[arg-type]
    try:
        waiting = conv.send("run", {"cmd": "true", "timeout": 5})
        with pytest.raises(TargetError, match="deployer helper did not start"):
            conv.wait(waiting, 10, "true")
    finally:
        conv.close()


def test_requests_do_not_wait_for_each_other(ssh: SSHRemote) -> None:
    conv = Conversation.open(ssh)
    try:
        slow: list[str] = []
        worker = threading.Thread(target=lambda: slow.append(conv.run("sleep 2; echo slow").stdout))
        worker.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        assert conv.run("echo fast").stdout == "fast\n"
        assert time.monotonic() - t0 < 1.0
        worker.join(timeout=10)
        assert slow == ["slow\n"]
    finally:
        conv.close()


def test_a_link_lost_mid_command_is_connect_failed_and_the_next_call_starts_a_new_helper(fresh_sshd: SSHD) -> None:
    with SSHRemote(fresh_sshd.spec()) as r:
        conv = Conversation.open(r)
        killer = threading.Timer(0.5, fresh_sshd.restart)
        killer.start()
        t0 = time.monotonic()
        try:
            with pytest.raises(ConnectFailed, match="connection lost"):
                conv.run("sleep 30", timeout=20)
        finally:
            killer.join()
        assert time.monotonic() - t0 < 5
        deadline = time.monotonic() + 10
        while True:  # the restarted sshd takes a moment to listen again
            try:
                assert conv.run("echo back").stdout == "back\n"
                break
            except ConnectFailed:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert conv.starts == 2
        conv.close()


def test_start_line_is_one_shell_line_that_holds_no_secret_and_no_program() -> None:
    line = start_line()
    # the loader only (~2 KB: verify, store, record the interpreter, load compiled code); the program (~90 KB)
    # travels over stdin
    assert len(line) < 3000 < len(payload_bundle()[0]) and "lease" not in line


def test_a_helper_start_runs_no_site_code_and_imports_only_what_it_uses(tmp_path: Path) -> None:
    """The helper (and every python of the payload) starts without `site` (-S): a .pth file in a site-packages dir
    runs nothing in it; and it imports only the modules it runs: not the program ops' (fetch, push) nor
    http.client (a third of a start's imports) until a request needs them."""
    python = subprocess.run(["bash", "-c", "command -v python3"], capture_output=True, text=True).stdout.strip()
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONUSERBASE=str(tmp_path / "userbase"),
               MARK=str(tmp_path / "site-ran"), PYTHONPROFILEIMPORTTIME="1")
    user_site = subprocess.run([python, "-c", "import site; print(site.getusersitepackages())"], env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
    Path(user_site).mkdir(parents=True)
    Path(user_site, "zz_mark.pth").write_text("import os; open(os.environ['MARK'], 'a').write('ran')\n")
    subprocess.run([python, "-c", "pass"], env=env, check=True)
    assert (tmp_path / "site-ran").exists()        # the bed can tell: a python with site runs the .pth
    (tmp_path / "site-ran").unlink()
    payload, _ = payload_bundle()
    done = subprocess.run(["bash", "-c", start_line()], input=f"{PROGRAM_MARKER} {len(payload)}\n".encode() + payload,
                          env=env, capture_output=True, timeout=60)
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert b'"hello"' in done.stdout and "deployer_supervisor.helper" in imported, done.stderr[-2000:]
    assert not (tmp_path / "site-ran").exists()
    assert not {"site", "http.client", "urllib.request", "deployer_supervisor.fetch",
                "deployer_supervisor.push"} & imported


def test_storing_a_new_helper_keeps_only_the_newest_versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "xdg" / "deployer"
    cache.mkdir(parents=True)
    for i in range(7):  # helpers older deployers left, oldest first
        old = cache / f"helper-{i:064x}.py"
        old.write_text("# an older helper\n")
        os.utime(old, (1_000_000 + i, 1_000_000 + i))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    conv = Conversation.open(connect(TargetSpec("local")))
    try:
        assert conv.shipped == 1
    finally:
        conv.close()
    kept = sorted(p.name for p in cache.glob("helper-*.py"))
    assert len(kept) == HELPERS_KEPT and f"helper-{payload_bundle()[1]}.py" in kept
    assert f"helper-{6:064x}.py" in kept and f"helper-{0:064x}.py" not in kept  # the oldest went


def test_the_lock_over_a_conversation_survives_its_helper_being_killed(ssh: SSHRemote, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The helper holds the lease file for the lock; killed (OOM killer, a cleanup job), the next heartbeat starts
    a new helper that re-takes the same lease with the token; nobody else could take it meanwhile."""
    monkeypatch.setenv("DEPLOYER_LOCK_LEASE_S", "3")
    layout = Layout(str(tmp_path / "dep"))
    conv = Conversation.open(ssh)
    said: list[str] = []
    try:
        with DeploymentLock(conv, layout, "up", notify=said.append) as lock:
            first = conv.hello["pid"]
            ssh.run(f"kill -9 {first}")  # from outside the conversation
            deadline = time.monotonic() + 10
            while not said and time.monotonic() < deadline:
                time.sleep(0.1)
            assert said == ["the connection dropped; re-took the same deployment lock and carried on"]
            lock.ensure()  # still ours
            assert conv.starts == 2 and conv.hello["pid"] != first
            lease = json.loads((tmp_path / "dep" / "lock").read_text())
            assert lease["token"] == lock.token and lease["expires_at"] > time.time()
        assert json.loads((tmp_path / "dep" / "lock").read_text()).get("released_at")
    finally:
        conv.close()
