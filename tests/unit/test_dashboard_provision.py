"""`scripts/provision-test-host.sh browser`: what `make test-browser` needs (Debian's chromium and chromium-driver),
decided on the same fake machine as tests/unit/test_provision.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_provision import Machine


@pytest.fixture()
def machine(tmp_path: Path) -> Machine:
    m = Machine(tmp_path)
    for rel in ("usr/bin/chromium", "usr/bin/chromedriver"):
        m.tool(m.root / rel)
    return m


def test_nothing_missing_installs_nothing(machine: Machine) -> None:
    assert machine.run("browser").stdout == "nothing to install\n"


@pytest.mark.parametrize("missing, packages", [
    (["usr/bin/chromium"], "chromium"),
    (["usr/bin/chromedriver"], "chromium-driver"),
    (["usr/bin/chromium", "usr/bin/chromedriver"], "chromium chromium-driver"),
])
def test_root_with_apt_would_install_what_is_missing(machine: Machine, missing: list[str], packages: str) -> None:
    machine.remove(*missing)
    assert machine.run("browser").stdout == f"would run: apt-get update && apt-get install -y {packages}\n"


def test_the_other_levels_do_not_ask_for_a_browser(machine: Machine) -> None:
    machine.remove("usr/bin/chromium", "usr/bin/chromedriver")
    assert machine.run("install").stdout == "nothing to install\n"
    assert machine.run("test").stdout == "nothing to install\n"


def test_not_root_is_told_the_command_and_the_make_target(machine: Machine) -> None:
    machine.remove("usr/bin/chromium")
    r = machine.run("browser", dry=False, euid=1000)
    assert r.returncode == 1
    assert r.stderr.strip() == ("make test-browser needs chromium: run  sudo apt-get update && sudo apt-get install "
                                "-y chromium  (or run make test-browser as root)")
