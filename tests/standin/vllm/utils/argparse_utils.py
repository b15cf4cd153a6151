"""STAND-IN for tests: imitates vLLM 0.33.0 (no GPU here); never used by the product.

`FlexibleArgumentParser` as far as a command line sees it: `--flag_name` is read as `--flag-name` (both for
`--x_y v` and `--x_y=v`), errors are argparse's own (usage + `error: ...`, exit 2).
"""

import argparse
import sys


class FlexibleArgumentParser(argparse.ArgumentParser):
    def parse_known_args(self, args=None, namespace=None):
        if args is None:
            args = sys.argv[1:]
        return super().parse_known_args([_dashed(a) for a in args], namespace)


def _dashed(arg: str) -> str:
    if not arg.startswith("--") or arg == "--":
        return arg
    key, sep, value = arg.partition("=")
    return key.replace("_", "-") + sep + value


def human_readable_int(value: str) -> int:
    """'1k' -> 1000, '1K' -> 1024, '25.6k' -> 25600, plain integers as they are."""
    value = value.strip()
    units = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}
    if value and value[-1] in units:
        number, mult = value[:-1], units[value[-1]]
        try:
            return int(float(number) * mult) if value[-1].islower() else int(number) * mult
        except ValueError:
            raise argparse.ArgumentTypeError(f"Invalid value for {value!r}") from None
    return int(value)
