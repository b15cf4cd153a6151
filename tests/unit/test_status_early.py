"""`deploy status` of a remembered profile file connects, and sends its helper's exec, before it imports the modules
that make and show its report (deployer/cli/status.py; deployer/remote/connect.py `started_early`): the target's
login shell starts while they import (issue 36's bench). How fast is the bench's business; this pins the order,
that the connection started early is the one the status uses (one connect), and that nothing else changes: the
same errors, at the same point, and an early connection nobody took is closed."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_pipeline_fake import OPTS, PORT, WORKDIR, profile  # noqa: E402

import deployer.remote.connect as connect_mod  # noqa: E402
from deployer.cli.main import main  # noqa: E402
from deployer.errors import ConnectFailed  # noqa: E402
from deployer.local import remembered  # noqa: E402
from deployer.operate.deployment import make_ref  # noqa: E402
from deployer.host import TargetSpec  # noqa: E402
from deployer.remote.fake import FakeRemote  # noqa: E402
from deployer.runner.up import up  # noqa: E402

# what makes and shows a status report: each imported only after the connection started
REPORT_MODULES = ("deployer.cli.show", "deployer.output.text", "deployer.deployments.resolve",
                  "deployer.operate.deployment")
# nor are these on the way to the connection (the status imports them later, or never): YAML (deployer.local.settings
# parses a config file only when there is one), http.client (deployer/remote/http.py), tempfile (a local put)
NOT_BEFORE_THE_CONNECTION = (*REPORT_MODULES, "yaml", "http.client", "tempfile")


@pytest.fixture()
def remembered_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A profile file an earlier command loaded (its pointer remembered): the fake pipeline's deployment's."""
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path / "home"))
    for name in ("DEPLOYER_HOST", "DEPLOYER_WORKDIR", "DEPLOYER_ENGINE_PYTHON", "DEPLOYER_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "demo.yaml"
    path.write_text(f"name: demo\ntarget:\n  host: gpu-box\n  workdir: {WORKDIR}\nengine:\n  kind: sglang\n"
                    f"  python: /usr/bin/python3\n  model_path: /models/tiny\n  port: {PORT}\n")
    make_ref(str(path), None, None, read_only=True)   # what a status or an `up` of it did before
    assert remembered.lookup(str(path), (), None) is not None
    return path


def _status_in_a_fresh_python(path: Path) -> subprocess.CompletedProcess[str]:
    """`deploy status PATH` in a new interpreter whose connect is a stand-in that says which of
    NOT_BEFORE_THE_CONNECTION were already imported when it was called, and then fails as an unreachable host
    does."""
    code = f"""
import sys
import deployer.remote.connect as connect_mod
from deployer.errors import ConnectFailed
def stand_in_connect(spec):
    print("LOADED " + json.dumps([m for m in {NOT_BEFORE_THE_CONNECTION!r} if m in sys.modules]), flush=True)
    raise ConnectFailed("stand-in connect: no route to " + spec.host, host=spec.host)
import json
connect_mod.connect = stand_in_connect
from deployer.cli.main import main
main(["status", {str(path)!r}])
"""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ))


def test_status_connects_before_it_imports_the_report_modules(remembered_file: Path) -> None:
    proc = _status_in_a_fresh_python(remembered_file)
    loaded = [json.loads(line[len("LOADED "):]) for line in proc.stdout.splitlines() if line.startswith("LOADED ")]
    assert loaded == [[]], proc.stdout + proc.stderr   # one connect, before any of them
    # the early connect's failure is the status's, as before: exit 3, one line, no traceback
    assert proc.returncode == 3
    assert proc.stderr == "error: gpu-box: stand-in connect: no route to gpu-box\n"


def test_without_a_remembered_profile_the_status_connects_where_it_did(tmp_path: Path,
                                                                      remembered_file: Path) -> None:
    """A profile file not remembered (changed since): no early start; the profile is loaded, then the connect."""
    remembered_file.write_text("not: [the remembered content\n")
    proc = _status_in_a_fresh_python(remembered_file)
    assert "LOADED" not in proc.stdout   # the load failed first, as it did before
    assert proc.returncode == 2, proc.stderr


def _count_connects(monkeypatch: pytest.MonkeyPatch, fake: FakeRemote) -> list[TargetSpec]:
    made: list[TargetSpec] = []

    def stand_in(spec: TargetSpec) -> FakeRemote:
        made.append(spec)
        return fake

    monkeypatch.setattr(connect_mod, "connect", stand_in)
    return made


def test_the_status_uses_the_connection_started_early(remembered_file: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeRemote()
    report = up(profile(), OPTS, lambda _e: None, connection=fake).to_json()
    made, spawned = _count_connects(monkeypatch, fake), fake.spawned
    with pytest.raises(SystemExit) as exit_:
        main(["status", str(remembered_file), "--json"])
    assert exit_.value.code == 0
    row: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert (row["name"], row["status"], row["run_dir"]) == ("demo", "ready", report["run_dir"])
    assert made == [TargetSpec("gpu-box")] and fake.spawned == spawned + 1   # one connection, one helper


SPEC = TargetSpec("gpu-box")


def test_an_early_connection_nobody_takes_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRemote()
    closed: list[str] = []
    monkeypatch.setattr(fake, "close", lambda: closed.append("transport"))
    made = _count_connects(monkeypatch, fake)
    with connect_mod.started_early(SPEC):
        assert made == [SPEC] and fake.spawned == 1 and not closed   # started at once, still open
    assert closed == ["transport"]
    with connect_mod.started_early(SPEC):
        with connect_mod.conversing(TargetSpec("other-box")):   # another target's: a connection of its own
            pass
    assert made == [SPEC, SPEC, TargetSpec("other-box")]


def test_a_failed_early_connect_is_raised_where_the_connection_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(spec: TargetSpec) -> FakeRemote:
        raise ConnectFailed("stand-in connect: unreachable", host=spec.host)

    monkeypatch.setattr(connect_mod, "connect", unreachable)
    with connect_mod.started_early(SPEC):   # not here: a status that fails before it connects fails as it did
        with pytest.raises(ConnectFailed, match="stand-in connect: unreachable"):
            with connect_mod.conversing(SPEC):
                pass
    with connect_mod.started_early(SPEC):
        pass   # never asked for: nothing raised


def test_what_a_remembered_pointer_does_not_say_starts_nothing_early(remembered_file: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """--host names another box (the pointer remembered is the file's own), --node a node of a group: the status
    resolves them as before, and connects to nothing it was not asked for."""
    fake = FakeRemote()
    up(profile(), OPTS, lambda _e: None, connection=fake)
    made = _count_connects(monkeypatch, fake)
    with pytest.raises(SystemExit) as exit_:
        main(["status", str(remembered_file), "--node", "0"])
    assert exit_.value.code == 2 and made == []   # refused before any connection, as before
    with pytest.raises(SystemExit) as exit_:
        main(["status", str(remembered_file), "--host", "other-box"])
    assert exit_.value.code == 0 and made == [TargetSpec("other-box")]


def test_who_listens_on_the_port_is_asked_beside_the_health_check(remembered_file: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A serving row asks /health and who holds the engine's port (a squatter answers /health too): the two
    requests go out together, one round trip, not the second after the first's answer. The stand-in look waits
    (bounded) for the listener question: asked only after the look returned, it never comes in time."""
    from deployer.operate import deployment as ops
    from deployer.operate import serving
    from deployer.box.process import Listener

    fake = FakeRemote()
    up(profile(), OPTS, lambda _e: None, connection=fake)
    asked = threading.Event()
    real_look = serving.look

    def stand_in_listener(remote: Any, run: Any, port: int) -> Listener:
        asked.set()
        return Listener(True, [])

    def waiting_look(*args: Any, **kw: Any) -> serving.Looked:
        assert asked.wait(10), "the listener was not asked while /health was"
        return real_look(*args, **kw)

    monkeypatch.setattr(ops, "listener", stand_in_listener)
    monkeypatch.setattr(serving, "look", waiting_look)
    (row,) = ops.status(ops.Ref("demo", TargetSpec("gpu-box"), WORKDIR), fake)
    assert row.status == "ready" and row.healthy and row.unhealthy is None
