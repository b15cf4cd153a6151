"""STAND-IN for tests: imitates vLLM 0.33.0 (no GPU here); never used by the product.

The serve argument parser, built from `entrypoints/openai/flags_0_33_0.json`: the option table that
`tools/gen_vllm_flags.py` read from the real parser (`make_arg_parser(FlexibleArgumentParser())` of vLLM 0.33.0):
option strings, dest, kind, nargs, value type, choices and defaults, in the real order.
"""

import argparse
import json
import os
from typing import Any, Callable, Dict, List, Optional

from vllm.utils.argparse_utils import FlexibleArgumentParser, human_readable_int

DATA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "openai", "flags_0_33_0.json")


def load_rows() -> List[Dict[str, Any]]:
    with open(DATA_FILE, encoding="utf-8") as fh:
        return json.load(fh)["actions"]


def _hr_int_or_auto(value: str) -> int:
    return -1 if value.strip().lower() in ("auto", "-1") else human_readable_int(value)


_BASE: Dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str, "json": json.loads,
                                          "hr_int": human_readable_int, "hr_int_or_auto": _hr_int_or_auto}


def _value_type(name: Optional[str]) -> Optional[Callable[[str], Any]]:
    if name is None:
        return None
    if name.startswith("optional:"):
        inner = _BASE[name.split(":", 1)[1]]

        def _optional_type(val: str) -> Any:
            return None if val in ("", "None") else inner(val)

        return _optional_type
    return _BASE[name]


class EnableDisableAction(argparse.Action):
    """`--enable-x` / `--disable-x` (and the hidden `--no-...` forms): the negative strings store False."""

    def __init__(self, option_strings, dest, negative=(), **kw):
        self.negative = frozenset(negative)
        super().__init__(option_strings, dest, nargs=0, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, option_string not in self.negative)


def _add(parser: argparse.ArgumentParser, row: Dict[str, Any]) -> None:
    kind, options = row["kind"], row.get("accepted") or row["option_strings"]
    default = argparse.SUPPRESS if row["default"] == argparse.SUPPRESS else row["default"]
    kw: Dict[str, Any] = {"dest": row["dest"], "default": default}
    if kind == "store":
        value_type = _value_type(row["type"])
        if value_type is not None:
            kw["type"] = value_type
        kw.update(nargs=row["nargs"], choices=row["choices"], metavar=row["metavar"])
        if options:
            kw["required"] = row["required"]
    elif kind == "append":
        kw.update(action="append", type=_value_type(row["type"]) or str)
    elif kind in ("store_true", "store_false"):
        kw["action"] = kind
    elif kind == "enable_disable":
        kw.update(action=EnableDisableAction, negative=row.get("negative", ()))
    else:
        raise ValueError(f"stand-in flag table: unsupported kind {kind!r}")
    if not options:  # the positional model_tag
        kw.pop("dest")
        parser.add_argument(row["dest"], **kw)
        return
    parser.add_argument(*options, **kw)


def make_arg_parser(parser: FlexibleArgumentParser) -> FlexibleArgumentParser:
    for row in load_rows():
        _add(parser, row)
    return parser


def validate_parsed_serve_args(args: argparse.Namespace) -> None:
    """The checks of entrypoints/common/cli_args.py:531 that need no model."""
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")
    if args.enable_log_outputs and not args.enable_log_requests:
        raise TypeError("Error: --enable-log-outputs requires --enable-log-requests")
