"""The target-side helper (deployer/supervisor/helper.py) as the target runs it: the one-file bundle
(remote/program.py) under the system python3, spoken to in line-delimited JSON over its stdin/stdout."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deployer.supervisor.protocol import OPS

from deployer.remote.program import payload_bundle

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


class Helper:
    """One helper process; `ask` sends requests and collects the replies by id (they may come out of order)."""

    def __init__(self, tmp: Path) -> None:
        payload, digest = payload_bundle()
        self.program = tmp / f"helper-{digest}.py"
        self.program.write_bytes(payload)
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp)}
        self.proc = subprocess.Popen([PY, "-B", str(self.program), "serve", digest], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        self.hello = json.loads(self._line())["hello"]
        self.ids = 0

    def _line(self) -> bytes:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def send(self, op: str, **fields: Any) -> int:
        assert self.proc.stdin is not None
        self.ids += 1
        self.proc.stdin.write(json.dumps({"id": self.ids, "op": op, **fields}).encode() + b"\n")
        self.proc.stdin.flush()
        return self.ids

    def replies(self, count: int) -> list[dict[str, Any]]:
        return [json.loads(self._line()) for _ in range(count)]

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        rid = self.send(op, **fields)
        (reply,) = self.replies(1)
        assert reply["id"] == rid
        return reply

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=5)


@pytest.fixture
def helper(tmp_path: Path) -> Iterator[Helper]:
    h = Helper(tmp_path)
    try:
        yield h
    finally:
        if h.proc.poll() is None:
            h.proc.kill()
            h.proc.wait(timeout=5)


def test_hello_names_the_version_and_the_home(helper: Helper, tmp_path: Path) -> None:
    assert helper.hello["version"] == payload_bundle()[1] and helper.hello["home"] == str(tmp_path)
    assert helper.hello["pid"] == helper.proc.pid and helper.hello["protocol"] == 1


def test_run_gives_exit_code_streams_and_stdin(helper: Helper) -> None:
    r = helper.ask("run", cmd="echo out; echo err >&2; exit 3", timeout=10)
    assert (r["ok"], r["exit_code"], r["stdout"], r["stderr"], r["timed_out"]) == (True, 3, "out\n", "err\n", False)
    data = bytes(range(256)) * 1024
    r = helper.ask("run", cmd="sha256sum", timeout=10, stdin_b64=base64.b64encode(data).decode())
    assert r["stdout"].split()[0] == hashlib.sha256(data).hexdigest()
    assert helper.ask("run", cmd="cat", timeout=10)["stdout"] == ""  # no stdin: EOF at once


def test_commands_do_not_run_the_login_shells_rc_file_again(helper: Helper, tmp_path: Path) -> None:
    """The helper was exec'ed by the login shell (SHLVL 0 now); bash under sshd reads ~/.bashrc below level 2."""
    (tmp_path / ".bashrc").write_text(f"echo ran >> {tmp_path / 'rc-ran'}\n")
    r = helper.ask("run", cmd="SSH_CLIENT='127.0.0.1 1 22' bash -c 'echo $SHLVL'", timeout=10)
    assert r["stdout"].strip() == "2" and not (tmp_path / "rc-ran").exists()


def test_a_timed_out_command_is_killed_with_its_group(helper: Helper, tmp_path: Path) -> None:
    marker = tmp_path / "still-running"
    t0 = time.monotonic()
    r = helper.ask("run", cmd=f"echo started; (sleep 1.5; touch {marker}) & sleep 30", timeout=0.5)
    assert time.monotonic() - t0 < 3 and r["timed_out"] and r["exit_code"] == -1 and r["stdout"] == "started\n"
    time.sleep(1.6)
    assert not marker.exists()


def test_requests_run_concurrently_and_replies_carry_their_id(helper: Helper) -> None:
    slow = helper.send("run", cmd="sleep 2; echo slow", timeout=10)
    fast = helper.send("run", cmd="echo fast", timeout=10)
    t0 = time.monotonic()
    (first,) = helper.replies(1)
    assert (first["id"], first["stdout"]) == (fast, "fast\n") and time.monotonic() - t0 < 1.5
    (second,) = helper.replies(1)
    assert (second["id"], second["stdout"]) == (slow, "slow\n")


def test_verify_hashes_files_and_names_the_missing(helper: Helper, tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"alpha")
    r = helper.ask("verify", paths=[str(tmp_path / "a"), str(tmp_path / "missing")])
    assert r["digests"] == [hashlib.sha256(b"alpha").hexdigest(), None]


def test_bad_requests_get_one_error_reply_and_the_helper_carries_on(helper: Helper) -> None:
    assert helper.ask("nope") == {"id": 1, "ok": False, "error": "unknown op 'nope'", "kind": "bad-request"}
    r = helper.ask("run")  # no cmd
    assert not r["ok"] and r["kind"] == "bad-request" and "cmd" in r["error"]
    assert helper.proc.stdin is not None
    helper.proc.stdin.write(b"not json\n")
    helper.proc.stdin.flush()
    assert helper.replies(1)[0]["ok"] is False
    assert helper.ask("run", cmd="echo still", timeout=5)["stdout"] == "still\n"


def holder(command: str) -> dict[str, Any]:
    return {"owner": "t@laptop", "pid": 1, "host_id": "laptop/boot", "command": command}


def test_lease_take_busy_beat_release(helper: Helper, tmp_path: Path) -> None:
    lock = str(tmp_path / "dep" / "lock")
    took = helper.ask("lease_take", path=lock, holder=holder("up"), token="t1", lease_s=30, mode="take")
    assert took["word"] == "LOCKED" and took["data"]["reason"] is None
    busy = helper.ask("lease_take", path=lock, holder=holder("down"), token="t2", lease_s=30, mode="take")
    assert busy["word"] == "BUSY" and busy["data"]["command"] == "up" and "token" not in busy["data"]
    assert helper.ask("lease_beat", token="t1")["word"] == "OK"
    assert helper.ask("lease_beat", token="t1", release=True)["word"] == "RELEASED"
    assert json.loads(Path(lock).read_text())["released_at"]
    assert helper.ask("lease_beat", token="t1")["kind"] == "lease"  # no longer held here


def test_a_broken_lease_beats_lost_and_the_break_is_recorded(helper: Helper, tmp_path: Path) -> None:
    lock = str(tmp_path / "lock")
    helper.ask("lease_take", path=lock, holder=holder("up"), token="t1", lease_s=30, mode="take")
    broke = helper.ask("lease_take", path=lock, holder=holder("down"), token="t2", lease_s=30, mode="break")
    assert broke["word"] == "LOCKED" and broke["data"]["reason"] == "broken"
    lost = helper.ask("lease_beat", token="t1")
    assert lost["word"] == "LOST" and lost["data"]["command"] == "down" and lost["data"]["held"]
    events = [json.loads(line) for line in Path(lock + "-events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["lock-broken"]


def test_eof_ends_the_helper_at_once_and_leaves_a_held_lease_to_expire(helper: Helper, tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    helper.ask("lease_take", path=str(lock), holder=holder("up"), token="t1", lease_s=30, mode="take")
    t0 = time.monotonic()
    assert helper.close() == 0 and time.monotonic() - t0 < 2
    lease = json.loads(lock.read_text())
    assert lease["token"] == "t1" and lease["expires_at"] > time.time()  # a reconnecting client re-takes it


def test_read_only_supervisor_commands_are_answered_inside_the_helper(helper: Helper, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    status = helper.ask("supervise", argv=["status", str(run)])
    assert status["exit_code"] == 0 and json.loads(status["stdout"])["status"] == "absent"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        busy = helper.ask("supervise", argv=["ports", str(port)])
        assert busy["exit_code"] == 1 and busy["stdout"].startswith(f"busy {port}: pid ")
    free = helper.ask("supervise", argv=["ports", str(port)])
    assert (free["exit_code"], free["stdout"]) == (0, f"free {port}\n")
    missing = helper.ask("supervise", argv=["status", str(tmp_path / "nope")])
    assert missing["exit_code"] == 2 and missing["stderr"].startswith("supervise: no such run dir")
    refused = helper.ask("supervise", argv=["start", str(run)])  # start daemonizes: never inside the helper
    assert not refused["ok"] and "only status, ports, listener" in refused["error"]


# -- the file ops (files.py): inside the deployment dir only, never through a symlink --------------

def deployment(tmp_path: Path) -> Path:
    root = tmp_path / "dep"
    (root / "runs" / "r1").mkdir(parents=True)
    (root / "runs" / "r2").mkdir()
    root.chmod(0o700)
    return root


def test_link_replaces_the_symlink_itself_never_what_it_points_at(helper: Helper, tmp_path: Path) -> None:
    root = deployment(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "current").symlink_to(outside)       # planted: ln -sfn would have followed a link to a dir
    assert helper.ask("link", path=str(root / "current"), target="runs/r2", within=str(root))["ok"]
    assert os.readlink(root / "current") == "runs/r2" and list(outside.iterdir()) == []
    assert helper.ask("readlink", path=str(root / "current"))["target"] == "runs/r2"
    assert helper.ask("readlink", path=str(root / "runs"))["target"] is None        # not a link
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []          # no temp left


def test_link_and_remove_refuse_paths_outside_the_deployment_dir(helper: Helper, tmp_path: Path) -> None:
    root = deployment(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    for op, fields in [("link", {"path": str(tmp_path / "current"), "target": "runs/r1"}),
                       ("link", {"path": str(root / "current"), "target": "../victim"}),
                       ("remove", {"paths": [str(victim)]}),
                       ("remove", {"paths": [str(root / "runs" / ".." / ".." / "victim")]}),
                       ("remove", {"paths": [str(root)]})]:
        r = helper.ask(op, within=str(root), **fields)
        assert not r["ok"] and r["kind"] in ("unsafe", "bad-request"), (op, fields, r)
    assert victim.read_text() == "keep" and not (tmp_path / "current").exists()


def test_remove_never_follows_a_symlink(helper: Helper, tmp_path: Path) -> None:
    root = deployment(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    (root / "runs" / "r1" / "env").write_text("SECRET=1")
    (root / "runs" / "r1" / "models").symlink_to(outside)      # inside a dir that goes
    (root / "runs" / "r3").symlink_to(outside)                  # a run "dir" that is a link
    r = helper.ask("remove", paths=[str(root / "runs" / "r1" / "env"), str(root / "runs" / "r1"),
                                    str(root / "runs" / "r3"), str(root / "runs" / "gone")], within=str(root))
    assert r["ok"] and r["removed"] == 3
    assert sorted(p.name for p in (root / "runs").iterdir()) == ["r2"]
    assert (outside / "precious").read_text() == "keep"
    (root / "runs" / "link").symlink_to(outside)
    through = helper.ask("remove", paths=[str(root / "runs" / "link" / "precious")], within=str(root))
    assert not through["ok"] and through["kind"] == "unsafe" and "symbolic link" in through["error"]
    assert (outside / "precious").read_text() == "keep"


def test_disk_mkdir_and_listdir(helper: Helper, tmp_path: Path) -> None:
    root = deployment(tmp_path)
    (root / "a.py").write_bytes(b"alpha")
    (root / "b.py").symlink_to(root / "a.py")                   # a link is no file of ours: no digest
    facts = helper.ask("disk", path=str(root), files=[str(root / "a.py"), str(root / "b.py"), str(root / "c")])
    assert facts["digests"] == [hashlib.sha256(b"alpha").hexdigest(), None, None]
    now = os.statvfs(root).f_bavail * os.statvfs(root).f_frsize   # others write to this disk meanwhile: close, not equal
    assert abs(facts["free"] - now) < 64 << 20, (facts["free"], now)
    made = helper.ask("mkdir", path=str(root / "runs" / "r9"), within=str(root), need=1024)
    assert made["made"] and (root / "runs" / "r9").stat().st_mode & 0o777 == 0o700
    again = helper.ask("mkdir", path=str(root / "runs" / "r9"), within=str(root), need=1024)
    assert not again["ok"] and again["kind"] == "exists"
    full = helper.ask("mkdir", path=str(root / "runs" / "r10"), within=str(root), need=1 << 62)
    assert full["ok"] and not full["made"] and not (root / "runs" / "r10").exists()
    (root / "runs" / ".hidden").mkdir()
    assert helper.ask("listdir", path=str(root / "runs"))["names"] == ["r1", "r2", "r9"]
    assert helper.ask("listdir", path=str(root / "none"))["names"] is None


def test_find_bytes_runs_and_lease_show(helper: Helper, tmp_path: Path) -> None:
    root = deployment(tmp_path)
    log = root / "runs" / "r1" / "engine.log"
    needle = b"Traceback (most recent call last)"
    log.write_bytes(b"x" * ((1 << 20) - 5) + needle + b"\n" + needle)     # the first one across a chunk's end
    assert helper.ask("find_bytes", path=str(log), needle_b64=base64.b64encode(needle).decode(),
                      offset=0)["at"] == (1 << 20) - 5
    assert helper.ask("find_bytes", path=str(log), needle_b64=base64.b64encode(needle).decode(),
                      offset=1 << 20)["at"] == (1 << 20) - 5 + len(needle) + 1
    assert helper.ask("find_bytes", path=str(root / "nope"), needle_b64="eA==")["kind"] == "notfound"
    (root / "runs" / "r1" / "state.json").write_text(json.dumps({"status": "exited", "ready_at": 5}))
    (root / "runs" / "r2" / "profile.json").write_text(json.dumps({"content_hash": "h2"}))
    (root / "runs" / "r2" / "env").write_text("A=1")
    (root / "current").symlink_to("runs/r2")
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    (root / "runs" / "r2" / "supervise.py").write_text(f'"""an entry"""\nimport os\nPAYLOAD = {a!r}\n')
    (root / "supervise.py").write_text(f"PAYLOAD = {b!r}\n")
    (root / "payload").mkdir()
    for name in (f"{a}.py", f"{c}.py", "notes.txt"):
        (root / "payload" / name).write_text("x")
    os.utime(root / "payload" / f"{c}.py", (time.time() - 7200, time.time() - 7200))
    (root / "payload" / f"{b}.py").symlink_to(root / "payload" / f"{a}.py")   # a link is no payload of ours
    reply = helper.ask("runs", path=str(root / "runs"))
    ages = {p["digest"]: p["age_s"] for p in reply.pop("payloads")}
    assert reply == {
        "id": 4, "ok": True, "current": "r2", "root_payload": b,
        "runs": [{"id": "r1", "hash": "", "ready": True, "status": "exited", "env": False, "payload": ""},
                 {"id": "r2", "hash": "h2", "ready": False, "status": "unknown", "env": True, "payload": a}]}
    assert set(ages) == {a, c} and ages[a] < 60 and 7100 < ages[c] < 7300
    assert helper.ask("lease_show", path=str(root / "lock"))["lease"] == {"held": False}
    helper.ask("lease_take", path=str(root / "lock"), holder=holder("up"), token="t1", lease_s=30, mode="take")
    shown = helper.ask("lease_show", path=str(root / "lock"))["lease"]
    assert shown["held"] and shown["command"] == "up" and "token" not in shown
    assert isinstance(helper.ask("kernel_log", lines=5)["text"], str)


def test_a_helper_whose_lease_was_broken_refuses_every_change_but_still_reads(tmp_path: Path) -> None:
    """Fencing (issue 22 finding 3): `up`'s helper holds t1; `down --break-lock` (another helper) takes t2. Before
    t1's next heartbeat, the lost `up` asks its helper to start, stop or write: refused, nothing done."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    lost, other = Helper(tmp_path / "a"), Helper(tmp_path / "b")
    try:
        lock, marker = str(tmp_path / "dep" / "lock"), tmp_path / "dep" / "started"
        assert lost.ask("lease_take", path=lock, holder=holder("up"), token="t1", lease_s=30)["word"] == "LOCKED"
        held = lost.ask("run", cmd='echo "$DEPLOYER_LEASE_TOKENS"', timeout=5)
        assert held["ok"] and held["stdout"] == "t1\n"  # what a supervisor started now is told (restart fencing)
        broke = other.ask("lease_take", path=lock, holder=holder("down"), token="t2", lease_s=30, mode="break")
        assert broke["word"] == "LOCKED"
        refused = lost.ask("run", cmd=f"touch {marker}", timeout=5)
        assert refused["ok"] is False and refused["kind"] == "fenced" and not marker.exists()
        assert "no longer ours (now held by t@laptop pid 1 (down))" in refused["error"]
        data = base64.b64encode(b"x").decode()
        wrote = lost.ask("install", files=[{"path": str(marker), "mode": 0o644, "data_b64": data,
                                            "sha256": hashlib.sha256(b"x").hexdigest()}])
        assert wrote["kind"] == "fenced" and not marker.exists()
        assert lost.ask("mkdirs", path=str(tmp_path / "dep" / "runs"), owned_from=str(tmp_path))["kind"] == "fenced"
        dep = tmp_path / "dep"
        (dep / "runs" / "old").mkdir(parents=True)
        for op, fields in [("link", {"path": str(dep / "current"), "target": "runs/old", "within": str(dep)}),
                           ("remove", {"paths": [str(dep / "runs" / "old")], "within": str(dep)}),
                           ("mkdir", {"path": str(dep / "runs" / "new"), "within": str(dep), "need": 0})]:
            assert lost.ask(op, **fields)["kind"] == "fenced", op   # the file ops that change files, too
        assert (dep / "runs" / "old").is_dir() and not (dep / "current").exists() and not (dep / "runs" / "new").exists()
        assert lost.ask("listdir", path=str(dep / "runs"))["ok"]
        assert lost.ask("size", path=lock)["ok"]  # reads still answer (status, the report)
        assert other.ask("run", cmd=f"touch {marker}", timeout=5)["ok"] and marker.exists()  # the new holder acts
        lost.ask("lease_beat", token="t1")  # LOST: and still refused afterwards (the token is forgotten)
        assert lost.ask("run", cmd="true", timeout=5)["kind"] == "fenced"
        for name, op in OPS.items():  # the protocol's table says which ops change files: exactly those are fenced
            if not op.program:        # (a program op starts a process: fetch and push are tested on their own)
                assert (lost.ask(name).get("kind") == "fenced") == op.changes, name
    finally:
        lost.close()
        other.close()


def test_a_supervisor_may_restart_only_while_nobody_else_holds_the_lock_and_its_run_is_current(
        tmp_path: Path) -> None:
    from deployer.supervisor import lease

    dep = tmp_path / "dep"
    run = dep / "runs" / "r1"
    run.mkdir(parents=True)
    (dep / "current").symlink_to("runs/r1")
    assert lease.restart_refusal(str(run), frozenset({"t1"})) is None  # no lock file: nothing says no
    fd, _ = lease.acquire(str(dep / "lock"), holder("up"), "t1", 30, "take")
    try:
        assert lease.restart_refusal(str(run), frozenset({"t1"})) is None  # its own up still holds it
        assert "held by t@laptop pid 1 (up)" in str(lease.restart_refusal(str(run), frozenset({"t0"})))
        lease.update(fd, "t1", 30, release=True)
        assert lease.restart_refusal(str(run), frozenset()) is None  # released: the 3 a.m. crash is restarted
        (dep / "current").unlink()
        (dep / "current").symlink_to("runs/r2")
        assert "current run is now r2" in str(lease.restart_refusal(str(run), frozenset({"t1"})))
    finally:
        os.close(fd)


def test_a_program_op_runs_its_module_as_a_child_with_its_lines_relayed_and_its_stdin_fed(helper: Helper) -> None:
    """`push` (protocol.Op.program): the helper's payload runs again as its child; what `feed` writes is its
    stdin, its lines come back as the request's stream, then its exit code; the conversation answers meanwhile."""
    started = helper.ask("push")
    assert started["ok"] and started["pid"] > 0
    fed = helper.send("feed", stream=started["id"], data_b64=base64.b64encode(b"{}\n").decode())
    lines, replies = [], {}
    for _ in range(20):
        got = json.loads(helper._line())
        if "stream" in got:
            assert got["stream"] == started["id"]
            lines.append(got)
            if "end" in got:
                break
        else:
            replies[got["id"]] = got
    assert replies[fed]["ok"] is True
    assert json.loads(lines[0]["line"])["error"] == "request"   # push.py's own answer to a bad request
    assert lines[-1] == {"stream": started["id"], "end": 2}
    gone = helper.ask("feed", stream=started["id"], eof=True)
    assert gone["ok"] is False and gone["kind"] == "ended"
    assert helper.ask("size", path="/nonexistent")["ok"]


def test_a_program_op_ends_when_its_stdin_is_closed_or_the_helper_ends(helper: Helper) -> None:
    first, second = helper.ask("fetch"), helper.ask("fetch")
    assert helper.ask("feed", stream=first["id"], eof=True)["ok"]   # the client closed its session: it ends
    for _ in range(3):   # maybe its one line (no request came), then its end: its error (2), or its caller gone (3)
        said = json.loads(helper._line())
        assert said["stream"] == first["id"]
        if "end" in said:
            assert said["end"] in (2, 3)
            break
    else:
        raise AssertionError("the fetch whose stdin was closed did not end")
    assert helper.close() == 0   # the client is gone: the helper ends, and the fetch it still ran with it
    for _ in range(50):
        try:
            os.kill(second["pid"], 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the second fetch outlived its helper")
