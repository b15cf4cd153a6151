"""STAND-IN for tests: imitates SGLang 0.5.23 (no GPU here); never used by the product.

Generator of `sglang/srt/flags_0_5_23.json`: the option table of the real SGLang 0.5.23 parser.

Run it with an interpreter that can import the real `sglang.srt.server_args` (e.g. a scratch venv with
`sglang==0.5.23 --no-deps`, torch CPU and the small deps). It writes data only; no SGLang code is copied.

    /tmp/sglvenv/bin/python tests/standin/tools/gen_flags.py --sglang-src /tmp/sgl/src
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

KINDS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "_AppendAction": "append",
    "_HelpAction": "help",
    "BooleanOptionalAction": "boolean_optional",
    "DeprecatedStoreTrueAction": "deprecated_store_true",
    "DeprecatedStoreConstAction": "deprecated_store_const",
    "DeprecatedAction": "deprecated",
    "DeprecatedAliasStoreAction": "deprecated_alias_store",
    "LoRAPathAction": "lora_path",
}


def _jsonable(value: Any) -> tuple[bool, Any]:
    try:
        return json.loads(json.dumps(value)) == value, value
    except (TypeError, ValueError):
        return False, None


def _type_name(tp: Any) -> str | None:
    if tp is None:
        return None
    if tp in (int, float, str):
        return tp.__name__
    return "other:" + getattr(tp, "__name__", type(tp).__name__)


def describe(action: argparse.Action) -> dict[str, Any]:
    kind = KINDS.get(type(action).__name__)
    if kind is None:
        raise SystemExit(f"unknown action class {type(action).__name__} for {action.option_strings}")
    row: dict[str, Any] = {
        "option_strings": list(action.option_strings),
        "dest": action.dest,
        "kind": kind,
        "nargs": action.nargs,
        "type": _type_name(action.type),
        "choices": list(action.choices) if action.choices is not None else None,
        "required": action.required,
        "metavar": action.metavar,
        "help": action.help if action.help != argparse.SUPPRESS else "==SUPPRESS==",
    }
    ok, default = _jsonable(action.default)
    row["default"] = default if ok else None
    if not ok:
        row["default_repr"] = repr(action.default)
    ok, const = _jsonable(action.const)
    row["const"] = const if ok else repr(action.const)
    for extra in ("new_flag", "const_value", "error_message"):
        if hasattr(action, extra):
            row[extra] = getattr(action, extra)
    return row


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--sglang-src", default="/tmp/sgl/src")
    cli.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "sglang/srt/flags_0_5_23.json"))
    opts = cli.parse_args()
    sys.path.insert(0, opts.sglang_src)
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    data = {
        "sglang_version": sglang.__version__,
        "prog": parser.prog,
        "allow_abbrev": parser.allow_abbrev,
        "actions": [describe(a) for a in parser._actions if a.dest != "help"],
    }
    Path(opts.out).write_text(json.dumps(data, indent=0, sort_keys=False) + "\n")
    print(f"wrote {len(data['actions'])} actions to {opts.out}")


if __name__ == "__main__":
    main()
