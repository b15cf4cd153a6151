"""The lazy CLI: `deploy --help` lists every command without importing their modules, the one-line helps kept in
deployer.cli.main.COMMANDS are the commands' own, and the on-call reads on a name stay light."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import click
import pytest

from deployer.cli.main import COMMANDS, cli


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_listed_help_is_the_commands_own(name: str) -> None:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None and command.help is not None
    first = " ".join(command.help.split("\n\n")[0].split())
    assert COMMANDS[name][1] == first


def _modules_after(argv: list[str], env: dict[str, str] | None = None) -> set[str]:
    code = ("import sys\nfrom deployer.cli.main import main\ntry:\n    main(%r)\nexcept SystemExit:\n    pass\n"
            "print('\\n'.join(sorted(sys.modules)))" % (argv,))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env).stdout
    return set(out.split())


def test_help_imports_no_command_module() -> None:
    loaded = _modules_after(["--help"])
    assert not {f"deployer.cli.{m}" for m, _ in COMMANDS.values()} & loaded


def test_status_of_a_name_imports_neither_the_pipeline_nor_the_other_kinds() -> None:
    loaded = _modules_after(["status", "demo"])
    assert "deployer.cli.status" in loaded
    assert not {"deployer.runner.up", "deployer.deployments.nodes.deployment", "deployer.deployments.fleet.deployment",
                "deployer.profile.loader"} & loaded


@pytest.mark.parametrize("command", ["status", "down"])
def test_status_and_down_of_an_absent_name_ask_for_a_fleet_without_loading_one(
        command: str, tmp_path: Path) -> None:
    """A NAME that is no deployment on --host may be the fleet whose router runs there (its record): that look
    is one read, and the fleet's modules and the profile model (~0.4 s of each such command's start, measured)
    come only with a record found."""
    env = dict(os.environ, HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"),
               DEPLOYER_HOME=str(tmp_path / "dh"))
    loaded = _modules_after([command, "nosuch", "--host", "local", "--workdir", str(tmp_path / "w")], env)
    assert "deployer.deployments.fleet.record" in loaded   # the record was looked for
    assert not {"deployer.deployments.fleet.deployment", "deployer.deployments.fleet.report"} & loaded
    assert not _pydantic_or_model(loaded)


def _pydantic_or_model(loaded: set[str]) -> set[str]:
    return {m for m in loaded if m.split(".")[0] in ("pydantic", "pydantic_core") or m == "deployer.profile.model"}


def test_status_of_a_name_imports_neither_pydantic_nor_the_profile_model() -> None:
    """Issue 36's bench: pydantic and the profile model were a third of a `deploy status`'s start-up."""
    assert not _pydantic_or_model(_modules_after(["status", "demo"]))


@cache
def _status_modules() -> frozenset[str]:
    return frozenset(_modules_after(["status", "demo"]))


# Modules `status` never uses, each once on its import path (issue 36: ~190 ms of a status's start-up was
# importing on-call modules; the event classes the largest): the progress sinks and every event class
# (deployer.cli.show imports them in `progress`), the log watcher (`logs --follow` imports it), the weights plan
# (its `size_text` lives in deployer.logtext), the fleet's live event lines (its status table is in
# deployer.output.fleet_status), and the start-up timeline (history's text imports it).
NOT_ON_STATUS_PATH = ("deployer.events", "deployer.output.console", "deployer.output.fleet", "deployer.watch.watcher",
                      "deployer.prepare.weights", "deployer.observe.timeline")


@pytest.mark.parametrize("module", NOT_ON_STATUS_PATH)
def test_status_of_a_name_does_not_import(module: str) -> None:
    loaded = _status_modules()
    assert "deployer.operate.deployment" in loaded and "deployer.cli.show" in loaded   # the path was walked
    assert module not in loaded


def test_the_progress_sinks_still_come_with_the_commands_that_send_events() -> None:
    """`progress` imports the sinks when called: a deployment's `up` still gets the live console."""
    code = ("import sys\nfrom deployer.cli import show\n"
            "class D:\n    tagged_events = False\n"
            "print(type(show.progress(D(), False)).__name__, type(show.progress(D(), False, smoke=True)).__name__,"
            " type(show.progress(D(), True)).__name__, type(show.fan_out_progress(False)).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["LiveProgress", "SmokeProgress", "JsonEvents", "FleetProgress"]


def test_reading_an_engines_metric_names_needs_no_pydantic() -> None:
    """`status` and `top` read the metrics map of every live engine they show."""
    code = ("import sys\nfrom deployer.engines import engine_for\nfrom deployer.observe.names import load_metric_names\n"
            "for kind in ('sglang', 'vllm'):\n    load_metric_names(engine_for(kind).knowledge.metrics)\n"
            "print('\\n'.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert not _pydantic_or_model(set(out.stdout.split()))


def test_one_engine_is_imported_for_one_deployments_engine() -> None:
    """`status` of an SGLang deployment reads its record's engine: the SGLang package only, not every engine's."""
    code = ("import sys\nfrom deployer.engines import engine_for\nassert engine_for('sglang').kind == 'sglang'\n"
            "print('\\n'.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = set(out.stdout.split())
    assert "deployer.engines.sglang" in loaded and "deployer.engines.vllm" not in loaded
