"""Effective-args drift: what the profile asked for vs what the engine says it resolved.

An engine logs its arguments once at startup (its LogFormat.args_dump line), as a dict repr `{...}` or a
call repr `Name(model_path='...', ...)`. `parse_args_dump` reads either;
`compare` reports every flag the profile set that the engine resolved differently or does not know. Pure.
"""

from __future__ import annotations

import ast
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from deployer.flag_names import option_key

_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", "none", ""}
_UNPARSED = object()


@dataclass(frozen=True)
class Drift:
    """One flag whose effective value differs from the profile's (`kind` "changed"), or unknown to the engine."""

    flag: str
    asked: Any
    resolved: Any = None
    kind: str = "changed"      # "changed" | "unknown"

    def describe(self) -> str:
        if self.kind == "unknown":
            return f"asked {self.flag}={_show(self.asked)}, but the engine does not report {self.flag} (unknown to the engine)"
        return f"asked {self.flag}={_show(self.asked)}, engine resolved {_show(self.resolved)}"

    def to_json(self) -> dict[str, Any]:
        return {"flag": self.flag, "asked": self.asked, "resolved": self.resolved, "kind": self.kind}


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "None"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    return str(value)


def parse_args_dump(log_text: str, marker: re.Pattern[str] | None) -> dict[str, Any] | None:
    """The first args dump of a log as a dict, or None when there is none (or it is cut off).

    `marker`: the engine's dump line (LogFormat.args_dump, group 1 = where the dict or call starts); None: the
    engine prints no dump.
    """
    found = marker.search(log_text) if marker is not None else None
    if found is None:
        return None
    end = log_text.find("\n", found.start(1))
    text = _ANSI_RE.sub("", log_text[found.start(1): end if end >= 0 else len(log_text)]).rstrip()
    if text.startswith("{"):
        return _parse_dict(text)
    opening = text.find("(")
    if opening < 0 or not text.endswith(")"):
        return None
    return _parse_call(text[opening + 1:-1])


def masked(dump: dict[str, Any], secret: set[str] | frozenset[str]) -> dict[str, Any]:
    """The dump with the values of secret flags replaced by *** (some engine releases printed api_key in clear)."""
    return {k: ("***" if k in secret and v is not None else v) for k, v in dump.items()}


def _parse_dict(text: str) -> dict[str, Any] | None:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        value = None
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    if not text.endswith("}"):
        return None
    out: dict[str, Any] = {}
    for item in _split_top(text[1:-1], ","):
        key, sep, raw = _partition_top(item, ":")
        if sep:
            name = _literal(key)
            out[str(name if name is not _UNPARSED else key.strip().strip("'\""))] = _value(raw)
    return out


def _parse_call(body: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in _split_top(body, ","):
        key, sep, raw = _partition_top(item, "=")
        if sep and key.strip().isidentifier():
            out[key.strip()] = _value(raw)
    return out


def _value(raw: str) -> Any:
    """A Python repr as a value; reprs that are not literals (enums, objects) stay text."""
    value = _literal(raw)
    return raw.strip() if value is _UNPARSED else value


def _literal(raw: str) -> Any:
    try:
        return ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return _UNPARSED


def _split_top(text: str, sep: str) -> list[str]:
    """Split at `sep` outside brackets and quotes (reprs nest lists, dicts, strings with commas)."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == sep and depth <= 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _partition_top(text: str, sep: str) -> tuple[str, str, str]:
    pieces = _split_top(text, sep)
    if len(pieces) < 2:
        return text, "", ""
    first = pieces[0]
    at = text.index(first) + len(first)
    return first, sep, text[at + 1:]


def compare(asked: dict[str, Any], resolved: dict[str, Any],
            aliases: dict[str, dict[str, str]] | None = None, *, complete: bool = True) -> list[Drift]:
    """Drifts for the flags the profile set (snake_case keys of engine.args); None/false-free flags skipped.

    `aliases`: per flag, values the engine rewrites to an equivalent name (Knowledge.value_aliases); not drift.
    `complete`: the dump lists every flag; when False (a dump of the non-default args only) a missing flag kept its default.
    """
    drifts = []
    for raw_name, value in asked.items():
        name = option_key(raw_name)
        if value is None:
            continue
        value = (aliases or {}).get(name, {}).get(str(value), value)
        if name not in resolved:
            if complete:
                drifts.append(Drift(name, value, None, "unknown"))
        elif not same_value(value, resolved[name]):
            drifts.append(Drift(name, value, resolved[name]))
    return drifts


def same_value(asked: Any, resolved: Any) -> bool:
    """Equal after normalising the ways a profile and an args dump write the same value."""
    if isinstance(resolved, bool) or resolved is None:
        flag = _as_bool(asked)
        return flag is not None and flag == bool(resolved) if resolved is not None else flag is False
    if isinstance(resolved, (int, float)):
        number = _as_number(asked)
        return number is not None and math.isclose(number, float(resolved), rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(resolved, (list, tuple)):
        items = _as_list(asked)
        return len(items) == len(resolved) and all(same_value(a, r) for a, r in zip(items, resolved))
    if isinstance(resolved, dict):
        return bool(_as_dict(asked) == resolved)
    return str(_show(asked)) == str(resolved)


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, (int, float)):
        return bool(value) if value in (0, 1) else None
    text = str(value).strip().lower()
    return True if text in _TRUE else False if text in _FALSE else None


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        return [p for p in re.split(r"[\s,]+", value.strip()) if p]
    return [value]


def _as_dict(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
