"""Behaviour of the remote seam against a real sshd (SSHRemote) and this machine (LocalRemote)."""

from __future__ import annotations

import hashlib
import threading
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

from deployer.errors import (
    AuthFailed,
    CommandFailed,
    ConnectFailed,
    HostKeyMismatch,
    HostKeyUnknown,
    NotFound,
    RemoteError,
    TransferFailed,
)
from deployer.remote.base import CommandTimedOut, EndpointUnreachable, Remote
from deployer.host import TargetSpec
from deployer.remote.connect import connect
from deployer.remote.conversation import Conversation
from deployer.remote.ssh.connection import SSHRemote
from sshbed import SSHD, free_port, keygen, make_sshd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

HTTP_SERVER = r"""
import http.server, sys, threading
class H(http.server.BaseHTTPRequestHandler):
    def _reply(self, code, body):
        self.send_response(code); self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Stand-In", "yes"); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        self._reply(200, b"ok") if self.path == "/health" else self._reply(404, b"no such path")
    def do_POST(self):
        self._reply(201, self.rfile.read(int(self.headers["Content-Length"])))
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()  # serve until our stdin closes
srv.shutdown()
"""


@pytest.fixture(params=["local", "ssh", "local+helper", "ssh+helper"])
def remote(request: pytest.FixtureRequest, sshd: SSHD) -> Iterator[Remote]:
    """Each Remote, and each with its commands sent to the target-side helper (remote/conversation.py, what `up`
    uses): the same contract either way."""
    r = connect(TargetSpec("local") if request.param.startswith("local") else sshd.spec())
    conv = Conversation.open(r) if request.param.endswith("+helper") else None
    try:
        yield conv or r
    finally:
        if conv is not None:
            conv.close()
        r.close()


def wait_for(pred: Callable[[], object], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


# -- run ------------------------------------------------------------------------------------------------


def test_run_returns_exit_code_and_both_streams(remote: Remote) -> None:
    r = remote.run("echo out; echo err >&2; printf 'h\\xc3\\xa9'; exit 3", check=False)
    assert (r.exit_code, r.ok) == (3, False)
    assert r.stdout == "out\nhé"
    assert r.stderr == "err\n"
    assert remote.run("true").ok


def test_run_check_raises_command_failed_with_result(remote: Remote) -> None:
    with pytest.raises(CommandFailed) as e:
        remote.run("echo boom >&2; exit 7")
    assert e.value.result.exit_code == 7
    assert "boom" in str(e.value) and "exit 7" in str(e.value)


def test_run_feeds_stdin_then_eof(remote: Remote) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB, more than one SSH window
    r = remote.run("sha256sum", stdin=data)
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    assert remote.run("cat").stdout == ""  # no stdin given: EOF at once, no hang


def test_run_timeout_is_bounded_and_kills_what_the_command_started(remote: Remote, tmp_path: Path) -> None:
    marker = tmp_path / "still-running"
    t0 = time.monotonic()
    with pytest.raises(CommandTimedOut) as e:
        remote.run(f"echo started; (sleep 1.5; touch {marker}) & sleep 30", timeout=0.5)
    assert time.monotonic() - t0 < 3
    assert e.value.result.stdout == "started\n"
    assert "timed out after 0.5s" in str(e.value)
    time.sleep(1.6)
    assert not marker.exists()  # the background child was killed with the command
    assert remote.run("echo next").stdout == "next\n"


# -- put ------------------------------------------------------------------------------------------------


def test_put_is_atomic_with_mode_and_hash(remote: Remote, tmp_path: Path) -> None:
    dest = tmp_path / "launch.sh"
    data = b"#!/bin/bash\necho hi\n"
    digest = remote.put(data, str(dest), 0o700)
    assert digest == hashlib.sha256(data).hexdigest()
    assert dest.read_bytes() == data
    assert stat.S_IMODE(dest.stat().st_mode) == 0o700
    assert remote.run(str(dest)).stdout == "hi\n"


def test_put_overwrites_and_leaves_no_temp_files(remote: Remote, tmp_path: Path) -> None:
    dest = tmp_path / "env"
    remote.put(b"old" * 1000, str(dest), 0o644)
    digest = remote.put(b"SECRET=1\n", str(dest), 0o600)
    assert dest.read_bytes() == b"SECRET=1\n"
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600
    assert digest == hashlib.sha256(b"SECRET=1\n").hexdigest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env"]


def test_put_of_empty_and_large_data(remote: Remote, tmp_path: Path) -> None:
    remote.put(b"", str(tmp_path / "empty"))
    assert (tmp_path / "empty").read_bytes() == b""
    big = os.urandom(3 << 20)
    assert remote.put(big, str(tmp_path / "big")) == hashlib.sha256(big).hexdigest()
    assert (tmp_path / "big").read_bytes() == big


@pytest.mark.parametrize("where", ["/nonexistent-dir/x", "/sys/deployer-test-file"])
def test_put_into_unwritable_place_raises_transfer_failed(remote: Remote, where: str) -> None:
    with pytest.raises(TransferFailed) as e:
        remote.put(b"data", where)
    msg = str(e.value)
    assert where in msg or os.path.dirname(where) in msg
    assert "No such file" in msg or "Permission denied" in msg
    assert not os.path.exists(where)


def test_put_all_places_every_file_after_one_verification(remote: Remote, tmp_path: Path) -> None:
    files = [(b"A=1\n", str(tmp_path / "env"), 0o600), (b"#!/bin/bash\necho ok\n", str(tmp_path / "run.sh"), 0o700),
             (os.urandom(1 << 20), str(tmp_path / "blob"), 0o644)]
    digests = remote.put_all(files)
    assert digests == [hashlib.sha256(data).hexdigest() for data, _, _ in files]
    for data, path, mode in files:
        assert Path(path).read_bytes() == data and stat.S_IMODE(Path(path).stat().st_mode) == mode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob", "env", "run.sh"]  # no temp file left


def test_put_all_with_one_unwritable_file_places_none(remote: Remote, tmp_path: Path) -> None:
    files = [(b"first", str(tmp_path / "first"), 0o644), (b"second", "/nonexistent-dir/second", 0o644)]
    with pytest.raises(TransferFailed) as e:
        remote.put_all(files)
    assert "/nonexistent-dir/second" in str(e.value)
    assert list(tmp_path.iterdir()) == []  # the first file's temp was removed, nothing renamed into place


# -- read / size ----------------------------------------------------------------------------------------


def test_read_incrementally_from_offsets(remote: Remote, tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"line one\nline two\n")
    assert remote.read(str(log)) == b"line one\nline two\n"
    assert remote.read(str(log), 5, 3) == b"one"
    offset = remote.size(str(log))
    assert offset == 18
    assert remote.read(str(log), offset) == b""
    with log.open("ab") as f:
        f.write(b"line three\n")
    assert remote.read(str(log), offset) == b"line three\n"
    assert remote.read(str(log), 1000) == b""


def test_read_after_truncation_returns_nothing_and_size_shrinks(remote: Remote, tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"x" * 5000)
    offset = len(remote.read(str(log)))
    log.write_bytes(b"restarted\n")  # truncated and rewritten between two polls
    assert remote.read(str(log), offset) == b""
    assert remote.size(str(log)) == 10
    assert remote.read(str(log), 0) == b"restarted\n"


def test_read_limit_bounds_a_large_file(remote: Remote, tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    (tmp_path / "big").write_bytes(data)
    assert remote.read(str(tmp_path / "big"), 1000, 2 << 20) == data[1000 : 1000 + (2 << 20)]


def test_read_missing_raises_not_found_and_size_is_none(remote: Remote, tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        remote.read(str(tmp_path / "missing"))
    assert remote.size(str(tmp_path / "missing")) is None


# -- request --------------------------------------------------------------------------------------------


def test_request_reaches_an_http_server_on_the_target(remote: Remote, tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    remote.put(HTTP_SERVER.encode(), str(script))
    port = free_port()
    session = remote.spawn(f"exec /usr/bin/python3 -u {script} {port}")
    try:
        assert session.readline(timeout=10) == "ready"
        health = remote.request("GET", port, "/health")
        assert (health.status, health.body, health.headers["x-stand-in"]) == (200, b"ok", "yes")
        assert remote.request("GET", port, "/nope").status == 404
        echo = remote.request("POST", port, "/echo", body=b'{"a": 1}', headers={"Content-Type": "application/json"})
        assert (echo.status, echo.body) == (201, b'{"a": 1}')
    finally:
        session.close()
    # The server exits on stdin EOF, so after close() nothing listens any more.
    assert wait_for(lambda: _unreachable(remote, port))


def _unreachable(remote: Remote, port: int) -> bool:
    try:
        remote.request("GET", port, "/health", timeout=1)
    except EndpointUnreachable:
        return True
    return False


def test_request_to_closed_port_is_endpoint_unreachable(remote: Remote) -> None:
    with pytest.raises(EndpointUnreachable) as e:
        remote.request("GET", free_port(), "/health")
    assert isinstance(e.value, RemoteError)


def test_request_to_silent_listener_times_out(remote: Remote) -> None:
    with socket.socket() as listener:  # accepts TCP (kernel backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        t0 = time.monotonic()
        with pytest.raises(EndpointUnreachable, match="timed out"):
            remote.request("GET", listener.getsockname()[1], "/health", timeout=0.5)
        assert time.monotonic() - t0 < 3


# -- spawn ----------------------------------------------------------------------------------------------


def test_spawn_readline_and_close_sends_eof(remote: Remote, tmp_path: Path) -> None:
    marker = tmp_path / "eof-seen"
    session = remote.spawn(f"echo locked; cat >/dev/null; echo done > {marker}")
    assert session.readline(timeout=5) == "locked"
    with pytest.raises(RemoteError, match="no output line"):
        session.readline(timeout=0.2)
    assert not marker.exists()
    session.close()
    session.close()  # idempotent
    assert wait_for(marker.exists)


def test_spawn_readline_returns_none_at_eof_and_merges_stderr(remote: Remote) -> None:
    session = remote.spawn("echo a; echo b >&2; printf tail")
    try:
        lines = [session.readline(timeout=5) for _ in range(4)]
    finally:
        session.close()
    assert lines == ["a", "b", "tail", None]


# -- SSH only: connection handling ----------------------------------------------------------------------


def test_one_handshake_serves_every_operation(sshd: SSHD, tmp_path: Path) -> None:
    before = sshd.log_count("Accepted publickey")
    with SSHRemote(sshd.spec()) as r:
        r.open()
        r.run("true")
        r.put(b"x", str(tmp_path / "f"))
        r.read(str(tmp_path / "f"))
        r.size(str(tmp_path / "f"))
        with pytest.raises(EndpointUnreachable):
            r.request("GET", free_port(), "/")
        r.spawn("true").close()
        assert r.handshakes == 1
    assert wait_for(lambda: sshd.log_count("Accepted publickey") == before + 1, 2)


def test_sessions_see_bin_dir_first_on_path_and_no_test_environment(sshd: SSHD) -> None:
    tool = sshd.bin_dir / "stand-in-tool"
    tool.write_text("#!/bin/sh\necho stand-in here\n")
    tool.chmod(0o755)
    with SSHRemote(sshd.spec()) as r:
        assert r.run("stand-in-tool").stdout == "stand-in here\n"
        env = r.run("env").stdout
        assert r.run("echo $PATH").stdout.startswith(f"{sshd.bin_dir}:")
        assert r.run("command -v python3").stdout.strip() == "/usr/bin/python3"
    assert "PYTEST" not in env and "VIRTUAL_ENV" not in env


def test_unknown_host_refused_then_recorded_when_trusted(sshd: SSHD, tmp_path: Path) -> None:
    known = tmp_path / "kh" / "known_hosts"
    with pytest.raises(HostKeyUnknown) as e:
        connect(sshd.spec(known_hosts=str(known)))
    assert "--trust-new-host" in str(e.value) and str(known) in str(e.value)
    assert not known.exists()
    connect(sshd.spec(known_hosts=str(known), trust_new_host=True)).close()
    line = known.read_text().strip()
    assert line.startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    assert line.split()[2] == sshd.host_key.with_suffix(".pub").read_text().split()[1]
    with closing(connect(sshd.spec(known_hosts=str(known)))) as r:
        assert r.run("echo again").stdout == "again\n"
    assert len(known.read_text().splitlines()) == 1


def test_changed_host_key_is_refused_even_when_trusting(sshd: SSHD) -> None:
    with sshd.second_host_key_sshd() as impostor:
        for trust in (False, True):
            with pytest.raises(HostKeyMismatch) as e:
                connect(impostor.spec(trust_new_host=trust))
            assert "man-in-the-middle" in str(e.value)
            assert f"ssh-keygen -f {impostor.known_hosts} -R '[127.0.0.1]:{impostor.port}'" in str(e.value)


def test_wrong_key_fails_auth_fast_without_retry(sshd: SSHD, tmp_path: Path) -> None:
    wrong = keygen(tmp_path / "wrong_key")
    before = sshd.log_count("Connection from")
    t0 = time.monotonic()
    with pytest.raises(AuthFailed) as e:
        connect(sshd.spec(identity_file=str(wrong)))
    assert time.monotonic() - t0 < 3
    assert str(wrong) in str(e.value)
    assert wait_for(lambda: sshd.log_count("Connection from") == before + 1, 2)
    time.sleep(0.3)
    assert sshd.log_count("Connection from") == before + 1


def test_closed_port_fails_fast_as_connect_failed() -> None:
    t0 = time.monotonic()
    with pytest.raises(ConnectFailed) as e:
        connect(TargetSpec("127.0.0.1", user="root", port=free_port(), known_hosts="/dev/null", ssh_config="/dev/null"))
    assert time.monotonic() - t0 < 10
    assert "Connection refused" in str(e.value)


def test_silent_port_times_out_within_budget(tmp_path: Path) -> None:
    with socket.socket() as listener:  # TCP handshake completes, no SSH banner ever comes
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        spec = TargetSpec(
            "127.0.0.1", port=listener.getsockname()[1], known_hosts=str(tmp_path / "kh"),
            ssh_config="/dev/null", connect_timeout=0.5,
        )
        t0 = time.monotonic()
        with pytest.raises(ConnectFailed):
            connect(spec)
        assert time.monotonic() - t0 < 4


def test_a_silent_sshd_takes_one_connect_timeout_not_two(tmp_path: Path) -> None:
    """Issue 36: connect_timeout 10 took 22 s (a second try after the first one's banner timeout, under a 2x budget).
    The timeout bounds the whole handshake, every try included."""
    with socket.socket() as listener:  # a stand-in for a hung sshd: TCP accepted, no banner ever sent
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        spec = TargetSpec("127.0.0.1", port=listener.getsockname()[1], known_hosts=str(tmp_path / "kh"),
                          ssh_config="/dev/null", connect_timeout=2)
        t0 = time.monotonic()
        with pytest.raises(ConnectFailed, match="no SSH answer within 2s"):
            connect(spec)
        took = time.monotonic() - t0
    assert 1.8 <= took < 3.2, f"a 2 s connect_timeout took {took:.2f}s"


def test_ssh_config_alias_is_honoured(sshd: SSHD, monkeypatch: pytest.MonkeyPatch) -> None:
    with closing(connect(TargetSpec("deployer-test", ssh_config=str(sshd.ssh_config)))) as r:
        assert r.label == f"root@127.0.0.1:{sshd.port}"
        assert r.run("whoami").stdout == "root\n"
    monkeypatch.setenv("DEPLOYER_SSH_CONFIG", str(sshd.ssh_config))
    with closing(connect(TargetSpec("deployer-test"))) as r:
        assert r.run("echo via-env").stdout == "via-env\n"


def test_match_exec_in_ssh_config_runs_its_command(sshd: SSHD, tmp_path: Path) -> None:
    """paramiko runs `Match exec` through invoke, which deployer loads only when used (remote/ssh/__init__.py).
    In a process of its own: invoke reads the caller's stdin, which pytest captures."""
    marker = tmp_path / "matched"
    config = tmp_path / "ssh_config"
    block = sshd.ssh_config.read_text().replace("deployer-test", "deployer-exec-test", 1)
    probe = ("import sys; from deployer.host import TargetSpec; from deployer.remote.connect import connect\n"
             "r = connect(TargetSpec('deployer-exec-test', ssh_config=sys.argv[1]))\n"
             "print(r.run('echo reached').stdout.strip(), r.label); r.close()")

    def reach() -> str:
        done = subprocess.run([sys.executable, "-c", probe, str(config)], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        return done.stdout

    config.write_text(f'Match exec "touch {marker}"\n    User root\n\n{block}')
    assert reach().startswith("reached root@")
    assert marker.exists()  # the Match line's command really ran
    config.write_text(f'Match exec "false"\n    Port 1\n\n{block}')  # not matched: its Port is not used
    assert reach() == f"reached root@127.0.0.1:{sshd.port}\n"


def test_proxy_jump_from_ssh_config(sshd: SSHD) -> None:
    before = sshd.log_count("Accepted publickey")
    with closing(connect(TargetSpec("deployer-test-via-jump", ssh_config=str(sshd.ssh_config)))) as r:
        assert r.run("echo hop").stdout == "hop\n"
    assert wait_for(lambda: sshd.log_count("Accepted publickey") == before + 2, 2)  # jump host + target


def test_missing_explicit_ssh_config_is_an_error(sshd: SSHD, tmp_path: Path) -> None:
    with pytest.raises(RemoteError, match="does not exist"):
        connect(TargetSpec("deployer-test", ssh_config=str(tmp_path / "nope")))


def test_reconnects_after_the_server_dropped_the_link(fresh_sshd: SSHD) -> None:
    with SSHRemote(fresh_sshd.spec()) as r:
        r.open()
        assert r.run("echo 1").stdout == "1\n"
        fresh_sshd.restart()  # kills every session: the transport is gone
        assert wait_for(lambda: r._conn is not None and not r._conn.is_connected, 5)
        assert r.run("echo 2").stdout == "2\n"
        assert r.handshakes == 2
        r.close()
        assert r.read(str(fresh_sshd.known_hosts)).startswith(b"[127.0.0.1]")  # reopens after close()
        assert r.handshakes == 3


def test_link_lost_mid_command_is_connect_failed(fresh_sshd: SSHD) -> None:
    with SSHRemote(fresh_sshd.spec()) as r:
        r.open()
        killer = threading.Timer(0.5, fresh_sshd.stop)
        killer.start()
        t0 = time.monotonic()
        try:
            with pytest.raises(ConnectFailed, match="connection lost"):
                r.run("sleep 30", timeout=20)
        finally:
            killer.join()
        assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("kind", ["missing", "not-a-key"])
def test_unusable_identity_file_is_auth_failed_at_once(sshd: SSHD, tmp_path: Path, kind: str) -> None:
    key = tmp_path / "id"
    if kind == "not-a-key":
        key.write_text("this is not a key\n")
    before = sshd.log_count("Connection from")
    with pytest.raises(AuthFailed, match=f"identity file {key}"):
        connect(sshd.spec(identity_file=str(key)))
    assert sshd.log_count("Connection from") == before  # refused before dialling


def test_forwarding_disabled_is_not_mistaken_for_a_closed_port_and_the_helper_reaches_http_anyway(tmp_path: Path) -> None:
    bed = make_sshd(tmp_path / "nofwd", extra_config=["AllowTcpForwarding no"])
    try:
        with closing(connect(bed.spec())) as r, socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            with pytest.raises(RemoteError, match="refused to forward") as e:
                r.request("GET", listener.getsockname()[1], "/health")
            assert not isinstance(e.value, EndpointUnreachable)
            assert "AllowTcpForwarding" in str(e.value)
            server = subprocess.Popen([sys.executable, "-c", HTTP_SERVER, str(free_port())],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            try:
                assert server.stdout is not None and server.stdout.readline() == "ready\n"
                conv = Conversation.open(r)  # what every command uses: its HTTP goes through the helper
                try:
                    reply = conv.request("GET", int(server.args[-1]), "/health")
                    assert (reply.status, reply.body) == (200, b"ok")
                finally:
                    conv.close()
            finally:
                server.communicate(timeout=10)
    finally:
        bed.stop()

