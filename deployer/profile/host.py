"""A host address as a person writes it (`--host`, `target.host`): `[user@]host[:port]`."""

from __future__ import annotations


def parse_host(text: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` (the --host option) -> (user, host, port); ValueError when malformed."""
    user, at, rest = text.rpartition("@")
    host, port = rest, None
    if rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ValueError(f"--host {text!r}: port must be a number from 1 to 65535")
        port = int(port_text)
    if not host or (at and not user):
        raise ValueError(f"--host {text!r}: expected [USER@]HOST[:PORT]")
    return (user or None), host, port
