"""ssh_config as users write it, against the real sshd: Include, ProxyCommand, encrypted keys and the agent."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from deploy_helpers import deploy
from deployer.errors import AuthFailed, ConnectFailed, RemoteError
from deployer.host import TargetSpec
from deployer.remote.connect import connect
from deployer.remote.ssh.config import resolve
from sshbed import SSHD, make_sshd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def host_block(alias: str, sshd: SSHD, *, identity: Path | None = None, port: bool = True) -> str:
    lines = [f"Host {alias}", f"    HostName {sshd.host}", "    User root",
             f"    IdentityFile {identity or sshd.identity_file}", f"    UserKnownHostsFile {sshd.known_hosts}"]
    if port:
        lines.insert(2, f"    Port {sshd.port}")
    return "\n".join(lines) + "\n"


def accepted(sshd: SSHD) -> int:
    return int(sshd.log_count("Accepted publickey"))


def wait_count(sshd: SSHD, want: int, timeout: float = 3.0) -> int:
    deadline = time.monotonic() + timeout
    while accepted(sshd) < want and time.monotonic() < deadline:
        time.sleep(0.02)
    return accepted(sshd)


# -- Include --------------------------------------------------------------------------------------------


def test_include_relative_to_dot_ssh_with_a_sorted_glob(sshd: SSHD, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`Include conf.d/*.conf` is read from ~/.ssh/conf.d in name order; the first value wins, as in ssh."""
    home = tmp_path / "home"
    confd = home / ".ssh" / "conf.d"
    confd.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    (confd / "10-box.conf").write_text(host_block("inc-box", sshd))
    (confd / "20-late.conf").write_text("Host inc-box\n    Port 1\n")  # ignored: 10-box set Port first
    (confd / "notes.txt").write_text("Host inc-box\n    Port 2\n")  # not matched by the glob
    config = tmp_path / "config"
    config.write_text("Include conf.d/*.conf\n")
    with closing(connect(TargetSpec("inc-box", ssh_config=str(config)))) as r:
        assert r.label == f"root@127.0.0.1:{sshd.port}"
        assert r.run("echo included").stdout == "included\n"


def test_include_inside_a_host_block_keeps_the_block_open_after_it(sshd: SSHD, tmp_path: Path) -> None:
    """Lines of the included file and the lines after the Include both belong to the enclosing Host."""
    (tmp_path / "port.conf").write_text(f"Port {sshd.port}\n")
    (tmp_path / "config").write_text(
        f"Host inc-split\n    HostName {sshd.host}\n    Include {tmp_path}/port.conf\n    User root\n"
        f"    IdentityFile {sshd.identity_file}\n    UserKnownHostsFile {sshd.known_hosts}\n"
        "Host other\n    Port 3\n"
    )
    spec = TargetSpec("inc-split", ssh_config=str(tmp_path / "config"))
    resolved = resolve(spec)
    assert (resolved.port, resolved.user, resolved.identity_files) == (sshd.port, "root", (str(sshd.identity_file),))
    assert resolve(TargetSpec("other", ssh_config=str(tmp_path / "config"))).port == 3
    with closing(connect(spec)) as r:
        assert r.run("echo split").stdout == "split\n"


def test_include_loop_is_one_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(f"Include {config}\nHost x\n    Port 5\n")
    with pytest.raises(RemoteError, match="Include nested more than 16 deep"):
        resolve(TargetSpec("x", ssh_config=str(config)))


def test_include_of_nothing_is_fine_as_in_ssh(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(f"Include {tmp_path}/missing/*.conf\nHost x\n    Port 5\n")
    assert resolve(TargetSpec("x", ssh_config=str(config))).port == 5


# -- ProxyCommand ---------------------------------------------------------------------------------------


def ssh_w(sshd: SSHD) -> str:
    """OpenSSH's own client as the ProxyCommand: log in to the test sshd and forward stdio to %h:%p."""
    return (f"ssh -F none -i {sshd.identity_file} -o UserKnownHostsFile={sshd.known_hosts} -o BatchMode=yes "
            f"-o StrictHostKeyChecking=yes -p {sshd.port} -W %h:%p root@{sshd.host}")


def test_proxy_command_carries_the_connection(sshd: SSHD, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(host_block("via-cmd", sshd) + f"    ProxyCommand {ssh_w(sshd)}\n")
    spec = TargetSpec("via-cmd", ssh_config=str(config))
    assert resolve(spec).proxy_command == ssh_w(sshd).replace("%h", sshd.host).replace("%p", str(sshd.port))
    before = accepted(sshd)
    with closing(connect(spec)) as r:
        assert r.run("echo through-proxy").stdout == "through-proxy\n"
        assert r.read(str(sshd.known_hosts)).startswith(b"[127.0.0.1]")  # SFTP over the same pipe
    assert wait_count(sshd, before + 2) == before + 2  # the ProxyCommand's own login + ours


def test_proxy_command_tokens_follow_command_line_overrides(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host tok\n    HostName real.example\n    Port 2200\n    User alice\n"
                      "    ProxyCommand nc -X 5 -x proxy:1080 %h %p # %r %n %%\n")
    assert resolve(TargetSpec("tok", ssh_config=str(config))).proxy_command == \
        "nc -X 5 -x proxy:1080 real.example 2200 # alice tok %"
    assert resolve(TargetSpec("tok", user="bob", port=22, ssh_config=str(config))).proxy_command == \
        "nc -X 5 -x proxy:1080 real.example 22 # bob tok %"


@pytest.mark.parametrize("text, match", [
    ("ProxyCommand nc %h %z", "unknown token %z"),
    ("ProxyJump a\n    ProxyCommand nc %h %p", "both ProxyJump and ProxyCommand"),
])
def test_proxy_command_mistakes_are_refused(tmp_path: Path, text: str, match: str) -> None:
    config = tmp_path / "config"
    config.write_text(f"Host bad\n    {text}\n")
    with pytest.raises(RemoteError, match=match):
        resolve(TargetSpec("bad", ssh_config=str(config)))


def test_proxy_command_none_turns_it_off(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host off\n    ProxyCommand none\nHost *\n    ProxyCommand nc %h %p\n")
    assert resolve(TargetSpec("off", ssh_config=str(config))).proxy_command is None
    assert resolve(TargetSpec("on", ssh_config=str(config))).proxy_command == "nc on 22"


def test_failing_proxy_command_is_connect_failed_naming_it(sshd: SSHD, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(host_block("broken-cmd", sshd) + "    ProxyCommand sh -c 'echo no route to %h >&2; exit 1'\n")
    t0 = time.monotonic()
    with pytest.raises(ConnectFailed, match="ProxyCommand .* failed"):
        connect(TargetSpec("broken-cmd", ssh_config=str(config), connect_timeout=3))
    assert time.monotonic() - t0 < 10


# -- encrypted keys -------------------------------------------------------------------------------------


@pytest.fixture()
def encrypted_bed(tmp_path: Path) -> Iterator[tuple[SSHD, Path, Path]]:
    """An sshd that accepts only a passphrase-protected key; (sshd, encrypted key, same key unencrypted)."""
    enc = tmp_path / "id_enc"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "sekrit-pass", "-f", str(enc)], check=True,
                   capture_output=True, timeout=30)
    plain = tmp_path / "id_plain"
    plain.write_bytes(enc.read_bytes())
    plain.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "sekrit-pass", "-N", "", "-f", str(plain)], check=True,
                   capture_output=True, timeout=30)
    bed = make_sshd(tmp_path / "sshd", client_key=enc)
    try:
        yield bed, enc, plain
    finally:
        bed.stop()


@pytest.fixture()
def agent(tmp_path: Path) -> Iterator[str]:
    """A private ssh-agent (ours, killed by pid at the end); yields its socket path."""
    sock = str(tmp_path / "agent.sock")
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 5
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.02)
        yield sock
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=5)


def test_encrypted_key_without_agent_says_to_run_ssh_add(encrypted_bed: tuple[SSHD, Path, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    bed, enc, _ = encrypted_bed
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    with pytest.raises(AuthFailed) as e:
        connect(bed.spec())
    assert f"ssh-add {enc}" in str(e.value) and "ssh-agent" in str(e.value)
    assert "\n" not in str(e.value)


def test_encrypted_key_not_in_the_agent_says_to_add_it(encrypted_bed: tuple[SSHD, Path, Path], agent: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    bed, enc, _ = encrypted_bed
    monkeypatch.setenv("SSH_AUTH_SOCK", agent)
    with pytest.raises(AuthFailed, match=f"the ssh-agent does not hold it; run `ssh-add {enc}`"):
        connect(bed.spec())


def test_encrypted_key_held_by_the_agent_connects(encrypted_bed: tuple[SSHD, Path, Path], agent: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    bed, _, plain = encrypted_bed
    subprocess.run(["ssh-add", str(plain)], check=True, capture_output=True, timeout=10,
                   env={**os.environ, "SSH_AUTH_SOCK": agent})
    monkeypatch.setenv("SSH_AUTH_SOCK", agent)
    with closing(connect(bed.spec())) as r:
        assert r.run("echo via-agent").stdout == "via-agent\n"


def test_cli_encrypted_key_is_one_line_and_exit_3(encrypted_bed: tuple[SSHD, Path, Path], tmp_path: Path) -> None:
    bed, enc, _ = encrypted_bed
    config = tmp_path / "ssh_config"
    config.write_text(host_block("enc-box", bed, identity=enc))
    env = {"DEPLOYER_SSH_CONFIG": str(config)}  # and no SSH_AUTH_SOCK: deploy() passes a bare environment
    r = deploy("status", "--host", "enc-box", home=tmp_path / "home", env=env, timeout=60)
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert f"ssh-add {enc}" in lines[0]



def test_include_inside_a_host_block_applies_only_to_that_host(tmp_path: Path) -> None:
    """As ssh: the included file, its own Host blocks too, counts only for the hosts of the enclosing block."""
    (tmp_path / "inner.conf").write_text("Port 7\nHost box-*\n    User bob\n")
    config = tmp_path / "config"
    config.write_text(f"Host box-a\n    Include {tmp_path}/inner.conf\n    HostName a.example\n"
                      "Host box-b\n    HostName b.example\nHost *\n    User carol\n")
    a = resolve(TargetSpec("box-a", ssh_config=str(config)))
    b = resolve(TargetSpec("box-b", ssh_config=str(config)))
    assert (a.hostname, a.port, a.user) == ("a.example", 7, "bob")
    assert (b.hostname, b.port, b.user) == ("b.example", 22, "carol")


def test_cli_through_a_proxy_command_alias_and_the_command_ends(sshd: SSHD, tmp_path: Path) -> None:
    config = tmp_path / "config"
    marker = tmp_path / "proxy-command.log"  # `ssh -E FILE`: makes this test's ProxyCommand findable by pgrep
    command = ssh_w(sshd).replace("ssh ", f"ssh -E {marker} ", 1)
    config.write_text(host_block("cli-via-cmd", sshd) + f"    ProxyCommand {command}\n")
    r = deploy("status", "no-such", "--host", "cli-via-cmd", "--workdir", str(tmp_path / "work"),
               home=tmp_path / "home", env={"DEPLOYER_SSH_CONFIG": str(config)}, timeout=60)
    assert r.returncode == 7 and "no deployment 'no-such'" in r.stderr, r.stderr
    left = subprocess.run(["pgrep", "-f", str(marker)], capture_output=True, text=True, timeout=10)
    assert left.stdout == ""  # the ProxyCommand's ssh ended with deployer
