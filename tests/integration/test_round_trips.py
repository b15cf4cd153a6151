"""Round trips per command, counted on a target whose login shell costs what a real GPU image's does.

Every exec channel and every SFTP session runs the user's login shell, and on a real box its rc file (conda or
pyenv init) costs ~150 ms before the command even starts (/work/shared/ssh-notes.md "Per-command cost").
This module runs one deployment's commands against an sshd whose `.bashrc` is that slow (tests/sshbed.py
`rc_cost`) and counts, from sshd's own log, what each command opened. Two kinds of assertion:

- today's counts as an upper bound (TODAY): a change that adds a round trip fails now;
- issue 13's targets (`up` <= 2 exec channels, `status`/`logs`/`history` one channel in all), all reached: the
  on-call commands run one snapshot exec each (no SFTP), `up` one conversation with the target-side helper
  (deployer/remote/conversation.py) plus the SFTP session its files travel by. A target not yet reached would be
  marked xfail(strict=True), so that reaching it XPASSes and fails the run until TODAY is lowered.

The counts are printed in the test output, past pytest's capture (so `-q` runs show them too).
docs/round-trips.md says where each channel comes from.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploy_helpers import deploy, write_profile
from sshbed import SSHD, Sessions, make_sshd

pytestmark = pytest.mark.integration

RC_COST_S = 0.15  # conda's init block on a GPU image; the bed's rc file is calibrated to about this
STANDIN_BIN = Path(__file__).resolve().parents[1] / "standin" / "bin"


@dataclass(frozen=True)
class Bound:
    exec: int
    sftp: int
    connections: int = 1


# The flow, in order: label -> argv after `deploy` (the profile path is appended, unless the argv names the
# deployment by --host: then WORK is the profile's workdir). The first `up` launches on a fresh target without
# preflight; `up (no change)` finds the same version serving and leaves it; after `down`, `up` launches again
# with preflight, so the last commands see two runs.
WORK = "{work}"
BY_HOST = ["--host", "deployer-test", "--workdir", WORK]
FLOW: dict[str, list[str]] = {
    "up --skip-preflight": ["up", "--skip-preflight"],
    "status": ["status"],
    "logs": ["logs", "-n", "20"],
    "history": ["history"],
    "up (no change)": ["up", "--skip-preflight"],
    "down": ["down"],
    "plan": ["plan"],
    "up": ["up"],
    "logs --previous": ["logs", "rt", "--previous", "-n", "5", *BY_HOST],
    "status --host (all)": ["status", *BY_HOST],
    "prune": ["prune", "--keep", "1"],
}

# Measured on this branch (see docs/round-trips.md for where each comes from). Lower a line when a change
# removes round trips; never raise it to make a test pass.
TODAY: dict[str, Bound] = {
    "up --skip-preflight": Bound(exec=1, sftp=0),  # one helper conversation (was 15 exec); files travel in it
    "status": Bound(exec=1, sftp=0),  # issue 13 reached: the helper answers the snapshot (box/snapshot.py)
    "logs": Bound(exec=1, sftp=0),
    "history": Bound(exec=1, sftp=0),
    "up (no change)": Bound(exec=1, sftp=0),  # was 8-9 exec
    "down": Bound(exec=1, sftp=0),  # snapshot, lock, stop: all requests to the helper (was 3 exec)
    "plan": Bound(exec=1, sftp=0),  # preflight's requests to the helper (was 2 exec)
    "up": Bound(exec=1, sftp=0),  # preflight's facts and flag resolution ride the conversation (was 17 exec)
    "logs --previous": Bound(exec=1, sftp=0),
    "status --host (all)": Bound(exec=1, sftp=0),
    "prune": Bound(exec=1, sftp=0),  # the lock and the deletions: requests to the helper
}

# issue 13, "Targets": exec channels `up` <= 2 (files still travel by SFTP), on-call commands one round trip:
# one session channel in all (an SFTP session pays the login shell like an exec channel does).
TARGET_EXEC_UP = 2
TARGET_CHANNELS_ONCALL = 1


@dataclass(frozen=True)
class Measured:
    sessions: Sessions
    rc_runs: int  # times the bed's .bashrc ran during the command
    returncode: int
    output: str


@pytest.fixture(scope="module")
def rc_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHD]:
    bed = make_sshd(tmp_path_factory.mktemp("rc-sshd"), rc_cost=RC_COST_S)
    (bed.bin_dir / "nvidia-smi").symlink_to(STANDIN_BIN / "nvidia-smi")  # preflight reads the GPUs
    try:
        yield bed
    finally:
        bed.stop()


def _report(config: pytest.Config, lines: list[str]) -> None:
    """Print to the terminal even while pytest captures output (so `-q` runs show the counts too)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        print("\n" + "\n".join(lines))


@pytest.fixture(scope="module")
def flow(rc_bed: SSHD, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest,
         ) -> dict[str, Measured]:
    tmp = tmp_path_factory.mktemp("round-trips")
    profile = write_profile(tmp, rc_bed, name="rt")
    got: dict[str, Measured] = {}
    try:
        for name, argv in FLOW.items():
            offset, rc_before = rc_bed.log_offset(), rc_bed.rc_runs()
            if WORK in argv:
                proc = deploy(*(str(tmp / "work") if a == WORK else a for a in argv), home=tmp / "home",
                              timeout=180, env={"DEPLOYER_SSH_CONFIG": str(rc_bed.ssh_config)})
            else:
                proc = deploy(*argv, str(profile), home=tmp / "home", timeout=180)
            got[name] = Measured(rc_bed.sessions_since(offset), rc_bed.rc_runs() - rc_before, proc.returncode,
                                 (proc.stdout + proc.stderr)[-3000:])
    finally:
        deploy("down", str(profile), home=tmp / "home", timeout=60)
        shutil.rmtree(tmp / "work", ignore_errors=True)
    _report(request.config, [f"round trips per command (login shell's .bashrc calibrated to "
                             f"~{rc_bed.rc_cost * 1000:.0f} ms):"]
            + [f"  deploy {name:<20} {m.sessions}; .bashrc ran {m.rc_runs}x" for name, m in got.items()])
    return got


@pytest.mark.parametrize("name", list(FLOW))
def test_command_succeeds_and_each_channel_pays_the_login_shell(flow: dict[str, Measured], name: str) -> None:
    m = flow[name]
    assert m.returncode == 0, m.output
    assert m.sessions.channels > 0
    # the rc file ran once per session channel: nothing skipped it (no SHLVL trick), nothing ran it twice
    assert m.rc_runs == m.sessions.channels, (m.sessions, m.rc_runs)


@pytest.mark.parametrize("name", list(FLOW))
def test_round_trips_do_not_grow(flow: dict[str, Measured], name: str) -> None:
    got, bound = flow[name].sessions, TODAY[name]
    assert got.connections <= bound.connections, f"deploy {name}: {got} (was {bound})"
    assert got.exec <= bound.exec, f"deploy {name}: {got} (was {bound})"
    assert got.sftp <= bound.sftp, f"deploy {name}: {got} (was {bound})"


@pytest.mark.parametrize("name", ["up --skip-preflight", "up", "up (no change)"])
def test_issue13_up_in_two_exec_channels(flow: dict[str, Measured], name: str) -> None:
    got = flow[name].sessions
    assert got.exec <= TARGET_EXEC_UP, f"deploy {name}: {got}"


@pytest.mark.parametrize("name", ["status", "logs", "history", "logs --previous", "status --host (all)"])
def test_issue13_oncall_in_one_round_trip(flow: dict[str, Measured], name: str) -> None:
    got = flow[name].sessions
    assert got.channels <= TARGET_CHANNELS_ONCALL, f"deploy {name}: {got}"


def test_rc_bed_runs_its_own_rc_file_for_every_session(rc_bed: SSHD) -> None:
    """The bed's own rc file runs for `ssh host cmd` and SFTP (HOME is the bed's, SHLVL not preset); the
    real ~/.bashrc (it exports PYENV_ROOT here) is not the one that runs."""
    ssh = ["ssh", "-F", str(rc_bed.ssh_config), "deployer-test"]
    offset, before = rc_bed.log_offset(), rc_bed.rc_runs()
    out = subprocess.run([*ssh, 'echo "$HOME|$SHLVL|$BED_RC_DIGEST|${PYENV_ROOT-}"; type -t bed_activate'],
                         capture_output=True, text=True, timeout=30)
    sftp = subprocess.run(["sftp", "-F", str(rc_bed.ssh_config), "-b", "-", "deployer-test"], input="pwd\n",
                          capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and sftp.returncode == 0, out.stderr + sftp.stderr
    home, shlvl, digest, pyenv = out.stdout.splitlines()[0].split("|")
    assert home == str(rc_bed.home) and shlvl == "1" and len(digest) == 12  # bash started at level 0
    assert pyenv == ""
    assert out.stdout.splitlines()[1] == "function"
    assert rc_bed.sessions_since(offset) == Sessions(connections=2, exec=1, sftp=1, shell=0)
    assert rc_bed.rc_runs() - before == 2
