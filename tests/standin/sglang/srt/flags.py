"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product.

Builds the real SGLang option table into an argparse parser.

The tables `flags_0_5_23.json` and `flags_0_5_10.json` were generated from the real parsers of SGLang
0.5.23 and of the seed era's 0.5.10 by `tools/gen_flags.py`: every option string, dest, kind, nargs, type,
choices, default, metavar and help, in the real order, so usage text, abbreviation matching and error
messages come out as the real argparse prints them. Older eras (`version.is_old_era`) use 0.5.10's table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, Dict, List

from sglang.version import __version__, is_old_era

HERE = os.path.dirname(os.path.abspath(__file__))
DATA_FILE = os.path.join(HERE, "flags_0_5_23.json")
SEED_ERA_FILE = os.path.join(HERE, "flags_0_5_10.json")
PROG = "sglang serve"

logger = logging.getLogger("sglang.srt.arg_groups.argparse_actions")

def _print_deprecated_warning(message: str) -> None:
    # Real SGLang warns before logging is configured, so Python's last-resort handler prints it bare.
    sys.stderr.write(f"\033[1;33m{message}\033[0m\n")
    sys.stderr.flush()


class DeprecatedStoreTrueAction(argparse.Action):
    """Deprecated flag that still stores True and prints the real warning."""

    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False, **kw):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        _print_deprecated_warning(
            f"'{option_string}' is deprecated and will be removed in a future release.{replacement}"
        )
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(argparse.Action):
    """An old boolean whose replacement is one value of a valued flag."""

    def __init__(self, option_strings, dest, new_flag=None, const_value=None, nargs=0, default=None, **kw):
        # nargs=None with choices retires a valued flag whose one accepted value became a boolean.
        self.new_flag = new_flag
        self.const_value = const_value
        super().__init__(option_strings, dest, nargs=nargs, default=default, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        _print_deprecated_warning(
            f"'{option_string}' is deprecated and will be removed in a future release.{replacement}"
        )
        setattr(namespace, self.dest, self.const_value)


class DeprecatedAction(argparse.Action):
    """0.5.10: a retired flag that is still accepted, stores nothing and prints the real warning."""

    def __init__(self, option_strings, dest, nargs=0, **kw):
        super().__init__(option_strings, dest, nargs=nargs, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        _print_deprecated_warning(
            f"The command line argument '{option_string}' is deprecated and will be removed in future versions."
        )


class LoRAPathAction(argparse.Action):
    """Stores the list of LoRA paths (JSON objects kept as text: nothing here loads adapters)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [v.strip() for v in (values or [])])


_TYPES = {"int": int, "float": float, "str": str}


def load_rows(version: str = __version__) -> List[Dict[str, Any]]:
    """The option rows of the given era, in the real registration order."""
    with open(SEED_ERA_FILE if is_old_era(version) else DATA_FILE, encoding="utf-8") as fh:
        return list(json.load(fh)["actions"])


def _kwargs(row: Dict[str, Any]) -> Dict[str, Any]:
    kw: Dict[str, Any] = {"dest": row["dest"], "default": row["default"]}
    help_text = row.get("help")
    kw["help"] = argparse.SUPPRESS if help_text == "==SUPPRESS==" else help_text
    kind = row["kind"]
    if kind in ("store", "lora_path"):
        kw.update(type=_TYPES.get(row["type"] or "str", str), nargs=row["nargs"], choices=row["choices"])
        kw.update(required=row["required"], metavar=row["metavar"])
        if kind == "lora_path":
            kw.update(action=LoRAPathAction, type=str)
    elif kind in ("store_true", "store_false"):
        kw["action"] = kind
    elif kind == "store_const":
        kw.update(action="store_const", const=row["const"])
    elif kind == "boolean_optional":
        kw["action"] = argparse.BooleanOptionalAction
    elif kind == "deprecated":
        kw.update(action=DeprecatedAction, nargs=row["nargs"])
    elif kind == "deprecated_store_true":
        kw.update(action=DeprecatedStoreTrueAction, new_flag=row.get("new_flag"))
    elif kind == "deprecated_store_const":
        kw.update(action=DeprecatedStoreConstAction, new_flag=row.get("new_flag"))
        kw.update(const_value=row.get("const_value"), nargs=row["nargs"], choices=row["choices"])
    else:
        raise ValueError(f"stand-in flag table: unsupported kind {kind!r}")
    return kw


def add_flags(parser: argparse.ArgumentParser, version: str = __version__) -> None:
    """Registers every option of the era on `parser`, as the real `ServerArgs.add_cli_args` does."""
    for row in load_rows(version):
        if row["kind"] == "help":
            continue
        options = row["option_strings"]
        if row["kind"] == "boolean_optional":
            options = [o for o in options if not o.startswith("--no-")]
        parser.add_argument(*options, **_kwargs(row))


def option_dests(version: str = __version__) -> List[str]:
    """Field names in registration order (the key order of the `server_args={...}` dump)."""
    return [r["dest"] for r in load_rows(version) if r["kind"] != "help"]
