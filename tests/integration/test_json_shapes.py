"""docs/json.md cannot drift (issue 24): every command's `--json` runs in the test bed (real sshd, stand-in engine)
and its top-level keys (a list: its items' keys; NDJSON: the final report's keys and the event kinds seen) are
the ones the document lists for it. `JSON_SHAPES_PRINT=1` prints what was seen, to write the document from."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, events, write_profile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
DOC = Path(__file__).resolve().parents[2] / "docs" / "json.md"


def documented() -> dict[str, tuple[str, set[str]]]:
    """`<!-- shape: ID TYPE: key key ... -->` lines of docs/json.md: ID -> (TYPE, keys)."""
    out = {}
    for match in re.finditer(r"<!-- shape: (\S+) (\w+): ([^>]*?) -->", DOC.read_text()):
        out[match.group(1)] = (match.group(2), set(match.group(3).split()))
    return out


def shape(stdout: str, ndjson: bool = False) -> list[tuple[str, str, set[str]]]:
    """(suffix, type, keys) of one command's stdout."""
    if ndjson:
        lines = events(stdout)
        return [("", "ndjson", set(lines[-1])), (".events", "kinds", {e["event"] for e in lines[:-1]})]
    data = json.loads(stdout)
    if isinstance(data, list):
        return [("", "list", set().union(*(set(item) for item in data)) if data else set())]
    return [("", "object", set(data))]


def test_every_commands_json_is_the_documented_shape(tmp_path: Path, sshd: Any) -> None:
    home, env = tmp_path / "h", {"DEPLOYER_SSH_CONFIG": str(sshd.ssh_config)}
    prof = write_profile(tmp_path, sshd, name="shapes")
    onhost = ["--host", "deployer-test", "--workdir", str(tmp_path / "work")]
    runs: list[tuple[str, list[str], bool]] = [
        ("validate", ["validate", str(prof), "--json"], False),
        ("render", ["render", str(prof), "--json"], False),
        ("plan", ["plan", str(prof), "--json"], False),
        ("prepare", ["prepare", str(prof), "--json"], True),
        ("up", ["up", str(prof), "--json"], True),
        ("status", ["status", "shapes", *onhost, "--json"], False),
        ("status-host", ["status", *onhost, "--json"], False),
        ("history", ["history", "shapes", *onhost, "--json"], False),
        ("restart", ["restart", "shapes", *onhost, "--json"], True),
        ("prune", ["prune", "shapes", *onhost, "--dry-run", "--json"], False),
        ("down", ["down", "shapes", *onhost, "--json"], False),
        ("smoke", ["smoke", str(prof), "--json"], True),
    ]
    log = tmp_path / "engine.log"
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\ntorch.OutOfMemoryError: CUDA out of "
                   "memory. Tried to allocate 2.00 GiB\n")
    runs.append(("diagnose", ["diagnose", "--log", str(log), "--engine", "sglang", "--json"], False))
    seen: dict[str, tuple[str, set[str]]] = {}
    for ident, argv, ndjson in runs:
        res = deploy(*argv, home=home, env=env, timeout=240)
        assert res.returncode == 0, (argv, res.stderr[-2000:])
        for suffix, kind, keys in shape(res.stdout, ndjson):
            seen[ident + suffix] = (kind, keys)
    failed = deploy("status", "nosuch", *onhost, "--json", home=home, env=env)
    assert failed.returncode == 7
    seen["error"] = ("object", set(json.loads(failed.stdout.splitlines()[-1])))
    if os.environ.get("JSON_SHAPES_PRINT"):
        for ident, (kind, keys) in seen.items():
            sys.stderr.write(f"<!-- shape: {ident} {kind}: {' '.join(sorted(keys))} -->\n")
    doc = documented()
    for ident, (kind, keys) in seen.items():
        assert ident in doc, f"docs/json.md does not document {ident}"
        want_kind, want = doc[ident]
        assert want_kind == kind, (ident, kind)
        if kind == "kinds":  # the event kinds a run shows are some of the documented ones
            assert keys <= want, (ident, sorted(keys - want))
        else:
            assert keys == want, (ident, "undocumented:", sorted(keys - want), "documented, not seen:",
                                  sorted(want - keys))
