"""docs/cli.md's environment-variable table names every variable deployer's code reads (a new one must be documented)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
READS = [
    re.compile(r"""(?:environ\.get|getenv)\(\s*["']([A-Z][A-Z0-9_]+)["']"""),
    re.compile(r"""environ\[\s*["']([A-Z][A-Z0-9_]+)["']\s*\]"""),
    re.compile(r"""^[A-Z_]*ENV\s*=\s*["']([A-Z][A-Z0-9_]+)["']""", re.M),  # SSH_CONFIG_ENV = "DEPLOYER_SSH_CONFIG"
]


def variables_read() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted((REPO / "deployer").rglob("*.py")):
        text = path.read_text()
        for pattern in READS:
            for name in pattern.findall(text):
                found.setdefault(name, str(path.relative_to(REPO)))
    return found


def docs_table() -> set[str]:
    page = (REPO / "docs" / "cli.md").read_text()
    section = page.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`", section, re.M))


def test_every_variable_deployer_reads_is_in_the_docs_table() -> None:
    read = variables_read()
    assert {"DEPLOYER_HOME", "DEPLOYER_SSH_CONFIG", "SSH_AUTH_SOCK"} <= set(read)  # the scan itself works
    missing = {name: where for name, where in read.items() if name not in docs_table()}
    assert not missing, f"document these in docs/cli.md's 'Environment variables': {missing}"
