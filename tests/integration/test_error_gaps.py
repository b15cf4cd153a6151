"""Issue 36's error gaps, each one line through the real CLI and a real sshd: a missing identity file is named, a
login shell that refuses logins is said (not "needs python3")."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, write_profile
from sshbed import SSHD, make_sshd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def one_line_error(proc: Any) -> str:
    """The failure is one `error:` line on stderr, no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), proc.stderr
    return str(lines[-1])


@pytest.fixture()
def nologin_sshd(tmp_path: Path) -> Iterator[SSHD]:
    """A stand-in for an account whose login shell is /usr/sbin/nologin: sshd runs nologin for every command (it
    prints "This account is currently not available." and exits 1, as the shell would)."""
    if not Path("/usr/sbin/nologin").exists():
        pytest.skip("/usr/sbin/nologin is not installed")
    bed = make_sshd(tmp_path / "nologin", extra_config=["ForceCommand /usr/sbin/nologin"])
    try:
        yield bed
    finally:
        bed.stop()


@pytest.mark.parametrize("command", ["up", "status"])
def test_a_missing_identity_file_is_named(tmp_path: Path, sshd: SSHD, command: str) -> None:
    missing = tmp_path / "keys" / "id_gone"
    prof = write_profile(tmp_path, sshd, name="nokey", extra={"target": {**sshd.target(tmp_path / "w"),
                                                                        "identity_file": str(missing)}})
    proc = deploy(command, str(prof), *(["--skip-preflight"] if command == "up" else []), home=tmp_path / "h",
                  timeout=60)
    assert proc.returncode == 3, proc.stderr  # docs/exit-codes.md: connection, authentication or host key
    line = one_line_error(proc)
    assert str(missing) in line and "does not exist" in line, line


def test_a_missing_identity_file_of_the_ssh_config_is_named(tmp_path: Path, sshd: SSHD) -> None:
    """ssh skips an IdentityFile that names no file, and so do we; when authentication then fails, the line says
    which one was missing (it used to say only "tried default keys/agent")."""
    missing = tmp_path / "keys" / "id_gone"
    config = tmp_path / "ssh_config"
    config.write_text(f"Host gone-key\n    HostName {sshd.host}\n    Port {sshd.port}\n    User root\n"
                      f"    IdentityFile {missing}\n    UserKnownHostsFile {sshd.known_hosts}\n")
    prof = write_profile(tmp_path, sshd, name="cfgkey", extra={"target": {"host": "gone-key", "identity_file": None,
                                                                         "workdir": str(tmp_path / "w")}})
    home = tmp_path / "home"  # no default keys, no agent: only the config's key could have worked
    home.mkdir()
    proc = deploy("status", str(prof), home=tmp_path / "h", timeout=60,
                  env={"HOME": str(home), "DEPLOYER_SSH_CONFIG": str(config)})
    assert proc.returncode == 3, proc.stderr
    line = one_line_error(proc)
    assert f"IdentityFile {missing} does not exist" in line, line


@pytest.mark.parametrize("command", ["up", "status"])
def test_a_nologin_shell_is_said_not_python3(tmp_path: Path, nologin_sshd: SSHD, command: str) -> None:
    prof = write_profile(tmp_path, nologin_sshd, name="nologin")
    proc = deploy(command, str(prof), *(["--skip-preflight"] if command == "up" else []), home=tmp_path / "h",
                  timeout=60)
    assert proc.returncode != 0
    line = one_line_error(proc)
    assert "refuses logins" in line and "python3" not in line, line
