"""Hosts and names as a person writes them: `[user@]host[:port]` (`--host`, `target.host`), how a host is reached
(`TargetSpec`: the profile's `target:`, a remembered pointer, the local history's record), the address a server
bound somewhere is reached at, and what a deployment may be named. A leaf: imports nothing of deployer's, so the
profile, this machine's records (deployer.local) and the remote seam all use it; the on-call commands that take a
name use it without loading the profile model."""

from __future__ import annotations

from dataclasses import dataclass

LOCAL = "local"   # the host name of this machine itself (remote/local.py: no ssh)


@dataclass(frozen=True)
class TargetSpec:
    """Everything needed to reach a host. Unset fields fall back to ~/.ssh/config, then to ssh's defaults."""

    host: str  # hostname, ~/.ssh/config alias, or "local"
    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str | None = None  # default ~/.ssh/known_hosts (or the config's UserKnownHostsFile)
    ssh_config: str | None = None  # default ~/.ssh/config; env DEPLOYER_SSH_CONFIG overrides the default
    trust_new_host: bool = False  # record an unknown host's key instead of refusing
    connect_timeout: float = 10.0

    @property
    def label(self) -> str:
        """`user@host:port` for messages, leaving out what is not set."""
        if self.host == LOCAL:
            return LOCAL
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.host}{port}"


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
