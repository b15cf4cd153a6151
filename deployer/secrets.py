"""Secrets: which profile values are secret, and masking them out of everything deployer shows or stores.

What is secret (issue 9):
- an env key when one of its `_`-separated words is TOKEN, KEY, SECRET, PASSWORD, PASSWD or CREDENTIAL(S)
  (`HF_TOKEN`, `AWS_SECRET_ACCESS_KEY`, `API_KEY`; not `MAX_TOTAL_TOKENS`), or when its value came from `${VAR}`;
- a flag when the engine lists it as one (`Launch.secret_flags`: `api_key`, ...) or when its value,
  or one item of it, came from `${VAR}`.

Masking has one entry point, `mask_text` / `mask_data`: the literal secret values this process has seen
(`remember`: loaded profiles, env files read from a target) are replaced by `***` wherever they appear, and the
engine's own dump of its arguments (`api_key='...'`, `--api-key X`) is masked even when the value is unknown.
`MaskingStream` puts the same masking in front of stdout and stderr, so nothing printed can carry a secret.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any, TextIO, TypeVar

from deployer.engines import all_secret_flags

E = TypeVar("E")

MASK = "***"
SECRET_WORDS = frozenset({"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS"})
# Shorter values are still kept out of launch.sh and records, but not hunted for in free text, where masking
# every "1" would make the text unreadable; real credentials are far longer.
MIN_HUNTED_LEN = 4
SECRET_ENV_PREFIX = "DEPLOYER_SECRET_"


def is_secret_env_name(name: str) -> bool:
    """`HF_TOKEN`, `AWS_SECRET_ACCESS_KEY`, `API_KEY`: a secret word among the `_`-separated words of the name."""
    return any(word in SECRET_WORDS for word in name.upper().split("_"))


def secret_var(flag: str, index: int | None = None) -> str:
    """The env file variable that carries a secret flag's value (or one item of a list flag)."""
    base = SECRET_ENV_PREFIX + flag.upper()
    return base if index is None else f"{base}_{index}"


class _Known:
    """The secret values seen by this process, as one compiled pattern (rebuilt only when the set changes)."""

    def __init__(self) -> None:
        self.values: set[str] = set()
        self.pattern: re.Pattern[str] | None = None
        self.lock = threading.Lock()

    def add(self, values: Iterable[str]) -> None:
        fresh = {v for v in values if isinstance(v, str) and len(v) >= MIN_HUNTED_LEN} - self.values
        if not fresh:
            return
        with self.lock:
            self.values |= fresh
            ordered = sorted(self.values, key=len, reverse=True)  # a longer value first: no partial leftovers
            self.pattern = re.compile("|".join(re.escape(v) for v in ordered))


_KNOWN = _Known()


def remember(values: Iterable[str]) -> None:
    """Secret values to mask from now on in everything this process prints or stores."""
    _KNOWN.add(values)


def _engine_flag_pattern() -> re.Pattern[str]:
    names = sorted(all_secret_flags(), key=len, reverse=True)
    dashed = "|".join(re.escape("--" + n.replace("_", "-")) for n in names)
    snake = "|".join(re.escape(n) for n in names)
    # server_args={'api_key': 'x'} / ServerArgs(api_key='x') / --api-key x / --api-key=x ; None and our own
    # "$DEPLOYER_SECRET_..." references stay visible.
    return re.compile(
        rf"""(?P<k1>\b(?:{snake})['"]?\s*[:=]\s*)(?P<v1>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
        rf"""|(?P<k2>(?<![\w-])(?:{dashed})(?:=|\s+))(?P<v2>(?!["']?\$|None\b)(?:'[^']*'|"[^"]*"|[^\s,)'"]+))""")


_FLAG_RE: re.Pattern[str] | None = None


def _flag_re() -> re.Pattern[str]:
    global _FLAG_RE
    if _FLAG_RE is None:
        _FLAG_RE = _engine_flag_pattern()
    return _FLAG_RE


def _mask_flag(match: re.Match[str]) -> str:
    if match.group("k1") is not None:
        quote = match.group("v1")[0]
        return f"{match.group('k1')}{quote}{MASK}{quote}"
    return f"{match.group('k2')}{MASK}"


def mask_text(text: str) -> str:
    """The text with every known secret value, and the values of the engine's secret flags, replaced by ***."""
    if not text:
        return text
    pattern = _KNOWN.pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    return _flag_re().sub(_mask_flag, text)


def mask_data(value: Any) -> Any:
    """JSON-like data with `mask_text` applied to every string in it (keys included)."""
    return map_strings(value, mask_text)


def map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """JSON-like data with `fn` applied to every string in it (keys included); tuples become lists."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {fn(k) if isinstance(k, str) else k: map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [map_strings(v, fn) for v in value]
    return value


def mask_leaves(value: Any, paths: frozenset[str], at: str) -> Any:
    """`value` with the leaves at `paths` (dotted, relative) replaced by ***."""
    if at and at in paths:
        return MASK
    if isinstance(value, dict):
        return {k: mask_leaves(v, paths, f"{at}.{k}" if at else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_leaves(v, paths, f"{at}.{i}" if at else str(i)) for i, v in enumerate(value)]
    return value


def hidden_values(value: Any, masked: Any, out: list[str]) -> None:
    """The literal values that `masked` hides (where it says *** and `value` does not)."""
    if masked == MASK and value != MASK:
        out.append(value if isinstance(value, str) else json.dumps(value, sort_keys=True) if
                   isinstance(value, (dict, list)) else str(value))
        if isinstance(value, (dict, list)):  # its leaves show up on their own in the engine's args dump
            leaves = value.values() if isinstance(value, dict) else value
            for leaf in leaves:
                hidden_values(leaf, MASK, out)
    elif isinstance(value, dict) and isinstance(masked, dict):
        for key, item in value.items():
            hidden_values(item, masked.get(key), out)
    elif isinstance(value, list) and isinstance(masked, list):
        for item, hidden in zip(value, masked):
            hidden_values(item, hidden, out)


def masking_sink(emit: Callable[[E], None]) -> Callable[[E], None]:
    """An event sink that masks every text an event (a dataclass) carries before passing it on."""
    def sink(event: E) -> None:
        emit(masked_fields(event))

    return sink


def masked_fields(value: E) -> E:
    """A dataclass with `mask_data` applied to its fields' texts, nested dataclasses included."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        return value
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(value):
        if not f.init:
            continue
        item = getattr(value, f.name)
        masked = masked_fields(item) if dataclasses.is_dataclass(item) else \
            mask_data(item) if isinstance(item, (str, dict, list, tuple)) else item
        if masked != item:
            changes[f.name] = masked
    return dataclasses.replace(value, **changes) if changes else value  # type: ignore[type-var]


class MaskingStream:
    """A text stream that masks what is written to it, then passes it on (stdout and stderr of the CLI)."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(mask_text(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return self._inner.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def guard_std_streams() -> None:
    """Mask everything the process writes to stdout and stderr through Python (idempotent)."""
    if not isinstance(sys.stdout, MaskingStream):
        sys.stdout = MaskingStream(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, MaskingStream):
        sys.stderr = MaskingStream(sys.stderr)  # type: ignore[assignment]
