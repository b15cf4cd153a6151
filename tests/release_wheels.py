"""What the per-release knowledge tests (tests/sglang_real, tests/vllm_real: test_release_knowledge.py) read of a
release: its wheel (`pip download --no-deps NAME==VERSION`, no GPU, nothing installed), its Python sources as one
text, and the texts in it the engine knowledge relies on: its command-line option names and its messages.

Wheels are kept in RELEASE_WHEELS (a directory, reused across runs) when set, else in the session's own tmp dir;
never under the real HOME.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from deployer.versions import version_in

# "a" "b" across lines (implicit concatenation, f-strings included) read as one literal: "ab"
_JOINED = re.compile(r"""(["'])\s*\n\s*[rbfRBF]{0,2}(["'])""")
_OPTION = re.compile(r"""["'](--[a-z0-9][a-z0-9-]*)["']""")
_FIELD = re.compile(r"^    ([a-z][a-z0-9_]*): [^=\n]+=", re.MULTILINE)   # a dataclass field (ServerArgs)


def fetch_wheel(name: str, version: str, into: Path) -> Path:
    """The release's wheel in `into` (downloaded once)."""
    into.mkdir(parents=True, exist_ok=True)
    stem = name.replace("-", "_")
    found = _wheel_in(into, stem, version)
    if found is None:
        ran = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into),
                              f"{name}=={version}"], capture_output=True, text=True, timeout=900)
        found = _wheel_in(into, stem, version)
        assert found is not None, f"pip download {name}=={version} gave no wheel: {ran.stderr[-600:]}"
    return found


def _wheel_in(folder: Path, stem: str, version: str) -> Path | None:
    return next(iter(sorted(folder.glob(f"{stem}-{version}-*.whl"))), None)


@dataclass
class ReleaseText:
    """One release's Python sources under `package/` (optionally only those under `parts`), as one text."""

    wheel: Path
    package: str

    @cached_property
    def files(self) -> dict[str, str]:
        with zipfile.ZipFile(self.wheel) as z:
            return {n: z.read(n).decode("utf-8", "replace") for n in z.namelist()
                    if n.startswith(f"{self.package}/") and n.endswith(".py") and "/test" not in n}

    @cached_property
    def text(self) -> str:
        """Every source file, implicit string concatenations joined (a message split over lines reads whole)."""
        return "\n".join(_JOINED.sub("", t) for t in self.files.values())

    def options(self, *parts: str) -> set[str]:
        """The option names (`--tp-size`) the files under `parts` spell out, and the fields of their dataclasses
        as options (releases that build their parser from ServerArgs' fields)."""
        found: set[str] = set()
        for name, text in self.files.items():
            if any(name.startswith(f"{self.package}/{p}") for p in parts):
                found |= set(_OPTION.findall(text))
                found |= {"--" + f.replace("_", "-") for f in _FIELD.findall(text)}
        return found

    def has(self, fragment: str) -> bool:
        return fragment in self.text


def literal_fragments(pattern: str, shortest: int = 12) -> list[str]:
    """The literal runs of a signature's regex (escapes undone) at least `shortest` long, longest first: the
    engine's own words the regex needs to find in its log."""
    runs, current, i = [], "", 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt in "dDsSwWbBAZntr" or nxt.isdigit():
                runs.append(current)
                current = ""
            else:
                current += nxt
            i += 2
            continue
        if ch in "()[]{}|*+?^$.":
            if ch in "*+?{" and current:
                current = current[:-1]       # the char before a quantifier is optional or repeated
            runs.append(current)
            current = ""
            if ch == "[":
                i = pattern.find("]", i + 1) + 1 or len(pattern)
                continue
            if ch == "{":
                i = pattern.find("}", i + 1) + 1 or len(pattern)
                continue
        else:
            current += ch
        i += 1
    runs.append(current)
    words = {_EXCEPTION.sub("", r).strip() for r in runs}     # a traceback's `ValueError: ` is not the engine's text
    return sorted({w for w in words if len(w) >= shortest}, key=len, reverse=True)


_EXCEPTION = re.compile(r"^(?:[A-Za-z_.]*(?:Error|Exception|Warning): )+")


def missing_words(text: ReleaseText, version: str, signatures: list[dict[str, Any]], library: dict[str, str],
                  words: dict[str, str]) -> list[str]:
    """The signatures whose `versions` take `version` and whose words (`words`'s spelling of an f-string, else a
    literal run of one of its patterns) the release's source lacks; those in `library` (a library's words) skipped."""
    missing = []
    for sig in signatures:
        if sig["id"] in library or not version_in(version, str(sig.get("versions", "*"))):
            continue
        said = [words[sig["id"]]] if sig["id"] in words else \
            [next(iter(literal_fragments(p)), p) for p in sig["patterns"]]
        if not any(text.has(w) for w in said):
            missing.append(f"{sig['id']} ({said[0]!r})")
    return missing
