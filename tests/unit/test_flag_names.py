"""One conversion between a flag's profile key (`tp_size`) and its command-line option (`--tp-size`)."""

from __future__ import annotations

import pytest

from deployer.flag_names import key_option, option_key


@pytest.mark.parametrize("written", ["tp_size", "tp-size", "--tp-size", "--tp_size"])
def test_every_spelling_has_one_key(written: str) -> None:
    assert option_key(written) == "tp_size"


def test_key_to_option_and_back() -> None:
    assert key_option("mem_fraction_static") == "--mem-fraction-static"
    assert option_key(key_option("speculative_num_draft_tokens")) == "speculative_num_draft_tokens"
