"""Probe run by the TARGET's engine python: what the installed SGLang accepts and how it resolves args.

Stdlib and the engine's own modules only; Python >= 3.8. Prints exactly one line
`DEPLOYER_PROBE_JSON {...}` on stdout (SGLang may log to stdout too, so callers look for the marker).

    python probe.py [--flags] [--resolve ARGV...]

--flags    the sglang version, every argparse option of `ServerArgs.add_cli_args` (option strings, dest,
           nargs, choices, whether it takes a value, whether it is deprecated) and the SGLANG_*/SGL_*
           environment names that appear anywhere in the installed package's source.
--resolve  the rest of the command line is the engine argv (without python -m ...): build the args with
           `prepare_server_args`, run `resolve_once()` and report each value the engine changed.
           Releases without `resolve_once` (0.5.1x and older) resolve everything inside
           `prepare_server_args` (`ServerArgs.__post_init__`): that IS their dry resolution, compared
           against the plain argparse values. Needs no weights (config.json is enough); where this SGLang
           cannot, says why.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, Set

MARKER = "DEPLOYER_PROBE_JSON "
PROBE_SCHEMA = 1
ENV_NAME = re.compile(rb"\bSGL(?:ANG)?_[A-Z0-9_]+")
# The distributions (package metadata names) that may install SGLang, tried in order. The one place they are
# listed: the Engine reads them from here (deployer.engines.sglang.spec), this script runs on the target by itself.
DISTRIBUTIONS = ("sglang",)


def sglang_version() -> Optional[str]:
    try:
        from importlib import metadata

        for name in DISTRIBUTIONS:
            try:
                return str(metadata.version(name))
            except metadata.PackageNotFoundError:
                pass
        raise LookupError("no sglang distribution")
    except Exception:
        import sglang

        version = getattr(sglang, "__version__", None)
        return None if version is None else str(version)


def _plain(value: Any) -> Any:
    """JSON-safe copy of an argparse value (choices may be enums, sets, dict keys)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    return str(getattr(value, "value", value))


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(
        action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)
    )


def flag_set() -> List[Dict[str, Any]]:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    flags = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        flags.append(
            {
                "options": list(action.option_strings),
                "dest": action.dest,
                "nargs": _plain(action.nargs),
                "choices": None if action.choices is None else sorted(str(c) for c in _plain(list(action.choices))),
                "takes_value": _takes_value(action),
                "deprecated": "Deprecated" in type(action).__name__,
            }
        )
    return flags


def env_names() -> List[str]:
    """Every SGLANG_*/SGL_* name in the package source: a name not in here is never read."""
    import sglang

    root = os.path.dirname(sglang.__file__)
    names: Set[str] = set()
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(dirpath, name), "rb") as f:
                    names.update(m.decode() for m in ENV_NAME.findall(f.read()))
    return sorted(names)


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def resolve(argv: List[str]) -> Dict[str, Any]:
    """Dry resolution: every field whose resolved value differs from what the argv said."""
    try:
        from sglang.srt import server_args as sa
    except Exception as exc:
        return {"ok": False, "supported": False, "error": "cannot import sglang.srt.server_args: %s" % exc}
    if not hasattr(sa, "prepare_server_args"):
        return {"ok": False, "supported": False, "error": "this SGLang has no prepare_server_args"}
    try:  # older versions already run their model-specific checks here (ServerArgs.__post_init__)
        args = sa.prepare_server_args(list(argv))
    except SystemExit as exc:
        return {"ok": False, "supported": True, "stage": "parse", "error": "argparse exit %s" % exc.code}
    except ImportError as exc:
        return {"ok": False, "supported": False, "error": "parsing needs a module that is missing: %s" % exc}
    except BaseException as exc:
        lines = traceback.format_exception_only(type(exc), exc)
        return {"ok": False, "supported": True, "stage": "prepare", "error": "".join(lines).strip()}
    if not hasattr(args, "resolve_once"):
        try:
            return _post_init_changes(sa, args, argv)
        except Exception as exc:
            return {"ok": False, "supported": False, "error": "cannot read this SGLang's resolution: %r" % exc}
    try:
        args.resolve_once()
    except ImportError as exc:  # this install cannot resolve (a missing optional module), not a bad argv
        return {"ok": False, "supported": False, "error": "resolution needs a module that is missing: %s" % exc}
    except BaseException as exc:  # a failing resolution is the answer, not a crash of the probe
        lines = traceback.format_exception_only(type(exc), exc)
        return {"ok": False, "supported": True, "stage": "resolve", "error": "".join(lines).strip()}
    try:
        return _changes(args)
    except Exception as exc:  # an SGLang whose records look different: say so, do not guess
        return {"ok": False, "supported": False, "error": "cannot read this SGLang's resolution: %r" % exc}


def _changes(args: Any) -> Dict[str, Any]:
    raw = dict(getattr(args, "_raw_input", None) or {})
    resolved = args.resolved_dict()
    sources: Dict[str, str] = {}  # field -> the resolution step that declared its value last
    for entry in getattr(args, "_resolved_overrides", None) or ():
        if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], dict):
            for name in entry[1]:
                sources[name] = str(entry[0])
    changed = []
    for name in sorted(sources):
        before, after = _jsonable(raw.get(name)), _jsonable(resolved.get(name))
        if before != after:
            changed.append({"name": name, "from": before, "to": after, "source": sources[name]})
    return {
        "ok": True,
        "supported": True,
        "changed": changed,
        "resolved": {k: _jsonable(v) for k, v in resolved.items()},
    }


def _post_init_changes(sa: Any, args: Any, argv: List[str]) -> Dict[str, Any]:
    """An older release: `prepare_server_args` already resolved; compare with what argparse alone gives."""
    import dataclasses

    parser = argparse.ArgumentParser()
    sa.ServerArgs.add_cli_args(parser)
    raw = vars(parser.parse_args(list(argv)))
    names = [f.name for f in dataclasses.fields(args)] if dataclasses.is_dataclass(args) else list(raw)
    resolved = {name: getattr(args, name) for name in names if hasattr(args, name)}
    changed = []
    for name in sorted(resolved):
        if name not in raw:
            continue
        before, after = _jsonable(raw[name]), _jsonable(resolved[name])
        if before != after:
            changed.append({"name": name, "from": before, "to": after, "source": "prepare_server_args"})
    return {
        "ok": True,
        "supported": True,
        "by": "prepare_server_args",
        "changed": changed,
        "resolved": {k: _jsonable(v) for k, v in resolved.items()},
    }


def main(argv: List[str]) -> int:
    out: Dict[str, Any] = {"schema": PROBE_SCHEMA, "python": sys.version.split()[0]}
    started = time.monotonic()
    want_flags = "--flags" in argv[: argv.index("--resolve")] if "--resolve" in argv else "--flags" in argv
    try:
        out["sglang_version"] = sglang_version()
    except Exception as exc:
        out["error"] = "sglang is not installed for this python: %s" % exc
        want_flags = False
    if want_flags:
        try:
            out["flags"] = flag_set()
            out["env_names"] = env_names()
        except Exception as exc:
            out["flags_error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if "--resolve" in argv and "error" not in out:
        out["resolve"] = resolve(argv[argv.index("--resolve") + 1 :])
    out["seconds"] = round(time.monotonic() - started, 3)
    sys.stdout.flush()
    sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    if "__file__" in globals():  # run by path: its own folder must not shadow the `sglang` package
        _here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.exit(main(sys.argv[1:]))
