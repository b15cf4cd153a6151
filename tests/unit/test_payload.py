"""The supervisor payload (deployer/remote/program.py): no module list is kept by hand; each program loads what its
entry modules import, each module after the siblings it imports, and a run dir holds what its supervise.py imports."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import deployer.remote.program as program_mod
from deployer.errors import TargetError
from deployer.box.push import SUPERVISOR_FILES
from deployer.remote.local import LocalRemote
from deployer.remote.program import (
    ROOT_ENTRIES,
    helper_bundle,
    helper_entries,
    load_order,
    payload_files,
    run_dir_entries,
    supervisor_source,
)

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


@pytest.mark.parametrize("entries", [("supervise",), run_dir_entries(), helper_entries(), ("snapshot",)])
def test_each_program_loads_every_module_it_imports_after_what_that_imports(entries: tuple[str, ...]) -> None:
    order = load_order(entries)
    assert set(entries) <= set(order) and len(order) == len(set(order))
    for i, name in enumerate(order):
        assert imported(name) <= set(order[:i]), (name, order)


def test_the_helper_ships_every_module_of_the_package_its_table_of_operations_names() -> None:
    from deployer.supervisor.protocol import OPS

    shipped = set(load_order(helper_entries()))
    assert {op.module for op in OPS.values() if op.module} <= shipped
    modules = {p.stem for p in SUPERVISOR_DIR.glob("*.py")}
    assert shipped == modules - {"guard", "__init__"}   # the guard runs from a deployment's own files only
    for name in shipped:
        assert f"({name!r}, ".encode() in helper_bundle()[0]


def test_a_module_imported_only_by_another_is_shipped_and_a_cycle_is_this_deployers_bug(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sources = {"a": "from .b import x\n", "b": "from .c import y\n", "c": "import os\n", "d": "from .e import z\n",
               "e": "from .d import w\n"}
    monkeypatch.setattr(program_mod, "supervisor_source", sources.__getitem__)
    assert program_mod.load_order.__wrapped__(("a",)) == ("c", "b", "a")
    with pytest.raises(ValueError, match="cycle"):
        program_mod.load_order.__wrapped__(("d",))


def test_a_run_dir_holds_the_supervisor_and_the_helper_ships_the_protocol() -> None:
    assert set(SUPERVISOR_FILES) == {"supervise.py", "supervise_guard.py"}
    assert {"protocol", "guard", "lease"} <= set(load_order(run_dir_entries()))
    assert set(payload_files(ROOT_ENTRIES)) == {"supervise.py", "supervise_guard.py", "supervise_lease.py"}
    assert b"SUPERVISE_JSON" in helper_bundle()[0]


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


def test_an_entry_file_an_older_deployer_wrote_still_runs_its_module_in_the_new_program(tmp_path: Path) -> None:
    """A deployment root's supervise_guard.py written by a deployer from before the modules lost their `supervise_`
    prefix names its module `supervise_guard`; beside a newer supervise.py it still runs the guard's main."""
    import subprocess
    import sys

    from deployer.remote.program import ENTRY_FILE

    (tmp_path / "supervise.py").write_bytes(payload_files(ROOT_ENTRIES)["supervise.py"])
    (tmp_path / "supervise_guard.py").write_text(ENTRY_FILE % "supervise_guard")
    done = subprocess.run([sys.executable, "-B", str(tmp_path / "supervise_guard.py")], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode != 0 and "usage: supervise_guard.py arm" in done.stdout + done.stderr, done.stderr
    assert "Traceback" not in done.stderr
