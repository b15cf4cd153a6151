"""scripts/provision-test-host.sh decides what `make install` / `make test` need and installs it (root + apt) or
says the one command to run. Run under real bash against a fake machine (a root dir and a PATH of fake tools),
so a missing sshd is simulated without uninstalling anything; a fake apt-get records what it was asked."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "provision-test-host.sh"
TOOLS = ["ssh", "ssh-keygen", "ssh-agent", "ssh-add", "unshare", "pkill", "ss", "ip", "nft", "apt-get"]
FILES = ["usr/sbin/sshd", "usr/lib/openssh/sftp-server", "usr/bin/python3"]


class Machine:
    """A fake host: `root` holds the absolute paths probed, `bin` is the whole PATH."""

    def __init__(self, base: Path) -> None:
        self.root, self.bin, self.apt_log = base / "root", base / "bin", base / "apt.log"
        for rel in FILES:
            self.tool(self.root / rel)
        for name in TOOLS:
            self.tool(self.bin / name)
        self.apt("exit 0")
        self.python(ok=True)

    @staticmethod
    def tool(path: Path, body: str = "exit 0") -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)

    def apt(self, then: str) -> None:
        self.tool(self.bin / "apt-get", f'echo "$*" >> {self.apt_log}\n{then}')

    def python(self, ok: bool) -> None:
        """The interpreter check passes or fails (too old, or no ensurepip as on Debian without python3-venv)."""
        self.tool(self.bin / "python3", "exit 0" if ok else "exit 1")

    def remove(self, *names: str) -> None:
        for name in names:
            (self.root / name if "/" in name else self.bin / name).unlink()

    def run(self, level: str, *, dry: bool = True, euid: int = 0) -> subprocess.CompletedProcess[str]:
        env = {"PATH": str(self.bin), "DEPLOYER_PROVISION_ROOT": str(self.root),
               "DEPLOYER_PROVISION_EUID": str(euid), "PYTHON": "python3"}
        argv = ["/bin/bash", str(SCRIPT), level, *(["--dry-run"] if dry else [])]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


@pytest.fixture()
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def test_nothing_missing_installs_nothing(machine: Machine) -> None:
    assert machine.run("test").stdout == "nothing to install\n"
    real = machine.run("test", dry=False)
    assert (real.returncode, real.stdout, real.stderr) == (0, "", "")
    assert not machine.apt_log.exists()


@pytest.mark.parametrize("missing, packages", [
    (["usr/sbin/sshd"], "openssh-server"),
    (["usr/lib/openssh/sftp-server"], "openssh-sftp-server"),
    (["ssh"], "openssh-client"),
    (["ssh-agent", "ssh-keygen"], "openssh-client"),  # one package, named once
    (["unshare"], "util-linux"),
    (["pkill"], "procps"),
    (["ss", "ip"], "iproute2"),
    (["nft"], "nftables"),
    (["usr/bin/python3"], "python3"),
    (["usr/sbin/sshd", "nft", "pkill"], "openssh-server procps nftables"),
])
def test_root_with_apt_would_install_exactly_what_is_missing(machine: Machine, missing: list[str],
                                                             packages: str) -> None:
    machine.remove(*missing)
    r = machine.run("test")
    assert r.returncode == 0
    assert r.stdout == f"would run: apt-get update && apt-get install -y {packages}\n"
    assert not machine.apt_log.exists()  # --dry-run changes nothing


def test_python_without_venv_is_needed_by_install_too(machine: Machine) -> None:
    machine.python(ok=False)
    machine.remove("usr/sbin/sshd")
    assert machine.run("install").stdout == "would run: apt-get update && apt-get install -y python3 python3-venv\n"
    assert machine.run("test").stdout == \
        "would run: apt-get update && apt-get install -y python3 python3-venv openssh-server\n"


def test_install_level_does_not_ask_for_test_tools(machine: Machine) -> None:
    machine.remove("usr/sbin/sshd", "nft")
    assert machine.run("install").stdout == "nothing to install\n"


def test_not_root_gets_one_line_naming_the_command(machine: Machine) -> None:
    machine.remove("usr/sbin/sshd", "nft")
    r = machine.run("test", dry=False, euid=1000)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == ("make test needs openssh-server nftables: run  sudo apt-get update && sudo apt-get install "
                        "-y openssh-server nftables  (or run make test as root)\n")
    assert not machine.apt_log.exists()
    assert machine.run("test", euid=1000).stdout.startswith("would stop: make test needs openssh-server nftables")


def test_without_apt_names_the_packages(machine: Machine) -> None:
    machine.remove("usr/sbin/sshd", "apt-get")
    r = machine.run("test", dry=False)
    assert r.returncode == 1
    assert r.stderr == "make test needs openssh-server (Debian package names): install them with your package manager\n"


def test_root_with_apt_installs_then_makes_the_privsep_dir(machine: Machine) -> None:
    machine.remove("usr/sbin/sshd", "ss")
    r = machine.run("test", dry=False)
    assert r.returncode == 0, r.stderr
    assert machine.apt_log.read_text().splitlines() == ["update -qq", "install -y -qq openssh-server iproute2"]
    assert (machine.root / "run" / "sshd").is_dir()
    assert "installing them with apt-get" in r.stderr


def test_apt_failure_is_one_line_and_non_zero(machine: Machine) -> None:
    machine.remove("usr/sbin/sshd")
    machine.apt("exit 100")
    r = machine.run("test", dry=False)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == \
        "apt-get could not install openssh-server; install them, then run make test again"


def test_bad_usage_exits_2(machine: Machine) -> None:
    assert machine.run("everything").returncode == 2


def test_this_machine_after_provisioning_lacks_nothing() -> None:
    """`make test` ran the script before this suite: the real machine must now have everything."""
    env = {**os.environ, "PYTHON": os.environ.get("PYTHON", "python3")}
    r = subprocess.run(["/bin/bash", str(SCRIPT), "test", "--dry-run"], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.stdout == "nothing to install\n", r.stdout + r.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/unshare").exists(), reason="needs root and unshare")
def test_real_machine_with_sshd_hidden_in_a_private_mount_namespace() -> None:
    """No seams: the real paths, with /usr/sbin/sshd covered by /dev/null only inside a private mount namespace."""
    hide = "mount --bind /dev/null /usr/sbin/sshd && "
    dry = subprocess.run(["unshare", "-m", "bash", "-c", hide + f"bash {SCRIPT} test --dry-run"],
                         capture_output=True, text=True, timeout=30)
    assert dry.stdout == "would run: apt-get update && apt-get install -y openssh-server\n", dry.stderr
    user = subprocess.run(["unshare", "-m", "bash", "-c", hide + f"bash {SCRIPT} test"], capture_output=True,
                          text=True, timeout=30, env={**os.environ, "DEPLOYER_PROVISION_EUID": "1000"})
    assert user.returncode == 1 and user.stderr.startswith("make test needs openssh-server: run  sudo apt-get")
    assert os.access("/usr/sbin/sshd", os.X_OK)  # the real one was never touched
