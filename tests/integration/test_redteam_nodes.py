"""Red team, issue #34 for multi-node groups: a second unprivileged user (the real `nobody`) on the head and worker
boxes of a two-node group (tests/hostbed.py `net_host_bed`: each node a network namespace with its own sshd, PID
namespace and /dev/shm; the file system is shared, as a test bed's is).

(a) a deployment dir (the workdir or `<workdir>/<name>`) that nobody plants as a link in a sticky world-writable
    directory, on the head and on a worker: `up` refuses it naming the link and its owner, and nothing starts on any
    node; a node's path that turns unsafe after `up`: `down` still stops every rank; a rank's path re-pointed at a tree
    of nobody's, then the rank dies and the group restarts: nothing of nobody's is run as root.
(b) nobody squats a rank's engine port (on the worker) or the dist-init port (on the head), or holds the port's
    claim with a note that says it is root's deployment: `up` names the holder (pid, user) and never believes the note.
(c) and (d) are test_redteam_nodes_interrupts.py (a double Ctrl-C in a group replace) and the API key check below.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import waiting
from deploy_helpers import STANDIN, deploy
from hostbed import HostBed
from test_redteam_local import NOBODY, PWNED, Victim, arena, victim

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                       reason="the red team needs root (to be the victim) and setpriv (to be nobody)"),
]
__all__ = ["arena", "victim"]  # fixtures, used by name

NAME = "grp"
ENGINE_PORT = 30000  # each node is a network namespace of its own: the port is the test's there
DIST_PORT = 20000
AS_NOBODY = f"setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups --"


def group_profile(tmp_path: Path, bed: HostBed, workdirs: list[Path] | None = None, *,
                  restart: dict[str, Any] | None = None, env: dict[str, str] | None = None,
                  args: dict[str, Any] | None = None) -> Path:
    dirs = workdirs or [h.workdir for h in bed.hosts]
    data: dict[str, Any] = {
        "name": NAME,
        "nodes": [h.sshd.target(w) for h, w in zip(bed.hosts, dirs)],
        "engine": {"kind": "sglang", "python": "/usr/bin/python3", "model_path": "Qwen/Qwen3-8B", "port": ENGINE_PORT,
                   "host": "0.0.0.0", "args": {"tp_size": 2, **(args or {})},
                   "env": {"PYTHONPATH": str(STANDIN), **(env or {})}, "dist_init_port": DIST_PORT},
        "health": {"interval_s": 0.3, "startup_timeout_s": 60, "stall_timeout_s": 30},
        "retry": {"max_attempts": 1, "backoff_s": 0.2},
        "restart": {"grace_s": 2, "on_boot": False, **(restart or {})},
    }
    prof = tmp_path / f"{NAME}.yaml"
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    return prof


def up(tmp_path: Path, prof: Path) -> subprocess.CompletedProcess[str]:
    return deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h", timeout=180)


def down(tmp_path: Path, prof: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return deploy("down", str(prof), *extra, home=tmp_path / "h", timeout=120)


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a command that refused (no traceback)."""
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr[-3000:])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def sticky(arena: Path, name: str) -> Path:
    d = arena / name
    d.mkdir()
    d.chmod(0o1777)
    return d


def root_only(arena: Path) -> Path:
    d = arena / "rootonly"
    d.mkdir(mode=0o700)
    d.chmod(0o700)
    return d


def as_nobody(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", f"{AS_NOBODY} sh -ec {_q(script)}"], capture_output=True, text=True,
                          timeout=30, cwd="/")


def _q(text: str) -> str:
    import shlex
    return shlex.quote(text)


def group_pids(root: Path) -> list[int]:
    """Live processes (any PID namespace) whose environment names a run dir under `root` (the engines) or whose
    argv does (their supervisors)."""
    want, found = f"DEPLOYER_RUN_DIR={root}/".encode(), []
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read()
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        if any(e.startswith(want) for e in env) or str(root).encode() + b"/" in argv:
            found.append(pid)
    return found


def kill_all(pids: list[int]) -> None:
    """SIGKILL each (one that went with an earlier one, its parent, is passed over)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


# --- (a) a symlinked deployment dir ----------------------------------------------------------------------------

@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("planted", ["deployment-dir", "workdir"])
def test_a_link_planted_for_a_nodes_dir_is_refused_naming_its_owner(tmp_path: Path, net_bed: HostBed, arena: Path,
                                                                     victim: Victim, rank: int, planted: str) -> None:
    """nobody plants `<workdir>/grp` (or the workdir itself) on node `rank` as a link to a root-only directory: the
    group's `up` refuses in one line naming the link and nobody, makes nothing through it, starts nothing anywhere."""
    shared, rootonly = sticky(arena, "shared"), root_only(arena)
    workdirs = [arena / f"w{i}" for i in range(2)]
    for w in workdirs:
        w.mkdir(mode=0o755)
    if planted == "deployment-dir":
        workdirs[rank] = shared
        link = shared / NAME
    else:
        workdirs[rank] = link = shared / "w"
    made = as_nobody(f"ln -s {rootonly} {link}")
    assert made.returncode == 0 and link.is_symlink(), made.stderr
    prof = group_profile(tmp_path, net_bed, workdirs)
    proc = up(tmp_path, prof)
    try:
        line = one_error(proc)
        assert proc.returncode == 4, proc.stderr[-2000:]
        assert f"{link} is a symbolic link" in line and "owned by nobody" in line, line
        assert os.listdir(rootonly) == []
        assert not group_pids(arena), "a rank was started on the other node"
        assert victim.unchanged()
    finally:
        down(tmp_path, prof, "--break-lock")


@pytest.mark.parametrize("rank", [0, 1])
def test_down_stops_every_rank_after_a_nodes_path_became_unsafe(tmp_path: Path, net_bed: HostBed, arena: Path,
                                                                rank: int) -> None:
    """After `up`, node `rank`'s workdir is handed to nobody: `down` still stops both ranks and their supervisors
    (that node's found by their processes, without reading the directory), says its path is unsafe, and exits 4."""
    workdirs = [arena / "w0", arena / "w1"]
    for w in workdirs:
        w.mkdir(mode=0o755)
    prof = group_profile(tmp_path, net_bed, workdirs)
    started = up(tmp_path, prof)
    assert started.returncode == 0, started.stderr[-3000:]
    assert group_pids(workdirs[0]) and group_pids(workdirs[1])
    try:
        os.chown(workdirs[rank], NOBODY, NOBODY)
        gone = down(tmp_path, prof)
        assert gone.returncode == 4 and "Traceback" not in gone.stderr, (gone.returncode, gone.stderr[-3000:])
        text = gone.stdout + gone.stderr
        assert "unsafe deployment dir" in text and str(workdirs[rank]) in text, text[-3000:]
        assert "stopped supervisor pid(s)" in text, text[-3000:]  # found by their processes
        waiting.wait_for(lambda: not group_pids(workdirs[0]) and not group_pids(workdirs[1]), "every rank gone",
                         20, poll_s=0.2)
    finally:
        os.chown(workdirs[rank], 0, 0)
        down(tmp_path, prof, "--break-lock")


EVIL_LAUNCH = "#!/bin/sh\necho {pwned} by $(id -u) >> {victim}\nexec sleep 30\n"


def _plant_evil_tree(arena: Path, good: Path, victim: Victim) -> Path:
    """nobody's copy of the worker's deployment tree: every run dir of it with a launch.sh (and a supervise.py, a
    helper) that would write the victim; all of it nobody's."""
    evil = arena / "evil"
    evil.mkdir(mode=0o755)
    os.chown(evil, NOBODY, NOBODY)
    launch = EVIL_LAUNCH.format(pwned=PWNED, victim=victim.path)
    runs = sorted(p.name for p in (good / NAME / "runs").iterdir())
    script = "".join(f"mkdir -p {evil}/{NAME}/runs/{r}; printf '%s' {_q(launch)} > {evil}/{NAME}/runs/{r}/launch.sh; "
                     f"chmod 755 {evil}/{NAME}/runs/{r}/launch.sh; "
                     f"cp {good}/{NAME}/runs/{r}/supervise.json {evil}/{NAME}/runs/{r}/ 2>/dev/null || true; "
                     for r in runs)
    script += f"ln -s runs/{runs[-1]} {evil}/{NAME}/current"
    made = as_nobody(script)
    assert made.returncode == 0, made.stderr
    return evil


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_that_dies_after_its_path_was_repointed_never_runs_another_users_file(
        tmp_path: Path, net_bed: HostBed, arena: Path, victim: Victim, rank: int) -> None:
    """Node `rank`'s workdir is a link of root's (checks allow it: root owns it), and the group serves; the link is
    re-pointed at a tree of nobody's whose launch.sh writes the victim, and that rank's engine dies (as the OOM
    killer would kill it): the group's restart runs nothing of nobody's as root, that rank's supervisor says why,
    and `down` stops what deployer started."""
    good = arena / "good"
    good.mkdir(mode=0o755)
    link = arena / "linked"
    link.symlink_to(good)
    workdirs = [arena / "plain", arena / "plain"]
    workdirs[1 - rank].mkdir(mode=0o755)
    workdirs[rank] = link
    prof = group_profile(tmp_path, net_bed, workdirs, restart={"policy": "on-failure", "backoff_s": [0.5, 1]})
    started = up(tmp_path, prof)
    assert started.returncode == 0, started.stderr[-3000:]
    log = good / NAME / "current" / "supervisor.log"
    try:
        engines = [p for p in group_pids(link / NAME) if b"supervise" not in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert engines
        evil = _plant_evil_tree(arena, good, victim)
        tmp = arena / "linked.new"
        tmp.symlink_to(evil)
        os.replace(tmp, link)  # re-pointed
        kill_all(engines)  # that rank's engine dies
        waiting.wait_for(lambda: "not restarted: " in log.read_text(), "the restart refused", 30, poll_s=0.2)
        assert victim.unchanged(), victim.path.read_text()
        assert not any(uid_of(p) == 0 for p in group_pids(evil)), "root runs something of nobody's tree"
        assert f"{evil} is owned by nobody" in log.read_text(), log.read_text()[-3000:]
    finally:
        tmp = arena / "linked.back"
        tmp.symlink_to(good)
        os.replace(tmp, link)
        gone = down(tmp_path, prof, "--break-lock")
    assert "Traceback" not in gone.stderr, gone.stderr
    waiting.wait_for(lambda: not group_pids(arena / "plain") and not group_pids(link), "every rank gone", 20,
                     poll_s=0.2)
    assert victim.unchanged()


# --- (b) squatted ports and forged claim notes -----------------------------------------------------------------

def squat(bed: HostBed, rank: int, port: int) -> int:
    """nobody listens on `port` of node `rank` (started through that node's sshd: a process of that box); its pid
    there."""
    cmd = (f"cd /; setsid {AS_NOBODY} /usr/bin/python3 -m http.server --bind 0.0.0.0 {port} "
           "</dev/null >/dev/null 2>&1 & echo $!")
    out = bed.run(bed.hosts[rank].alias, cmd)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    probe = f"for i in $(seq 100); do grep -q ':{port:04X} 00000000:0000 0A' /proc/net/tcp && exit 0; sleep 0.1; done; exit 1"
    assert bed.run(bed.hosts[rank].alias, probe).returncode == 0, "the squatter never listened"
    return pid


def test_a_squatted_worker_engine_port_names_the_squatter(tmp_path: Path, net_bed: HostBed) -> None:
    pid = squat(net_bed, 1, ENGINE_PORT)
    prof = group_profile(tmp_path, net_bed)
    proc = up(tmp_path, prof)
    try:
        line = one_error(proc)
        assert f"port {ENGINE_PORT}" in line and "node 1" in line, line
        assert f"pid {pid} (python3) of user nobody" in line, line
        assert not group_pids(net_bed.hosts[0].workdir) and not group_pids(net_bed.hosts[1].workdir)
    finally:
        down(tmp_path, prof, "--break-lock")


def test_a_squatted_dist_init_port_names_the_squatter(tmp_path: Path, net_bed: HostBed) -> None:
    pid = squat(net_bed, 0, DIST_PORT)
    prof = group_profile(tmp_path, net_bed)
    proc = up(tmp_path, prof)
    try:
        line = one_error(proc)
        assert f"dist-init port {DIST_PORT}" in line, line
        assert f"pid {pid} (python3) of user nobody" in line, line
    finally:
        down(tmp_path, prof, "--break-lock")


CLAIMER = """import sys, time
sys.path.insert(0, sys.argv[1])
import ports as p
fd = p.claim_port(int(sys.argv[2]), sys.argv[3], sys.argv[4])
print("held", flush=True)
time.sleep(120)
"""


def test_a_forged_claim_note_on_a_worker_is_not_believed(tmp_path: Path, net_bed: HostBed, arena: Path) -> None:
    """nobody takes the worker's claim of the engine port and writes a note saying it is root's deployment `grp`
    (its run dir): `up` names user nobody and its pid, never "deployment grp"."""
    from deployer.remote.program import supervisor_source

    lib = arena / "lib"
    lib.mkdir(mode=0o755)
    (lib / "ports.py").write_text(supervisor_source("ports"))
    (lib / "claimer.py").write_text(CLAIMER)
    forged_run = f"{net_bed.hosts[1].workdir}/{NAME}/runs/r1"
    cmd = (f"cd /; setsid {AS_NOBODY} /usr/bin/python3 -B {lib}/claimer.py {lib} {ENGINE_PORT} {forged_run} {NAME} "
           f"</dev/null >{lib}/claimer.out 2>&1 & echo $!")
    out = net_bed.run("node-1", cmd)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    waiting.wait_for(lambda: (lib / "claimer.out").read_text() == "held\n", "nobody's claim", 10, poll_s=0.05)
    prof = group_profile(tmp_path, net_bed)
    proc = up(tmp_path, prof)
    try:
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "Traceback" not in text, (proc.returncode, text[-3000:])
        assert f"user nobody (uid {NOBODY}, pid {pid})" in text, text[-3000:]
        assert f"deployment {NAME} (" not in text and forged_run not in text, text[-3000:]
    finally:
        down(tmp_path, prof, "--break-lock")


# --- (d) the group's API key ------------------------------------------------------------------------------------

API_KEY = "sk-redteam-group-4f1c9e2a7b"


def test_the_groups_api_key_is_in_no_process_command_line(tmp_path: Path, net_bed: HostBed) -> None:
    """Every user can read /proc/PID/cmdline: with an API key set, no process of any node shows it there."""
    prof = group_profile(tmp_path, net_bed, args={"api_key": API_KEY})
    started = up(tmp_path, prof)
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        seen = []
        for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read()
                if API_KEY.encode() in argv:
                    seen.append(argv.replace(b"\0", b" ").decode(errors="replace")[:200])
            except OSError:
                continue
        assert not seen, f"the API key is in the argv of {seen}"
        assert API_KEY not in started.stdout + started.stderr
    finally:
        down(tmp_path, prof, "--break-lock")


def squat_health(bed: HostBed, rank: int, port: int, arena: Path) -> int:
    """nobody's HTTP server on `port` of node `rank` answering GET /health with 200 (a file named health)."""
    root = arena / "squat"
    root.mkdir(mode=0o755, exist_ok=True)
    (root / "health").write_text("ok\n")
    (root / "health").chmod(0o644)
    cmd = (f"cd {root}; setsid {AS_NOBODY} /usr/bin/python3 -m http.server --bind 0.0.0.0 {port} "
           "</dev/null >/dev/null 2>&1 & echo $!")
    out = bed.run(bed.hosts[rank].alias, cmd)
    assert out.returncode == 0, out.stderr
    probe = f"for i in $(seq 100); do grep -q ':{port:04X} 00000000:0000 0A' /proc/net/tcp && exit 0; sleep 0.1; done; exit 1"
    assert bed.run(bed.hosts[rank].alias, probe).returncode == 0, "the squatter never listened"
    return int(out.stdout.split()[-1])


def node_rows(tmp_path: Path, prof: Path) -> tuple[int, list[dict[str, Any]]]:
    out = deploy("status", str(prof), "--json", home=tmp_path / "h")
    assert "Traceback" not in out.stderr, out.stderr
    data = json.loads(out.stdout)
    return out.returncode, data["members"]


def test_status_in_a_groups_restart_backoff_never_calls_a_squatter_healthy(tmp_path: Path, net_bed: HostBed,
                                                                          arena: Path) -> None:
    """The worker's engine dies, the group waits in its restart backoff (the port free), and nobody's server takes
    the worker's engine port, answering /health: status never calls that node healthy, and names nobody."""
    prof = group_profile(tmp_path, net_bed, restart={"policy": "on-failure", "backoff_s": [60, 60]})
    started = up(tmp_path, prof)
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        code, rows = node_rows(tmp_path, prof)
        assert code == 0 and all(r["healthy"] for r in rows), rows
        work1 = net_bed.hosts[1].workdir
        engines = [p for p in group_pids(work1 / NAME) if b"supervise" not in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert engines
        kill_all(engines)  # as the OOM killer would
        waiting.wait_for(lambda: node_rows(tmp_path, prof)[1][1]["status"] == "restarting", "node 1's backoff", 30,
                         poll_s=0.5)
        squat_health(net_bed, 1, ENGINE_PORT, arena)
        code, rows = node_rows(tmp_path, prof)
        assert rows[1]["healthy"] is False and code != 0, (code, rows[1])
        assert "of user nobody" in json.dumps(rows[1]), rows[1]
        text = deploy("status", str(prof), home=tmp_path / "h")
        assert "of user nobody" in text.stdout, text.stdout
    finally:
        down(tmp_path, prof, "--break-lock")


BOOT_EVIL = "import os\nos.system('echo {pwned} by the swapped-in supervise.py $(id -u) >> {victim}')\n"


def test_a_reboot_after_a_workers_dir_was_swapped_runs_nothing_of_another_user(
        tmp_path: Path, net_bed: HostBed, arena: Path, victim: Victim) -> None:
    """After `up`, the worker's workdir's parent turns world-writable (0777, not sticky): nobody moves the workdir
    away and puts its own tree in its place; the box reboots and runs the worker's @reboot entry as root: nothing of
    nobody's may run (the entry's check refuses the path: supervise.py BOOT_CHECK)."""
    parent = arena / "p"
    parent.mkdir(mode=0o755)
    workdirs = [arena / "w0", parent / "w1"]
    for w in workdirs:
        w.mkdir(mode=0o755)
    prof = group_profile(tmp_path, net_bed, workdirs, restart={"on_boot": True})
    started = up(tmp_path, prof)
    assert started.returncode == 0, started.stderr[-3000:]
    try:
        table = net_bed.hosts[1].sshd.dir / "crontab.txt"
        entries = [line for line in table.read_text().splitlines() if line.startswith("@reboot ")]
        assert len(entries) == 1, table.read_text()
        run = (workdirs[1] / NAME / "current").resolve()
        state = json.loads((run / "state.json").read_text())
        parent.chmod(0o777)
        evil_run = f"{workdirs[1]}/{NAME}/runs/{run.name}"
        swapped = as_nobody(f"mv {workdirs[1]} {parent}/old && mkdir -p {evil_run} && printf '%s' "
                            f"{_q(BOOT_EVIL.format(pwned=PWNED, victim=victim.path))} > {evil_run}/supervise.py")
        assert swapped.returncode == 0, swapped.stderr
        # the reboot: the worker's processes are gone without a word, then its @reboot entry runs as root
        net_bed.run("node-1", f"kill -KILL {state['supervisor_pid']}; kill -KILL -- -{state['pgid']}")
        booted = net_bed.run("node-1", "env -i PATH=/usr/bin:/bin sh -c " + _q(entries[0].removeprefix("@reboot ")))
        assert victim.unchanged(), victim.path.read_text()
        assert booted.returncode != 0 and "Traceback" not in booted.stderr, booted.stderr
        assert f"deployer on-boot: {parent} is not safe" in booted.stderr and "not started" in booted.stderr, \
            booted.stderr
    finally:
        parent.chmod(0o755)
        if (parent / "old").exists():
            shutil.rmtree(workdirs[1], ignore_errors=True)
            os.rename(parent / "old", workdirs[1])
        down(tmp_path, prof, "--break-lock")
