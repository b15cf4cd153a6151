"""The supervisor payload's one module list (deployer/remote/program.py): every program built from it loads each
module after the siblings it imports, and a run dir holds what its supervise.py imports."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from deployer.errors import TargetError
from deployer.target.push import SUPERVISOR_FILES
from deployer.remote.local import LocalRemote
from deployer.remote.program import (
    HELPER_MODULES, ROOT_ENTRIES, RUN_DIR_MODULES, SUPERVISOR_MODULES,
    helper_bundle,
    payload_files,
    supervisor_source,
)


def siblings(name: str) -> set[str]:
    """The supervisor modules `name` imports (relatively: `from .supervise_base import ...`)."""
    tree = ast.parse(supervisor_source(name))
    found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    found |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return {m for m in found if m.startswith("supervise")}


@pytest.mark.parametrize("modules", [SUPERVISOR_MODULES, RUN_DIR_MODULES, HELPER_MODULES])
def test_each_module_comes_after_what_it_imports(modules: tuple[str, ...]) -> None:
    for i, name in enumerate(modules):
        assert siblings(name) <= set(modules[:i]), (name, modules)


def test_the_helper_ships_every_module_its_table_of_operations_names() -> None:
    from deployer.supervisor.supervise_protocol import OPS

    assert {op.module for op in OPS.values() if op.module} <= set(HELPER_MODULES)


def test_a_run_dir_holds_the_supervisor_and_the_helper_ships_the_protocol() -> None:
    assert set(SUPERVISOR_FILES) == {"supervise.py", "supervise_guard.py"}
    assert set(RUN_DIR_MODULES) >= set(SUPERVISOR_MODULES) and "supervise_protocol" in SUPERVISOR_MODULES
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

    from deployer.supervisor.supervise_helper import Helper
    from deployer.supervisor.supervise_protocol import HELPER_OPS

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
