"""What SSHRemote needs before it dials: ~/.ssh/config resolution and known_hosts checking.

`resolve()` turns a TargetSpec into concrete connection parameters (explicit TargetSpec fields win over
the ssh config, like ssh's command line). `host_key_policy()` is a paramiko policy that refuses unknown
hosts with HostKeyUnknown, or records their key when the user asked to trust new hosts.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deployer.errors import AuthFailed, HostKeyMismatch, HostKeyUnknown, RemoteError

if TYPE_CHECKING:
    import paramiko

    from deployer.remote.base import TargetSpec

DEFAULT_SSH_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
SSH_CONFIG_ENV = "DEPLOYER_SSH_CONFIG"


@dataclass(frozen=True)
class Resolved:
    """Concrete parameters for one hop."""

    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    known_hosts: str
    proxy_jump: str | None  # "user@host:port,..." hops, or None

    @property
    def label(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def _ssh_config(spec: TargetSpec) -> paramiko.SSHConfig:
    import paramiko

    path = spec.ssh_config or os.environ.get(SSH_CONFIG_ENV)
    explicit = path is not None
    path = os.path.expanduser(path or DEFAULT_SSH_CONFIG)
    if not os.path.exists(path):
        if explicit:
            raise RemoteError(f"ssh config {path} does not exist", host=spec.host)
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(path)
    except (OSError, paramiko.ConfigParseError) as e:
        raise RemoteError(f"cannot read ssh config {path}: {e}", host=spec.host) from None


def resolve(spec: TargetSpec, proxy_jump: str | None = None) -> Resolved:
    """TargetSpec (+ ssh config) -> Resolved. `proxy_jump` overrides the config's ProxyJump ('none' = off)."""
    found: dict[str, Any] = dict(_ssh_config(spec).lookup(spec.host))
    port = spec.port or int(found.get("port", 22))
    if spec.identity_file:
        identities: tuple[str, ...] = (os.path.expanduser(spec.identity_file),)
    else:
        listed = [os.path.expanduser(p) for p in found.get("identityfile", [])]
        identities = tuple(p for p in listed if os.path.exists(p))  # ssh skips missing defaults too
    known = spec.known_hosts or (found.get("userknownhostsfile") or "").split(" ")[0] or DEFAULT_KNOWN_HOSTS
    jump = proxy_jump if proxy_jump is not None else found.get("proxyjump")
    return Resolved(
        hostname=found.get("hostname", spec.host),
        port=port,
        user=spec.user or found.get("user") or getpass.getuser(),
        identity_files=identities,
        known_hosts=os.path.expanduser(known),
        proxy_jump=None if not jump or jump.lower() == "none" else jump,
    )


def check_identity(path: str, label: str) -> None:
    """AuthFailed now (not after a handshake and retries) for a key file that is missing or not a key.

    An encrypted key passes: paramiko then falls back to the agent, as ssh does."""
    import paramiko

    try:
        paramiko.PKey.from_path(path)
    except (paramiko.PasswordRequiredException, TypeError):  # TypeError: cryptography's "password-protected"
        pass
    except OSError as e:
        raise AuthFailed(f"identity file {path}: {e.strerror or e}", host=label) from None
    except (paramiko.SSHException, ValueError) as e:
        raise AuthFailed(f"identity file {path} is not a usable private key: {e}", host=label) from None


def split_hop(hop: str) -> tuple[str | None, str, int | None]:
    """'user@host:port' -> (user, host, port); user and port optional."""
    user, _, rest = hop.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):  # [v6addr]:port
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") else None
    elif rest.count(":") == 1:
        host, p = rest.split(":")
        port = int(p)
    return user or None, host, port


def known_hosts_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def record_host_key(path: str, name: str, key: paramiko.PKey) -> None:
    """Append `name type base64` to known_hosts, creating it (0600, dir 0700) if needed."""
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(f"{name} {key.get_name()} {key.get_base64()}\n")


def host_key_policy(known_hosts: str, trust_new_host: bool, label: str) -> paramiko.MissingHostKeyPolicy:
    """RejectPolicy with our error, or trust-on-first-use that writes known_hosts when asked."""
    import paramiko

    class _Policy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            if not trust_new_host:
                raise HostKeyUnknown(
                    f"host {hostname} ({key.get_name()} {fingerprint(key)}) is not in known_hosts "
                    f"{known_hosts}; run with --trust-new-host to record it",
                    host=label,
                )
            try:
                record_host_key(known_hosts, hostname, key)
            except OSError as e:
                raise RemoteError(f"cannot record host key in {known_hosts}: {e}", host=label) from None
            client.get_host_keys().add(hostname, key.get_name(), key)

    return _Policy()


def mismatch_error(err: paramiko.BadHostKeyException, known_hosts: str, name: str, label: str) -> HostKeyMismatch:
    return HostKeyMismatch(
        f"host key for {name} changed (server offers {err.key.get_name()} {fingerprint(err.key)}, "
        f"known_hosts {known_hosts} has {err.expected_key.get_name()} {fingerprint(err.expected_key)}): "
        f"possible man-in-the-middle; if the change is expected, remove the old key with "
        f"ssh-keygen -f {known_hosts} -R '{name}'",
        host=label,
    )
