"""The supervisor payload (deployer/remote/program.py): no module list is kept by hand; each program loads what its
entry modules import, each module after the siblings it imports, and a run dir holds what its supervise.py imports."""

from __future__ import annotations

import ast
import os
import json
from pathlib import Path

import pytest

import deployer.remote.program as program_mod
from deployer.errors import TargetError
from deployer.box.push import SUPERVISOR_FILES
from deployer.remote.local import LocalRemote
from deployer.remote.program import (
    ROOT_ENTRIES,
    RUN_DIR_ENTRIES,
    load_order,
    payload_bundle,
    payload_entries,
    payload_files,
    supervisor_source,
)
from deployer.supervisor.files import named_payload

SUPERVISOR_DIR = Path(program_mod.__file__).parents[1] / "supervisor"


def imported(name: str) -> set[str]:
    """Every supervisor module `name` imports, however written (`from .base import`, `from . import base`, or by
    the package's full name)."""
    package = {p.stem for p in SUPERVISOR_DIR.glob("*.py")} - {"__init__"}
    found: set[str] = set()
    for n in ast.walk(ast.parse(supervisor_source(name))):
        if isinstance(n, ast.ImportFrom):
            found |= {n.module.rsplit(".", 1)[-1]} if n.module else {a.name for a in n.names}
        elif isinstance(n, ast.Import):
            found |= {a.name.rsplit(".", 1)[-1] for a in n.names if "supervisor" in a.name}
    return found & package


@pytest.mark.parametrize("entries", [("supervise",), RUN_DIR_ENTRIES, payload_entries(), ("snapshot",)])
def test_each_program_loads_every_module_it_imports_after_what_that_imports(entries: tuple[str, ...]) -> None:
    order = load_order(entries)
    assert set(entries) <= set(order) and len(order) == len(set(order))
    for i, name in enumerate(order):
        assert imported(name) <= set(order[:i]), (name, order)


def test_the_one_payload_ships_every_module_of_the_package() -> None:
    from deployer.supervisor.protocol import OPS

    shipped = set(load_order(payload_entries()))
    assert {op.module for op in OPS.values() if op.module} | set(ROOT_ENTRIES) <= shipped
    modules = {p.stem for p in SUPERVISOR_DIR.glob("*.py")}
    assert shipped == modules - {"__init__"}
    for name in shipped:
        assert f"({name!r}, ".encode() in payload_bundle()[0]


def test_a_module_imported_only_by_another_is_shipped_and_a_cycle_is_this_deployers_bug(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sources = {"a": "from .b import x\n", "b": "from .c import y\n", "c": "import os\n", "d": "from .e import z\n",
               "e": "from .d import w\n"}
    monkeypatch.setattr(program_mod, "supervisor_source", sources.__getitem__)
    assert program_mod.load_order.__wrapped__(("a",)) == ("c", "b", "a")
    with pytest.raises(ValueError, match="cycle"):
        program_mod.load_order.__wrapped__(("d",))


def test_a_run_dir_and_the_root_hold_entry_files_that_name_the_one_payload_by_its_hash() -> None:
    assert set(SUPERVISOR_FILES) == {"supervise.py", "supervise_guard.py"}
    root = payload_files(ROOT_ENTRIES, in_run_dir=False)
    assert set(root) == {"supervise.py", "supervise_guard.py", "supervise_lease.py"}
    for files in (root, payload_files(RUN_DIR_ENTRIES, in_run_dir=True)):
        for data in files.values():
            assert named_payload(data) == payload_bundle()[1] and len(data) < 2000
            ast.parse(data, feature_version=(3, 8))   # the target's python may be 3.8
    ast.parse(payload_bundle()[0], feature_version=(3, 8))
    assert b"SUPERVISE_JSON" in payload_bundle()[0]


def test_a_bare_connections_helper_runs_this_deployers_own_programs(tmp_path: Path) -> None:
    """remote.helper on a bare connection (remote/oneshot.py): the same typed requests, one program each."""
    local = LocalRemote()
    run_dir = tmp_path / "work" / "demo" / "runs" / "r1"
    local.helper.mkdirs(str(run_dir), str(tmp_path / "work"))
    assert run_dir.is_dir()
    status = local.helper.supervise(["status", str(run_dir)], 30)
    assert status.ok and json.loads(status.stdout) == {"status": "absent", "alive": False, "supervisor_alive": False}
    assert local.helper.supervise(["no-such-command"], 30).exit_code != 0
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)   # another user could write it: refused, nothing written
    with pytest.raises(TargetError, match="unsafe workdir"):
        local.helper.mkdirs(str(tmp_path / "open" / "demo"), str(tmp_path / "open"))
    assert not (tmp_path / "open" / "demo").exists()


def test_the_helper_answers_exactly_the_protocols_ops() -> None:
    import io

    from deployer.supervisor.helper import Helper
    from deployer.supervisor.protocol import HELPER_OPS

    assert set(Helper(io.BytesIO()).ops) == set(HELPER_OPS)


@pytest.mark.parametrize(("name", "usage"), [("supervise.py", "usage: supervise.py start|stop"),
                                             ("supervise_guard.py", "usage: supervise_guard.py arm"),
                                             ("supervise_lease.py", "usage: supervise_lease.py LOCK_PATH")])
def test_each_file_a_deployment_holds_runs_its_own_modules_main(name: str, usage: str) -> None:
    """supervise.py is the program; the entry files beside it run it with the guard's or the lease's main."""
    import subprocess
    import sys

    from payload import payload_program

    done = subprocess.run([sys.executable, "-B", str(payload_program(name))], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode != 0 and usage in done.stdout + done.stderr, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr


# The entry file deployers before the payload was named by its hash wrote: it runs the supervise.py beside it.
OLD_ENTRY_FILE = """import os
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervise.py")
with open(path, "rb") as f:
    code = compile(f.read(), path, "exec")
exec(code, {"__name__": "__main__", "ENTRY": %r})
"""


def test_an_entry_file_an_older_deployer_wrote_still_runs_its_module_in_the_new_program(tmp_path: Path) -> None:
    """A deployment root's supervise_guard.py written by a deployer from before the modules lost their `supervise_`
    prefix names its module `supervise_guard`; beside a newer supervise.py it still runs the guard's main."""
    import subprocess
    import sys

    from payload import payload_program

    root = payload_program("supervise.py").parent
    (tmp_path / "payload").symlink_to(root / "payload")   # the payload that supervise.py names, as a root has it
    (tmp_path / "supervise.py").write_bytes(payload_files(ROOT_ENTRIES, in_run_dir=False)["supervise.py"])
    (tmp_path / "supervise_guard.py").write_text(OLD_ENTRY_FILE % "supervise_guard")
    done = subprocess.run([sys.executable, "-B", str(tmp_path / "supervise_guard.py")], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode != 0 and "usage: supervise_guard.py arm" in done.stdout + done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def _root_with_payload(tmp_path: Path) -> Path:
    """A deployment root as a push leaves it (the payload, the root's and run dir r1's entry files); the payload."""
    from payload import hold_like_a_deployment

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    hold_like_a_deployment(tmp_path, run)
    for name, text in payload_files(ROOT_ENTRIES, in_run_dir=False).items():
        (tmp_path / name).write_bytes(text)
    return tmp_path / "payload" / f"{payload_bundle()[1]}.py"


def _run(script: Path, *args: str) -> tuple[int, str]:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-B", "-S", str(script), *args], capture_output=True, text=True,
                          timeout=30)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("where", ["supervise.py", "runs/r1/supervise.py", "runs/r1/supervise_guard.py"])
def test_an_entry_runs_the_payload_its_hash_names_from_the_root_or_a_run_dir(tmp_path: Path, where: str) -> None:
    _root_with_payload(tmp_path)
    code, said = _run(tmp_path / where)
    usage = "usage: supervise_guard.py arm" if "guard" in where else "usage: supervise.py start|stop"
    assert code == 2 and usage in said and "Traceback" not in said, said
    code, said = _run(tmp_path / "runs" / "r1" / "supervise.py", "status", str(tmp_path / "runs" / "r1"))
    assert code == 0 and json.loads(said)["status"] == "absent", said


@pytest.mark.parametrize("spoil", ["tampered", "missing", "symlink", "others-write", "fifo", "grown"])
def test_an_entry_runs_nothing_from_a_payload_that_is_not_the_one_it_names(tmp_path: Path, spoil: str) -> None:
    """The payload changed (another byte), gone, swapped for a link, writable by another user, swapped for a FIFO
    (not a regular file) or grown past its size (64 MB more; the entry reads no further than the size it names):
    one line, exit non-zero, not one line of it run (a payload that ran would print the supervisor's
    usage)."""
    payload = _root_with_payload(tmp_path)
    if spoil == "tampered":
        payload.write_bytes(payload.read_bytes().replace(b"usage: supervise.py", b"usage: supervise.PY"))
    elif spoil == "missing":
        payload.unlink()
    elif spoil == "symlink":
        real = tmp_path / "elsewhere.py"
        payload.rename(real)
        payload.symlink_to(real)
    elif spoil == "others-write":
        payload.chmod(0o666)
    elif spoil == "fifo":
        payload.unlink()
        os.mkfifo(payload, 0o644)
    else:
        with payload.open("ab") as f:
            f.write(b"\n" * (64 << 20))
    code, said = _run(tmp_path / "runs" / "r1" / "supervise.py")
    assert code == 1 and "usage" not in said and "Traceback" not in said, said
    assert len(said.strip().splitlines()) == 1 and str(payload) in said, said
