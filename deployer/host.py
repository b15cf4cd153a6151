"""Addresses and names as a person writes them: `[user@]host[:port]` (`--host`, `target.host`), the address a
server bound somewhere is reached at, and what a deployment may be named. Imports nothing heavy: the on-call
commands that take a name use it without loading the profile model."""

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


# A deployment's name: also its directory on the target and its Kubernetes object names.
NAME_RE = r"^[a-z0-9][a-z0-9-]*$"


def probe_address(bind: str) -> str:
    """The address to reach a server bound to `bind` from its own host (a wildcard bind answers on loopback)."""
    return "127.0.0.1" if bind in ("", "0.0.0.0", "::", "[::]") else bind.strip("[]")


def host_port(addr: str, port: int) -> str:
    """`host:port`, an IPv6 address in brackets."""
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
