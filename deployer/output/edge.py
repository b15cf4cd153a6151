"""The print edge: every line deployer writes to stdout or stderr loses its control sequences here (logtext's
`printable`: escape sequences, OSC titles and hyperlinks, CR, bells, other C0 and C1 codes; newline and tab
stay), whatever text it carries: an engine log line, a claim note another user wrote, an error message.

`guard_printable` wraps the process's streams once (above the secret masking, so both apply). The live console
draws with its own escape sequences: it writes to `styled_stderr()` (masked, not stripped) and strips the text
it is given itself (output/console.py `say`). `terminal_width` is here, not in the console, so a report's text
(deployer.cli.show) reads it without importing the event classes the console draws.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from deployer.logtext import printable


class PrintableStream:
    """A text stream that strips control sequences from what is written to it, then passes it on."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(printable(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def guard_printable() -> None:
    """Strip control sequences from everything the process writes to stdout and stderr through Python
    (idempotent)."""
    if not isinstance(sys.stdout, PrintableStream):
        sys.stdout = PrintableStream(sys.stdout)  # type: ignore[assignment]
    if not isinstance(sys.stderr, PrintableStream):
        sys.stderr = PrintableStream(sys.stderr)  # type: ignore[assignment]


def styled_stdout() -> TextIO:
    """stdout for a writer that draws with escape sequences of its own (`deploy top`'s screen) and strips its text
    itself."""
    stream = sys.stdout
    return stream.inner if isinstance(stream, PrintableStream) else stream


def styled_stderr() -> TextIO:
    """stderr for a writer that draws with escape sequences of its own (rich) and strips its text itself."""
    stream = sys.stderr
    return stream.inner if isinstance(stream, PrintableStream) else stream


FALLBACK_WIDTH = 80            # lines quoting log text, when stderr is no terminal and COLUMNS is unset


def terminal_width(stream: Any = None) -> int:
    """The width lines are fitted to, read each time (a resized terminal counts at once): `COLUMNS` when set,
    else the terminal's when `stream` (stderr) is one, else 80."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = sys.stderr if stream is None else stream
    try:
        if stream.isatty():
            return max(os.get_terminal_size(stream.fileno()).columns, 20)
    except (AttributeError, OSError, ValueError):
        pass
    return FALLBACK_WIDTH
