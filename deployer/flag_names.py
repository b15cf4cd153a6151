"""The two spellings of an engine flag: `tp_size` (a profile's engine.args key) and `--tp-size` (the command line).

Profiles may write either (`tp-size`, `--tp-size`); everything deployer compares uses the key form.
"""

from __future__ import annotations


def option_key(option: str) -> str:
    """`--tp-size`, `tp-size` or `tp_size` -> `tp_size`."""
    return option.lstrip("-").replace("-", "_")


def key_option(key: str) -> str:
    """`tp_size` -> `--tp-size`."""
    return "--" + key.lstrip("-").replace("_", "-")
