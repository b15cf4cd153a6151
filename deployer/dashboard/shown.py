"""What may leave the dashboard server: every string stripped of control sequences and masked as the CLI masks it,
then JSON that no HTML parser can read as markup.

`shown`: JSON-like data with each string (keys too) made `printable` (logtext) and then `mask_text`ed (secrets),
in that order so an escape sequence inside a secret cannot hide it from the mask. `shown_log_lines`: log lines as
a person reads them (`readable`: the last state of a \\r-redrawn line) and masked. `json_bytes`: the body sent,
with `<`, `>` and `&` written as JSON escapes. The page itself only ever sets text (`textContent`), never HTML.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from deployer.logtext import printable, readable
from deployer.secrets import map_strings, mask_text


def shown_text(text: str) -> str:
    return mask_text(printable(text))


def shown(value: Any) -> Any:
    """`value` (JSON-like) with every string made safe to show."""
    return map_strings(value, shown_text)


def shown_log_lines(lines: Iterable[str]) -> list[str]:
    return [mask_text(readable(line)) for line in lines]


def finite(value: Any) -> Any:
    """`value` (JSON-like) with every float that is not finite (nan, inf) as None: JSON has no such numbers, and
    the page's parser refuses the `NaN` Python would write."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_bytes(value: Any) -> bytes:
    """The JSON body of a response: `<`, `>`, `&` as \\u escapes, so no sniffing parser finds a tag in it; no
    float that is not finite (None instead)."""
    text = json.dumps(finite(value), ensure_ascii=False, separators=(",", ":"), default=str, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()
