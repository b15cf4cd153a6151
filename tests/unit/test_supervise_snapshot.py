"""The supervisor's read-only `snapshot` (issue 13: on-call commands in one round trip), run with a real python
on run dirs in tmp: as a script, and the way deployer runs it (its own copy over stdin, through LocalRemote)."""

from __future__ import annotations

import ast
import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deployer.engines import engine_for
from deployer.errors import NotFound, TargetError
from deployer.operate.deployment import diagnose_attempt, pick_run
from deployer.remote.local import LocalRemote
from deployer.supervisor import snapshot as snap_mod
from deployer.box import snapshot
from deployer.box.records import tail_lines, window_lines
from payload import payload_program

SCRIPT = Path(snap_mod.__file__)
PROGRAM, SUPERVISE = payload_program("snapshot.py"), payload_program("supervise.py")  # as on the target
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
RUN_A, RUN_B, RUN_C = "20260101T000000.000001Z-aaaaaaaa-a1", "20260102T000000.000001Z-bbbbbbbb-a1", \
    "20260103T000000.000001Z-cccccccc-a2"


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-B", str(PROGRAM), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def snapshot_json(*args: str) -> dict[str, Any]:
    proc = run_script(*args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    data = json.loads(proc.stdout)
    assert isinstance(data, dict)
    return data


def make_run(root: Path, run_id: str, *, state: dict[str, Any] | None = None, profile: dict[str, Any] | None = None,
             outcome: dict[str, Any] | None = None, log: bytes | None = None, env: str | None = None) -> Path:
    run = root / "runs" / run_id
    run.mkdir(parents=True)
    for name, value in (("state.json", state), ("profile.json", profile), ("outcome.json", outcome)):
        if value is not None:
            (run / name).write_text(json.dumps(value))
    if log is not None:
        (run / "engine.log").write_bytes(log)
    if env is not None:
        (run / "env").write_text(env)
    return run


def set_current(root: Path, run_id: str) -> None:
    (root / "current").symlink_to(f"runs/{run_id}")


def dead_pid() -> int:
    proc = subprocess.run([PY, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, timeout=30)
    return int(proc.stdout)


def test_source_stays_python38_and_stdlib_only() -> None:
    source = SCRIPT.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    assert "from __future__ import annotations" in source  # annotations are never evaluated on 3.8
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__", "deployer", "supervise", "base",
                                                        "protocol"}
    assert "removeprefix" not in source and "removesuffix" not in source  # 3.9 str methods


def test_missing_everything_is_null_not_an_error(tmp_path: Path) -> None:
    data = snapshot_json(str(tmp_path / "nothing-here"), "--runs", "all", "--log-tail", "100")
    assert data["runs"] == [] and data["current"] is None and data["status"] is None and data["log"] is None
    assert data["exists"] is False and data["records"] == {}

    root = tmp_path / "dep"
    make_run(root, RUN_A)  # a run dir with no records at all (a push that died early)
    set_current(root, RUN_A)
    data = snapshot_json(str(root), "--log-tail", "100")
    assert data["runs"] == [RUN_A] and data["current"] == RUN_A and data["exists"] is True
    assert data["records"][RUN_A] == {"profile": None, "state": None, "outcome": None, "unreadable": {}}
    assert data["status"] == {"status": "absent", "alive": False, "supervisor_alive": False}
    assert data["env"] == {RUN_A: None}
    assert data["log"] == {"run": RUN_A, "size": 0, "start": 0, "data": ""}


def test_damaged_records_are_null_and_say_why(tmp_path: Path) -> None:
    root = tmp_path / "dep"
    run = make_run(root, RUN_A, outcome={"outcome": "ready"})
    (run / "profile.json").write_text('{"attempt": 1, "port"')  # cut by a full disk
    (run / "state.json").write_text("[1, 2]")                    # JSON, but not an object
    (run / "outcome.json").write_bytes(b"\xff\xfe{}")            # not UTF-8
    data = snapshot_json(str(root), "--runs", "all")
    rec = data["records"][RUN_A]
    assert rec["profile"] is None and rec["state"] is None and rec["outcome"] is None
    assert rec["unreadable"]["profile.json"].startswith("not JSON")
    assert rec["unreadable"]["state.json"] == "not a JSON object (list)"
    assert rec["unreadable"]["outcome.json"].startswith("not JSON")

    (run / "outcome.json").unlink()
    (run / "outcome.json").mkdir()  # cannot be read at all
    (run / "profile.json").write_text(json.dumps({"pad": "x" * (snap_mod.RECORD_LIMIT + 10)}))
    rec = snapshot_json(str(root), "--runs", "all")["records"][RUN_A]
    assert rec["outcome"] is None and rec["unreadable"]["outcome.json"]  # "Is a directory"
    assert rec["profile"] is None and rec["unreadable"]["profile.json"] == f"larger than {snap_mod.RECORD_LIMIT} bytes"


def test_damaged_state_of_the_current_run_gives_an_absent_status_not_a_traceback(tmp_path: Path) -> None:
    root = tmp_path / "dep"
    run = make_run(root, RUN_A)
    (run / "state.json").write_text("{broken")
    set_current(root, RUN_A)
    data = snapshot_json(str(root))
    assert data["status"]["status"] == "absent" and "unreadable" in data["status"]["error"]


def test_live_status_is_what_supervise_status_says(tmp_path: Path) -> None:
    root = tmp_path / "dep"
    state = {"status": "ready", "pid": dead_pid(), "pgid": dead_pid(), "supervisor_pid": dead_pid(),
             "started_at": 1.0, "restarts": 2}
    run = make_run(root, RUN_A, state=state)
    set_current(root, RUN_A)
    data = snapshot_json(str(root))
    direct = subprocess.run([PY, "-B", str(SUPERVISE), "status", str(run)], capture_output=True, text=True,
                            timeout=30)
    assert data["status"] == json.loads(direct.stdout)
    assert data["status"]["status"] == "lost"  # its daemon and group are gone
    assert data["records"][RUN_A]["state"] == state  # the record itself, as written


def test_runs_selection_and_the_log_of_the_previous_run(tmp_path: Path) -> None:
    root = tmp_path / "dep"
    for run_id in (RUN_A, RUN_B, RUN_C):
        make_run(root, run_id, profile={"attempt": run_id[-1]}, log=f"log of {run_id}\n".encode(),
                 env=f"SECRET_{run_id[-2:].upper()}='v'\n")
    (root / "runs" / ".tmp-push").mkdir()  # hidden entries are not runs
    set_current(root, RUN_B)  # a rollback: the newest run is not the current one
    data = snapshot_json(str(root), "--runs", "1", "--log-tail", "4096", "--previous")
    assert data["runs"] == [RUN_A, RUN_B, RUN_C]
    assert sorted(data["records"]) == [RUN_A, RUN_B, RUN_C]  # newest 1, the current, the log's run
    assert data["log"]["run"] == RUN_A  # the run before the current one
    assert base64.b64decode(data["log"]["data"]) == f"log of {RUN_A}\n".encode()
    assert sorted(data["env"]) == [RUN_A, RUN_B]  # only runs whose text is shown: never every env file
    assert sorted(snapshot_json(str(root))["records"]) == [RUN_B]
    (root / "current").unlink()
    set_current(root, RUN_A)
    assert snapshot_json(str(root), "--log-tail", "10", "--previous")["log"] is None  # nothing before the first


def test_huge_log_is_read_as_one_bounded_window_from_its_end(tmp_path: Path) -> None:
    root = tmp_path / "dep"
    run = make_run(root, RUN_A)
    set_current(root, RUN_A)
    with open(run / "engine.log", "wb") as f:  # 3 GB, sparse: reading all of it would take minutes
        f.truncate(3 << 30)
        f.seek(0, os.SEEK_END)
        f.write(b"\nlast line\n")
    size = (3 << 30) + 11
    data = snapshot_json(str(root), "--log-tail", "64")
    assert data["log"]["size"] == size and data["log"]["start"] == size - 64
    raw = base64.b64decode(data["log"]["data"])
    assert len(raw) == 64 and raw.endswith(b"\nlast line\n")


def test_log_window_is_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"x" * 5000)
    monkeypatch.setattr(snap_mod, "LOG_LIMIT", 1000)
    win = snap_mod.log_window(str(log), 10**9)
    assert win["size"] == 5000 and win["start"] == 4000 and len(base64.b64decode(win["data"])) == 1000


@pytest.mark.parametrize("argv", [[], ["a", "b"], ["d", "--runs", "x"], ["d", "--log-tail", "-5"], ["d", "--bogus"],
                                  ["d", "--runs"]])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, argv: list[str]) -> None:
    proc = run_script(*(str(tmp_path / a) if a == "d" else a for a in argv))
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_workdir_lists_deployments_with_runs_and_expands_home(tmp_path: Path) -> None:
    work = tmp_path / "home" / "work"
    make_run(work / "one", RUN_A, profile={"port": 1})
    set_current(work / "one", RUN_A)
    make_run(work / "two", RUN_B)   # no current run: listed, the caller skips it
    (work / "stray").mkdir()        # not a deployment
    (work / ".hidden" / "runs").mkdir(parents=True)
    proc = run_script("~/work", "--workdir", env={"HOME": str(tmp_path / "home")})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["workdir"] == str(work)
    assert sorted(data["deployments"]) == ["one", "two"]
    one = data["deployments"]["one"]
    assert one["root"] == str(work / "one") and one["current"] == RUN_A
    assert one["records"][RUN_A]["profile"] == {"port": 1} and one["log"] is None


# --- the deployer side: its own copy over stdin (no file of the target's is run), parsed into RunViews ---

def test_take_through_the_stdin_bootstrap_matches_the_records_and_the_log_tail(tmp_path: Path) -> None:
    root = tmp_path / "dep"
    lines = [f"line {i} " + "y" * (i % 50) for i in range(3000)] + ["\r100%|#####| bar \x1b[2K", "end"]
    log = ("\n".join(lines) + "\n").encode()
    make_run(root, RUN_A, profile={"attempt": 1}, outcome={"outcome": "ready"}, state={"status": "stopped"})
    make_run(root, RUN_B, profile={"attempt": 2}, state={"status": "stopped", "restarts": 1}, log=log,
             env="HF_TOKEN='hf_secret'\n")
    set_current(root, RUN_B)
    remote = LocalRemote()
    snap = snapshot.take(remote, str(root), runs=None, log_tail=4096)
    assert snap.runs == [RUN_A, RUN_B] and snap.current == RUN_B and snap.name == "dep"
    assert snap.view(RUN_A).outcome == {"outcome": "ready"} and snap.view(RUN_A).record == {"attempt": 1}
    cur = snap.current_view()
    assert cur is not None and cur.run.path == str(root / "runs" / RUN_B) and cur.status == "stopped"
    assert cur.state["supervisor_alive"] is False and snap.view(RUN_B).state == {"status": "stopped", "restarts": 1}
    assert snap.env == {RUN_B: "HF_TOKEN='hf_secret'\n"}
    assert snap.log is not None and snap.log.size == len(log)
    # the same lines `tail_lines` reads over SFTP (a cut first line dropped, the bar shown by its end)
    assert window_lines(snap.log.data, snap.log.start, 20) == tail_lines(remote, str(root / "runs" / RUN_B /
                                                                                    "engine.log"), 20, window=4096)
    assert pick_run(snap, False, "here").run.run_id == RUN_B
    assert pick_run(snap, True, "here").run.run_id == RUN_A
    with pytest.raises(NotFound, match="no run before"):
        pick_run(snapshot.Snapshot(snap.layout, [RUN_B], RUN_B, {}, None, {}, None), True, "here")
    with pytest.raises(NotFound, match="no runs of"):
        pick_run(snapshot.take(remote, str(tmp_path / "gone")), False, "here")


def test_take_says_one_line_when_the_target_cannot_answer(tmp_path: Path) -> None:
    class NoPython(LocalRemote):
        def run(self, cmd: str, **kw: Any) -> Any:
            return super().run("echo 'bash: python3: command not found' >&2; echo HF_TOKEN=leak; exit 127", **kw)

    with pytest.raises(TargetError) as err:
        snapshot.take(NoPython(), str(tmp_path))
    assert "python3: command not found" in str(err.value) and "leak" not in str(err.value)


# --- the attempt windows `deploy diagnose` (and `status` of a crashed run) read, in the same trip ---

def test_attempt_of_the_newest_failed_run(tmp_path: Path) -> None:
    root = tmp_path / "dep"
    make_run(root, RUN_A, state={"status": "exited", "exit_code": 1, "log_offset": 0}, log=b"boom A\n",
             env="A_TOKEN='a'\n")
    make_run(root, RUN_B, state={"status": "stopped"}, outcome={"outcome": "failed"}, log=b"old\nboom B\n")
    make_run(root, RUN_C, state={"status": "stopped"}, outcome={"outcome": "ready"}, log=b"fine\n")
    set_current(root, RUN_C)
    data = snapshot_json(str(root), "--runs", "all", "--attempt", "failed")
    assert data["attempt"]["run"] == RUN_B  # the newest that did not end ready, not the current one
    assert [base64.b64decode(w["data"]) for w in data["attempt"]["windows"]] == [b"old\nboom B\n"]
    assert data["attempt"]["dmesg"] is None  # no signal: the kernel log is not read
    assert sorted(data["env"]) == [RUN_B, RUN_C]
    assert snapshot_json(str(root), "--runs", "all", "--attempt", "current")["attempt"] is None  # C is fine
    (root / "runs" / RUN_C / "state.json").write_text(json.dumps({"status": "ready", "pid": dead_pid()}))
    lost = snapshot_json(str(root), "--attempt", "current")  # a "ready" whose processes are gone is lost
    assert lost["status"]["status"] == "lost" and lost["attempt"]["run"] == RUN_C
    assert snapshot_json(str(root), "--runs", "all")["attempt"] is None


def test_attempt_of_a_big_log_is_its_first_traceback_and_its_tail(tmp_path: Path) -> None:
    root = tmp_path / "dep"
    filler = b"loading shard\n" * ((snap_mod.DIAG_WINDOW + snap_mod.TAIL_WINDOW) // 14 + 1000)
    offset = 7  # the last engine life starts here; an earlier life's traceback is before it
    log = b"Trace\n" + b"x" * (offset - 6) + filler + b"[rank0] Traceback (most recent call last):\n  File x\n" + \
        filler + b"the very end\n"
    state = {"status": "crashloop", "last_crash": {"log_offset": offset, "exit_code": 1, "signal": None}}
    make_run(root, RUN_A, state=state, log=log)
    set_current(root, RUN_A)
    tb_line = log.index(b"[rank0] Traceback")
    # the traceback's line start, as `grep -b -m1` finds it (the state has no traceback_offset: an older supervisor)
    assert snap_mod.find_traceback(str(root / "runs" / RUN_A / "engine.log"), offset) == tb_line
    data = snapshot_json(str(root), "--attempt", "current")
    windows = data["attempt"]["windows"]
    assert [w["start"] for w in windows] == [tb_line, len(log) - snap_mod.TAIL_WINDOW]
    assert base64.b64decode(windows[0]["data"]).startswith(b"[rank0] Traceback")
    assert len(base64.b64decode(windows[0]["data"])) == snap_mod.DIAG_WINDOW
    assert base64.b64decode(windows[1]["data"]).endswith(b"the very end\n")


def test_find_traceback_across_read_chunks_and_none(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    head = b"a" * ((1 << 20) - 10)  # the marker straddles the 1 MiB read boundary, on a line of its own
    log.write_bytes(head + b"\nTraceback (most recent call last):\n")
    assert snap_mod.find_traceback(str(log), 0) == len(head) + 1
    assert snap_mod.find_traceback(str(log), len(head) + 5) is None  # starts past the marker's beginning
    assert snap_mod.find_traceback(str(tmp_path / "missing"), 0) is None


def test_diagnose_from_the_snapshot_reads_the_failed_attempt(tmp_path: Path) -> None:
    root = tmp_path / "dep"
    log = b"Traceback (most recent call last):\n  File \"x.py\"\ntorch.OutOfMemoryError: CUDA out of memory.\n"
    make_run(root, RUN_A, state={"status": "exited", "exit_code": 1, "log_offset": 0}, log=log)
    snap = snapshot.take(LocalRemote(), str(root), runs=None, attempt="failed")
    assert snap.attempt is not None and snap.attempt.run_id == RUN_A and "OutOfMemoryError" in snap.attempt.text
    diag = diagnose_attempt(snap.attempt, snap.view(RUN_A).state, None, engine=engine_for("sglang"))
    assert diag.signature == "cuda-oom" and diag.evidence


def test_take_that_times_out_does_not_quote_the_output(tmp_path: Path) -> None:
    class Slow(LocalRemote):
        def run(self, cmd: str, **kw: Any) -> Any:
            return super().run("echo HF_TOKEN=leak; sleep 5", **{**kw, "timeout": 0.5})

    with pytest.raises(TargetError) as err:
        snapshot.take(Slow(), str(tmp_path))
    assert "no answer within" in str(err.value) and "leak" not in str(err.value)


def test_log_lines_are_the_last_n_whatever_their_length(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22 (7): lines, not bytes: blank lines are not counted, a long line comes by its ends and the exact
    bytes cut; a scan that ends inside a line says its start was not read."""
    log = tmp_path / "engine.log"
    long_line = b"H" * 128 + b"m" * 5000 + b"T" * 128
    log.write_bytes(b"a\nb\n\n  \nc\n" + long_line + b"\n\n")
    monkeypatch.setattr(snap_mod, "LINE_KEEP", 128)
    monkeypatch.setattr(snap_mod, "SCAN_BLOCK", 7)  # lines across block edges
    got = snap_mod.log_lines(str(log), 3)
    lines = [snapshot._line(x) for x in got["lines"]]
    assert [x.head for x in lines] == [b"b", b"c", b"H" * 128] and lines[2] == snapshot.LogLine(b"H" * 128, 5000,
                                                                                                  b"T" * 128)
    assert got["start"] == 2 and not got["first_partial"] and got["size"] == log.stat().st_size
    assert snapshot.shown_lines(lines)[2] == "H" * 128 + " ... [5000 bytes cut] ... " + "T" * 128
    assert [snapshot._line(x).head for x in snap_mod.log_lines(str(log), 99)["lines"][:2]] == [b"a", b"b"]
    monkeypatch.setattr(snap_mod, "LINES_SCAN", 1000)
    cut = snap_mod.log_lines(str(log), 3)
    assert len(cut["lines"]) == 1 and cut["first_partial"] and cut["start"] == log.stat().st_size - 1000
    shown = snapshot.shown_lines([snapshot._line(x) for x in cut["lines"]], True, cut["start"])
    assert shown[0].startswith(f"[start of line not read: it began before byte {cut['start']}]")
    assert snap_mod.log_lines(str(tmp_path / "none"), 3)["lines"] == []
    assert run_script(str(tmp_path), "--log-lines", "x").returncode == 2
