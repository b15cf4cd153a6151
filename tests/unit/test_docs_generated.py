"""The docs site cannot drift from the code (issue 36): the generated reference pages (docs/reference/, written by
scripts/gen_docs.py from the Profile model's JSON Schema and the click commands) equal what the code generates now,
document every profile key and every option, and the site builds with `mkdocs build --strict` (a broken link, a
missing anchor or a page left out of the nav fails it)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import pytest

from deployer.cli.main import cli
from deployer.profile.model import Profile

REPO = Path(__file__).resolve().parents[2]
PAGES = ("profile.md", "cli.md")
REGENERATE = "the docs' reference pages differ from the code: run python scripts/gen_docs.py and commit docs/reference/"


def gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_reference_pages_equal_what_the_code_generates(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEPLOYER_")} | {"COLUMNS": "200"}
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_docs.py"), "--out", str(tmp_path)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    for name in PAGES:
        committed = (REPO / "docs" / "reference" / name).read_text()
        assert (tmp_path / name).read_text() == committed, f"docs/reference/{name}: {REGENERATE}"


def schema_keys(schema: dict[str, Any]) -> set[str]:
    """Every key path of the profile schema (`engine.install.packages`, `replicas[].host`), walked here on its own."""
    defs = schema["$defs"]
    keys: set[str] = set()

    def walk(obj: dict[str, Any], prefix: str) -> None:
        for key, node in obj.get("properties", {}).items():
            path = f"{prefix}{key}"
            keys.add(path)
            for part in [node, *node.get("anyOf", [])]:
                ref = part.get("$ref") or part.get("items", {}).get("$ref")
                if ref:
                    walk(defs[ref.rsplit("/", 1)[1]], f"{path}{'[]' if 'items' in part else ''}.")

    walk(schema, "")
    return keys


def test_the_profile_reference_names_every_key() -> None:
    keys = schema_keys(Profile.model_json_schema())
    assert {"name", "engine.install.packages", "replicas[].listen", "router.target.host"} <= keys  # the walk works
    page = (REPO / "docs" / "reference" / "profile.md").read_text()
    shown = {k for k in keys if f"| `{k}` |" in page}
    # a model used twice (engine.install, router.install) is tabled once, under its first path
    missing = sorted(k for k in keys - shown if not k.startswith("router.install."))
    assert missing == [], f"docs/reference/profile.md lacks {missing}: {REGENERATE}"


def test_the_cli_reference_names_every_command_and_option() -> None:
    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        assert command is not None
        subs = [(f"{name} {s}", c) for s, c in getattr(command, "commands", {}).items()]
        for path, cmd in [(name, command), *subs]:
            assert f"## deploy {path}\n" in page, f"deploy {path} is not in docs/reference/cli.md: {REGENERATE}"
            section = page.split(f"## deploy {path}\n", 1)[1].split("\n## ", 1)[0]
            for param in cmd.params:
                if isinstance(param, click.Option):
                    assert f"`{param.opts[0]}`" in section, f"deploy {path} {param.opts[0]}: {REGENERATE}"


def test_a_profile_key_without_a_description_is_refused() -> None:
    module = gen_docs()
    schema = {"properties": {"name": {"type": "string", "description": "the name"},
                             "mystery": {"type": "integer", "default": 3}}, "$defs": {}}
    with pytest.raises(module.Undocumented, match="profile key mystery has no description"):
        module.ProfileReference(schema).render()


def test_the_site_builds_strict(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    assert mkdocs.exists(), "no mkdocs beside this python: mkdocs-material is a test dependency (make install)"
    run = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                         env=os.environ | {"NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
