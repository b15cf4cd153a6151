"""Reading one profile file, and its YAML, within bounds decided before anything is read or built.

A profile is input: people share them, CI takes them from pull requests, `extends:` pulls in other files. So the
text of one profile (the named file and every file it extends, together) and what its YAML builds are bounded:

- the file: a regular file only (a FIFO, device or socket is refused from its `stat`, without opening or reading
  it), checked again on the open file, and read at most `Budget.bytes` + 1 bytes (`MAX_BYTES` for all the files of
  one profile);
- the YAML: at most `MAX_DEPTH` levels of nesting; at most `MAX_NODES` nodes counted as built, an alias counting
  every node of what it names (an anchor bomb stops at the alias that crosses the limit, before anything is built
  from it); an alias inside the node it names (a recursive structure) refused; integers and floats of at most
  `MAX_NUMBER_CHARS` characters; a value YAML cannot build (a date that is no date, bad base64) one ProfileError.

Every refusal is one `ProfileError` (one line, exit 2) that names the file and, where there is one, the line.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from deployer.errors import ProfileError

MAX_BYTES = 1 << 20        # the named file and every file it extends, together
MAX_DEPTH = 32             # nested mappings and lists (a real profile uses 4 or 5)
MAX_NODES = 20_000         # every key, value and list item, aliases expanded (a real profile has a few hundred)
MAX_NUMBER_CHARS = 64      # an integer or float written longer than this is refused (quote it to make it text)
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


@dataclass
class Budget:
    """What the files of one profile may still use: bytes of text and YAML nodes (aliases expanded)."""

    bytes: int = MAX_BYTES
    nodes: int = MAX_NODES


def read_text(path: Path, budget: Budget) -> str:
    """The file's text: a regular file, UTF-8, no NUL, within the budget's bytes (which it then spends)."""
    try:
        _check_kind(path, os.stat(path).st_mode)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ProfileError("file not found", file=str(path)) from None
    except OSError as exc:
        raise ProfileError(f"cannot read: {exc.strerror}", file=str(path)) from None
    with os.fdopen(fd, "rb") as file:
        _check_kind(path, os.fstat(fd).st_mode)  # what was opened, should the name have changed since the stat
        try:
            raw = file.read(budget.bytes + 1)
        except OSError as exc:
            raise ProfileError(f"cannot read: {exc.strerror}", file=str(path)) from None
    if len(raw) > budget.bytes:
        whole = "" if budget.bytes == MAX_BYTES else " with the files it extends"
        raise ProfileError(f"file is too large for a profile (over {MAX_BYTES} bytes{whole})", file=str(path))
    budget.bytes -= len(raw)
    if b"\x00" in raw:
        raise ProfileError("not a text file (binary content)", file=str(path))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProfileError("not a UTF-8 text file (binary content?)", file=str(path)) from None


def _check_kind(path: Path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise ProfileError("is a directory, not a profile file", file=str(path))
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a plain file")
        raise ProfileError(f"not a regular file ({kind}); a profile is a YAML file", file=str(path))


def parse(text: str, file: str, budget: Budget) -> tuple[yaml.Node | None, Any]:
    """The document's node (for line numbers) and its data; None, None for an empty document. Spends the budget's
    nodes; every YAML problem and every bound crossed is a ProfileError naming `file` and the line."""
    try:
        return _build(text, file, budget)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        raise ProfileError(f"YAML syntax error: {problem}", file=file, line=mark.line + 1 if mark else None) \
            from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"YAML error: {_one_line(str(exc))}", file=file) from None


def parse_value(text: str, file: str) -> Any:
    """One YAML value (a `--set` right-hand side) under the same bounds; the text itself when it is not YAML."""
    try:
        return _build(text, file, Budget())[1]
    except yaml.YAMLError:
        return text


def _build(text: str, file: str, budget: Budget) -> tuple[yaml.Node | None, Any]:
    loader = BoundedLoader(text, file, budget)
    try:
        node = loader.get_single_node()
        return node, (loader.construct_document(node) if node is not None else None)
    except (ValueError, TypeError, ArithmeticError, LookupError, AttributeError) as exc:  # outside construct_object
        raise ProfileError(f"YAML value cannot be read ({type(exc).__name__})", file=file) from None
    finally:
        loader.dispose()


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that counts nodes (aliases expanded) and depth while it composes, and bounds numbers
    and turns a value it cannot build into a ProfileError while it constructs."""

    def __init__(self, text: str, file: str, budget: Budget) -> None:
        super().__init__(text)
        self.file = file
        self.budget = budget
        self.depth = 0
        self.sizes: dict[str, int] = {}  # anchor -> nodes of its (complete) node, aliases in it expanded

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1 if event.start_mark else None
        if isinstance(event, yaml.AliasEvent):
            size = self.sizes.get(event.anchor or "")
            if size is None and event.anchor in self.anchors:
                raise ProfileError(f"alias *{event.anchor} is inside the node it names (a recursive structure)",
                                   file=self.file, line=line)
            self._spend(size or 0, line)
            return super().compose_node(parent, index)  # type: ignore[no-untyped-call]
        if self.depth >= MAX_DEPTH:
            raise ProfileError(f"nested deeper than {MAX_DEPTH} levels", file=self.file, line=line)
        left = self.budget.nodes
        self._spend(1, line)
        self.depth += 1
        node: yaml.Node | None = super().compose_node(parent, index)  # type: ignore[no-untyped-call]
        self.depth -= 1
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self.sizes[anchor] = left - self.budget.nodes
        return node

    def _spend(self, nodes: int, line: int | None) -> None:
        self.budget.nodes -= nodes
        if self.budget.nodes < 0:
            raise ProfileError(f"too many YAML nodes (over {MAX_NODES}, counting each node an alias repeats)",
                               file=self.file, line=line)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        if node.tag in _NUMBER_TAGS and isinstance(node.value, str) and len(node.value) > MAX_NUMBER_CHARS:
            raise ProfileError(f"number too long (over {MAX_NUMBER_CHARS} characters; quote it to make it text)",
                               file=self.file, line=node.start_mark.line + 1)
        try:
            return super().construct_object(node, deep)  # type: ignore[no-untyped-call]
        except (ValueError, TypeError, ArithmeticError, LookupError, AttributeError) as exc:  # `!!bool maybe`
            kind = node.tag.rsplit(":", 1)[-1]
            raise ProfileError(f"YAML value cannot be read as {kind} ({type(exc).__name__})", file=self.file,
                               line=node.start_mark.line + 1) from None


def _one_line(text: str) -> str:
    return " ".join(text.split())
