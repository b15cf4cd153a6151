"""A failed environment build (pip or uv output) said in one line: what went wrong and what to change, from the
entries of failures.yaml (each with the real text it was written from). Never a traceback: an output no entry
knows is shown as its own last error line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

MAX_GROUP = 160
_ERROR_LINE = re.compile(r"^(?:ERROR|error): (?P<text>.+)$", re.M)
_CAUSE_LINE = re.compile(r"^\s*cause: (?P<text>.+)$", re.M)


@dataclass(frozen=True)
class Failure:
    """One entry of failures.yaml."""

    id: str
    tool: str
    patterns: tuple[re.Pattern[str], ...]
    also: tuple[str, ...]
    summary: str
    hint: str
    source: str

    def applies_to(self, tool: str) -> bool:
        return self.tool in ("any", tool)

    def match(self, text: str) -> dict[str, str] | None:
        """The groups that fill `summary`, or None when this entry does not describe `text`."""
        for pattern in self.patterns:
            found = pattern.search(text)
            if found:
                groups = {k: v for k, v in found.groupdict().items() if v is not None}
                return self._also(text, groups)
        return None

    def _also(self, text: str, groups: dict[str, str]) -> dict[str, str] | None:
        for template in self.also:
            regex = re.sub(r"\{(\w+)\}", lambda m: re.escape(groups.get(m.group(1), m.group(0))), template)
            found = re.search(regex, text, re.S if "(?s)" in template else re.M)
            if not found:
                return None
            groups.update({k: v for k, v in found.groupdict().items() if v is not None})
        return groups


@dataclass(frozen=True)
class InstallDiagnosis:
    """The one line shown for a failed build (`line`), what to change (`hint`), and which entry said it."""

    id: str
    summary: str
    hint: str
    source: str

    @property
    def line(self) -> str:
        return f"{self.summary}: {self.hint}" if self.hint else self.summary


@lru_cache(maxsize=1)
def load_failures() -> tuple[Failure, ...]:
    text = resources.files("deployer.prepare").joinpath("failures.yaml").read_text(encoding="utf-8")
    return tuple(_failure(entry) for entry in yaml.safe_load(text)["failures"])


def _failure(entry: dict[str, Any]) -> Failure:
    return Failure(id=str(entry["id"]), tool=str(entry["tool"]),
                   patterns=tuple(re.compile(p, re.M) for p in entry["patterns"]),
                   also=tuple(entry.get("also") or ()), summary=str(entry["summary"]), hint=str(entry.get("hint", "")),
                   source=str(entry["source"]))


def diagnose_install(output: str, tool: str) -> InstallDiagnosis:
    """What `tool` ("pip" or "uv") printed when a build step failed -> one line."""
    for failure in load_failures():
        if not failure.applies_to(tool):
            continue
        groups = failure.match(output)
        if groups is not None:
            filled = {k: _tidy(k, v) for k, v in groups.items()}
            return InstallDiagnosis(failure.id, failure.summary.format_map(_Missing(filled)),
                                    failure.hint.format_map(_Missing(filled)),
                                    failure.source)
    return InstallDiagnosis("unknown", f"{tool} failed: {_last_error(output)}", "", "the output's own last error line")


class _Missing(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "?"


def _tidy(name: str, value: str) -> str:
    """A group as it fits in one line: its lines joined by `; `, a version list cut to its newest entries."""
    parts = [p.strip() for p in value.splitlines() if p.strip()]
    text = "; ".join(parts)
    if name == "versions":
        items = [v.strip() for v in text.split(",")]
        text = ", ".join(items) if len(items) <= 6 else "..., " + ", ".join(items[-6:])
    return text if len(text) <= MAX_GROUP else text[:MAX_GROUP - 3] + "..."


# pip prints these as `ERROR:` lines before the one that says what failed (the versions it skipped for Python)
_NOT_THE_ERROR = ("Ignored the following versions",)


def _last_error(output: str) -> str:
    """The most specific line of an unknown failure: the last `cause:` (uv) or the first `ERROR:` (pip), else the
    last non-empty line; never the traceback above it."""
    causes = _CAUSE_LINE.findall(output)
    if causes:
        return _tidy("cause", causes[-1])
    errors = [e for e in _ERROR_LINE.findall(output) if e.strip() != "Exception:" and not e.startswith(_NOT_THE_ERROR)]
    if errors:
        return _tidy("error", errors[0])
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return _tidy("line", lines[-1]) if lines else "no output"
