"""Unit tests of the supervisor's pieces: env file, config, policy maths, state files, liveness, CLI input."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deployer.supervisor import supervise as sv
from deployer.supervisor import base
from deployer.supervisor.base import SuperviseError, read_env_file
from payload import payload_program

SUPERVISE = Path(sv.__file__)
PROGRAM = payload_program("supervise.py")  # the program a run dir holds
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def write_env(path: Path, env: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()), encoding="utf-8")
    return path


def test_env_file_tricky_values(tmp_path: Path) -> None:
    env = {"A": "it's", "B": "$(rm -rf /) `x` $HOME", "C": "l1\nl2\n", "D": "日本 ☃", "E": "", "F": "x # y"}
    assert read_env_file(str(write_env(tmp_path / "env", env))) == env


def test_env_file_comments_export_and_blank_lines(tmp_path: Path) -> None:
    (tmp_path / "env").write_text("# written by deployer\n\nexport A='1'\nB=two  # trailing\n")
    assert read_env_file(str(tmp_path / "env")) == {"A": "1", "B": "two"}


def test_env_file_reads_what_render_writes(tmp_path: Path) -> None:
    from deployer.render.bundle import env_file_text
    env = {"HF_TOKEN": "hf_'x'$(y)", "MULTI": "a\nb", "CUDA_VISIBLE_DEVICES": "0,1"}
    (tmp_path / "env").write_text(env_file_text(env), encoding="utf-8")
    assert read_env_file(str(tmp_path / "env")) == env


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True),
                       st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                               max_size=40), max_size=5))
def test_env_file_round_trips_shell_quoting(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> None:
    path = write_env(tmp_path_factory.mktemp("env") / "env", env)
    assert read_env_file(str(path)) == env


@pytest.mark.parametrize("text", ["NOT AN ASSIGNMENT\n", "1X='a'\n", "A='unterminated\n", "='v'\n"])
def test_env_file_bad_entries_are_bad_input_and_do_not_echo_values(tmp_path: Path, text: str) -> None:
    (tmp_path / "env").write_text(text)
    with pytest.raises(SuperviseError) as err:
        read_env_file(str(tmp_path / "env"))
    assert err.value.code == 2 and "ASSIGNMENT" not in str(err.value)


def test_env_file_missing(tmp_path: Path) -> None:
    with pytest.raises(SuperviseError, match="cannot read env file"):
        read_env_file(str(tmp_path / "nope"))


def run_dir_with(tmp_path: Path, cfg: object) -> Path:
    (tmp_path / "launch.sh").write_text("exit 0\n")
    (tmp_path / "supervise.json").write_text(json.dumps(cfg))
    return tmp_path


def test_config_defaults(tmp_path: Path) -> None:
    cfg = base.load_config(str(run_dir_with(tmp_path, {"restart": {"policy": "always"}})))
    assert cfg["grace_s"] == 30 and cfg["log"] == "engine.log" and cfg["env_file"] == "env"
    assert cfg["restart"] == {"policy": "always", "max": 5, "backoff_s": [10, 300], "window_s": 600, "stable_s": 60}
    assert cfg["logs"] == {"max_bytes": 256 << 20, "head_bytes": 1 << 20, "keep": 2}


@pytest.mark.parametrize(("cfg", "needle"), [
    ({"restart": {"policy": "sometimes"}}, "restart.policy"),
    ({"restart": {"backoff_s": [1]}}, "backoff_s"),
    ({"restart": {"max": -1}}, "restart.max"),
    ({"restart": {"max": True}}, "restart.max"),
    ({"restart": {"window_s": 0}}, "window_s"),
    ({"restart": "no"}, "restart must be an object"),
    ({"grace_s": "30"}, "grace_s"),
    ({"ready_pattern": ""}, "ready_pattern"),
    ({"launch": "other.sh"}, "launch script"),
    ([1, 2], "top level"),
])
def test_config_rejects_bad_values(tmp_path: Path, cfg: object, needle: str) -> None:
    with pytest.raises(SuperviseError, match=needle) as err:
        base.load_config(str(run_dir_with(tmp_path, cfg)))
    assert err.value.code == 2


def test_config_not_json(tmp_path: Path) -> None:
    (tmp_path / "supervise.json").write_text("{nope")
    with pytest.raises(SuperviseError, match="not JSON"):
        base.load_config(str(tmp_path))


def test_backoff_doubles_up_to_the_cap() -> None:
    assert [base.backoff_delay([10, 300], n) for n in range(7)] == [10, 20, 40, 80, 160, 300, 300]
    assert base.backoff_delay([0.1, 0.5], 2) == pytest.approx(0.4)
    assert base.backoff_delay([1, 5], 10_000) == 5


@pytest.mark.parametrize(("policy", "expected"), [("no", False), ("on-failure", True), ("always", True)])
def test_restart_policy(policy: str, expected: bool) -> None:
    """An engine that ended after ready without being asked to: restarted by on-failure whatever its code."""
    assert base.should_restart(policy) is expected


def test_signal_names() -> None:
    assert (base.signal_name(9), base.signal_name(15), base.signal_name(None)) == ("SIGKILL", "SIGTERM", None)
    assert base.signal_name(200) == "SIG200"


def test_wait_status_of_real_children() -> None:
    exited = subprocess.Popen(["bash", "-c", "exit 7"])
    killed = subprocess.Popen(["sleep", "30"])
    killed.kill()
    assert base.decode_wait_status(os.waitpid(exited.pid, 0)[1]) == (7, None)
    assert base.decode_wait_status(os.waitpid(killed.pid, 0)[1]) == (None, signal.SIGKILL)


def test_write_json_is_atomic_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_text('{"old": true}')
    base.write_json(str(target), {"status": "ready", "pid": 5})
    assert json.loads(target.read_text()) == {"status": "ready", "pid": 5}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_read_state_missing_and_corrupt(tmp_path: Path) -> None:
    assert base.read_state(str(tmp_path)) is None
    (tmp_path / "state.json").write_text("{")
    with pytest.raises(SuperviseError, match="unreadable"):
        base.read_state(str(tmp_path))


def test_ready_scanner_reads_from_the_offset_and_across_chunk_boundaries(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    old = b"old run: READY-LINE\n"
    log.write_bytes(old)
    scanner = base.LogScanner(str(log), "READY-LINE", len(old))
    assert not scanner.found()
    with log.open("ab") as f:
        f.write(b"loading...\nREADY-")
    assert not scanner.found()
    with log.open("ab") as f:
        f.write(b"LINE\n")
    assert scanner.found()
    assert not base.LogScanner(str(log), None, 0).found()


def test_log_scanner_notes_the_first_traceback_offset_in_bounded_chunks(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    noise = b"x" * (base.LogScanner.CHUNK - 10) + b"\n"
    log.write_bytes(noise + b"Traceback (most recent call last):\n  boom\nTraceback (most recent call last):\n")
    scanner = base.LogScanner(str(log), "READY", 0)
    scanner.scan(budget=base.LogScanner.CHUNK)  # the marker straddles the first chunk's end
    assert scanner.traceback_at is None and scanner.pos == base.LogScanner.CHUNK
    scanner.scan()
    assert scanner.traceback_at == len(noise) and not scanner.ready


def test_liveness_treats_zombies_as_dead() -> None:
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert base.pid_alive(child.pid) and base.group_alive(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5  # unreaped: a zombie, yet kill(pid, 0) still succeeds
        while base.pid_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(child.pid, 0)
        assert not base.pid_alive(child.pid) and not base.group_alive(child.pid)
    finally:
        child.kill()
        child.wait(timeout=5)
    assert not base.pid_alive(None) and not base.group_alive(1) and not base.supervisor_alive(os.getpid() + 10**7)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, str(PROGRAM), *args], capture_output=True, text=True, timeout=20)


@pytest.mark.parametrize("args", [
    (), ("frobnicate", "x"), ("start",), ("status", "/nonexistent/run"), ("stop", "/nonexistent/run"),
    ("stop", ".", "--grace", "soon"), ("ports", "http"), ("ports", "70000"), ("lock", "/tmp/x", "--who"),
    ("status", ".", "--bogus", "1")])
def test_bad_input_is_one_stderr_line_and_exit_2(args: tuple[str, ...]) -> None:
    proc = cli(*args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("supervise: ") and proc.stderr.count("\n") == 1


def test_start_with_bad_config_fails_cleanly(tmp_path: Path) -> None:
    run_dir_with(tmp_path, {"restart": {"policy": "maybe"}})
    proc = cli("start", str(tmp_path))
    assert proc.returncode == 2 and "restart.policy" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "state.json").exists()


def test_status_of_a_never_started_run(tmp_path: Path) -> None:
    proc = cli("status", str(tmp_path))
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {"status": "absent", "alive": False, "supervisor_alive": False}


def test_ports_free_and_busy() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        busy = cli("ports", str(port))
        assert busy.returncode == 1 and busy.stdout.startswith(f"busy {port}")
        assert f"pid {os.getpid()}" in busy.stdout
    free = cli("ports", str(port))
    assert free.returncode == 0 and free.stdout == f"free {port}\n"


def test_source_stays_python38_and_stdlib_only() -> None:
    import ast
    siblings = {"base", "daemon", "ports", "lease", "group", "probe",
                "hang", "replicas", "stacks",
                "protocol"}
    for path in [SUPERVISE] + [SUPERVISE.with_name(f"{name}.py") for name in sorted(siblings)]:
        source = path.read_text()
        tree = ast.parse(source, feature_version=(3, 8))
        assert "from __future__ import annotations" in source  # annotations are never evaluated on 3.8
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        # "deployer" only in the branch taken when imported as part of the package, never on the target
        assert imported <= set(sys.stdlib_module_names) | {"__future__", "deployer"} | siblings, path
        assert not any(isinstance(n, ast.Match) for n in ast.walk(tree))