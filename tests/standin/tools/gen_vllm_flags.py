"""STAND-IN for tests: imitates vLLM 0.33.0 (no GPU here); never used by the product.

Generator of `vllm/entrypoints/openai/flags_0_33_0.json`: the option table of the real vLLM parser
(`make_arg_parser(FlexibleArgumentParser())` of `vllm.entrypoints.common.cli_args`).

Run it with the real-vLLM CPU venv (`make vllm-venv`); VLLM_TARGET_DEVICE=cpu lets the parser build without
a GPU. It writes data only; no vLLM code is copied.

    VLLM_TARGET_DEVICE=cpu ~/.cache/deployer/vllm-venv/bin/python tests/standin/tools/gen_vllm_flags.py
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "vllm/entrypoints/openai/flags_0_33_0.json"
KINDS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_AppendAction": "append",
    "_HelpAction": "help",
    "EnableDisableAction": "enable_disable",
    "BooleanOptionalAction": "enable_disable",
    "LoRAParserAction": "store",
    "DeprecatedLogConfigFileAction": "store",
}
PLAIN = {int: "int", float: "float", str: "str"}
NAMED = {"loads": "json", "parse_dataclass": "json", "human_readable_int": "hr_int",
         "human_readable_int_or_auto": "hr_int_or_auto"}


def type_name(tp: Any) -> str | None:
    """The value parser as a name the stand-in understands (optional_type is unwrapped from its closure)."""
    if tp is None:
        return None
    if tp in PLAIN:
        return PLAIN[tp]
    name = getattr(tp, "__name__", type(tp).__name__)
    if name == "_optional_type":
        inner = [c.cell_contents for c in (tp.__closure__ or ()) if callable(c.cell_contents)]
        return "optional:" + (type_name(inner[0]) or "str") if inner else "optional:str"
    return NAMED.get(name, "str")


def jsonable(value: Any) -> tuple[bool, Any]:
    try:
        return json.loads(json.dumps(value)) == value, value
    except (TypeError, ValueError):
        return False, None


def describe(action: argparse.Action, accepted: list[str]) -> dict[str, Any]:
    kind = KINDS.get(type(action).__name__)
    if kind is None:
        raise SystemExit(f"unknown action class {type(action).__name__} for {action.option_strings}")
    row: dict[str, Any] = {
        "option_strings": list(action.option_strings),
        "accepted": accepted,
        "dest": action.dest,
        "kind": kind,
        "action_class": type(action).__name__,
        "nargs": action.nargs,
        "type": type_name(action.type),
        "choices": [str(c) for c in action.choices] if action.choices is not None else None,
        "required": action.required,
        "metavar": action.metavar,
    }
    negative = getattr(action, "negative_option_strings", None)
    if negative is not None:
        row["negative"] = sorted(negative)
    ok, default = jsonable(action.default)
    row["default"] = default if ok else None
    if not ok:
        row["default_repr"] = repr(action.default)
    return row


def _accepted(parser: argparse.ArgumentParser, action: argparse.Action) -> list[str]:
    """Every option string the parser accepts for the action (hidden ones such as --no-enable-x included)."""
    return sorted(s for s, a in parser._option_string_actions.items() if a is action)


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--out", type=Path, default=OUT)
    out = cli.parse_args().out
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import vllm
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
    data = {
        "vllm_version": vllm.__version__,
        "source": "vllm.entrypoints.common.cli_args.make_arg_parser(FlexibleArgumentParser())",
        "allow_abbrev": parser.allow_abbrev,
        "actions": [describe(a, _accepted(parser, a)) for a in parser._actions if a.dest != "help"],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=0) + "\n")
    print(f"wrote {len(data['actions'])} actions of vLLM {data['vllm_version']} to {out}")


if __name__ == "__main__":
    main()
