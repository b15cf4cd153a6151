"""What SSHRemote needs before it dials: ~/.ssh/config resolution and known_hosts checking.

`resolve()` turns a TargetSpec into concrete connection parameters (explicit TargetSpec fields win over
the ssh config, like ssh's command line). The config is read as ssh reads it: `Include` lines are followed
(paths relative to ~/.ssh, globs sorted, nested up to ssh's depth of 16) before paramiko parses the text, and
`ProxyCommand` is kept with its %h/%p/%r/%n/%% tokens expanded from the final values. `host_key_policy()` is a
paramiko policy that refuses unknown hosts with HostKeyUnknown, or records their key when the user asked to
trust new hosts.
"""

from __future__ import annotations

import base64
import getpass
import glob
import hashlib
import os
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deployer.errors import AuthFailed, HostKeyMismatch, HostKeyUnknown, RemoteError

if TYPE_CHECKING:
    import paramiko

    from deployer.host import TargetSpec

DEFAULT_SSH_CONFIG = "~/.ssh/config"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
SSH_CONFIG_ENV = "DEPLOYER_SSH_CONFIG"
MAX_INCLUDE_DEPTH = 16  # ssh's READCONF_MAX_DEPTH
_KEYWORD_RE = re.compile(r"^\s*(\w+)(?:\s*=\s*|\s+)(.*?)\s*$")
# ProxyCommand tokens are expanded by us from the final values (paramiko would use the config's, not --host's).
_PCT = "\x01"


@dataclass(frozen=True)
class Resolved:
    """Concrete parameters for one hop."""

    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    known_hosts: str
    proxy_jump: str | None  # "user@host:port,..." hops, or None
    proxy_command: str | None = None  # the shell command whose stdin/stdout is the connection, tokens expanded
    missing_identities: tuple[str, ...] = ()  # the ssh config's IdentityFiles that name no file (skipped, as by ssh)

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
        return paramiko.SSHConfig.from_text(expand_includes(path))
    except (OSError, paramiko.ConfigParseError) as e:
        raise RemoteError(f"cannot read ssh config {path}: {e}", host=spec.host) from None


def include_paths(pattern: str, base: str) -> list[str]:
    """One `Include` word -> the files it names: ~ expanded, relative to `base`, glob matches sorted."""
    pattern = os.path.expanduser(pattern)
    if not os.path.isabs(pattern):
        pattern = os.path.join(base, pattern)
    return sorted(p for p in glob.glob(pattern) if os.path.isfile(p))


def expand_includes(path: str, depth: int = 0, outer: str = "") -> str:
    """The config text with every `Include` replaced by the files it names, as ssh reads them.

    An Include inside a Host/Match block applies the included file only to that block's hosts, its own Host
    and Match blocks too: `outer` carries the enclosing condition as Match criteria, and the included headers
    become `Match <outer> originalhost <patterns>`. After an included file, the enclosing block is opened
    again, so the lines that follow keep applying to the same hosts. ProxyCommand's `%` are protected from
    paramiko's token expansion (see `_proxy_command`)."""
    if depth > MAX_INCLUDE_DEPTH:
        raise RemoteError(f"ssh config {path}: Include nested more than {MAX_INCLUDE_DEPTH} deep")
    base = os.path.expanduser("~/.ssh")
    out: list[str] = []
    header, criteria = (f"Match {outer}", outer) if outer else ("Host *", "")
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    for line in lines:
        m = _KEYWORD_RE.match(line)
        keyword = m.group(1).lower() if m else ""
        if keyword in ("host", "match") and m is not None:
            criteria = " ".join(c for c in (outer, _criteria(keyword, m.group(2))) if c)
            header = f"Match {criteria}" if outer else line.strip()
            out.append(header)
            continue
        if keyword == "proxycommand" and m is not None:
            line = f"ProxyCommand {m.group(2).replace('%', _PCT)}"
        elif keyword == "include" and m is not None:
            for word in m.group(2).split():
                for included in include_paths(word.strip('"'), base):
                    out.append(expand_includes(included, depth + 1, criteria))
            out.append(header)
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def _criteria(keyword: str, value: str) -> str:
    """A Host/Match line's condition as Match criteria ('' = every host)."""
    if keyword == "match":
        return "" if value.strip().lower() == "all" else value.strip()
    patterns = value.split()
    return "" if patterns == ["*"] else "originalhost " + ",".join(patterns)


def _proxy_command(raw: str | None, hostname: str, alias: str, port: int, user: str) -> str | None:
    if raw is None or raw.lower() == "none":
        return None
    tokens = {"%": "%", "h": hostname, "n": alias, "p": str(port), "r": user}
    text = raw.replace(_PCT, "%")

    def one(m: re.Match[str]) -> str:
        if m.group(1) not in tokens:
            raise RemoteError(f"ProxyCommand {text!r}: unknown token %{m.group(1)} (ssh allows %%, %h, %n, %p, "
                              f"%r)", host=alias)
        return tokens[m.group(1)]

    return re.sub(r"%(.)", one, text)


def resolve(spec: TargetSpec, proxy_jump: str | None = None) -> Resolved:
    """TargetSpec (+ ssh config) -> Resolved. `proxy_jump` overrides the config's ProxyJump ('none' = off)."""
    found: dict[str, Any] = dict(_ssh_config(spec).lookup(spec.host))
    port = spec.port or int(found.get("port", 22))
    listed: list[str] = []
    if spec.identity_file:
        identities: tuple[str, ...] = (os.path.expanduser(spec.identity_file),)
    else:
        listed = [os.path.expanduser(p) for p in found.get("identityfile", [])]
        identities = tuple(p for p in listed if os.path.exists(p))  # ssh skips missing ones too (with a warning)
    known = spec.known_hosts or (found.get("userknownhostsfile") or "").split(" ")[0] or DEFAULT_KNOWN_HOSTS
    jump = proxy_jump if proxy_jump is not None else found.get("proxyjump")
    jump = None if not jump or jump.lower() == "none" else jump
    hostname = found.get("hostname", spec.host)
    user = spec.user or found.get("user") or getpass.getuser()
    command = None if proxy_jump is not None else _proxy_command(found.get("proxycommand"), hostname, spec.host,
                                                                   port, user)
    if jump and command:
        raise RemoteError("ssh config sets both ProxyJump and ProxyCommand for this host; keep one",
                          host=spec.host)
    return Resolved(
        hostname=hostname,
        port=port,
        user=user,
        identity_files=identities,
        known_hosts=os.path.expanduser(known),
        proxy_jump=jump,
        proxy_command=command,
        missing_identities=tuple(p for p in listed if p not in identities),
    )


def check_identity(path: str, label: str) -> bool:
    """AuthFailed now (not after a handshake and retries) for a key file that is missing or not a key.

    Returns True for an encrypted key: it passes, since paramiko then falls back to the agent, as ssh does
    (deployer never asks for a passphrase); `encrypted_key_error` explains a failure that follows."""
    import paramiko

    try:
        paramiko.PKey.from_path(path)
    except (paramiko.PasswordRequiredException, TypeError):  # TypeError: cryptography's "password-protected"
        return True
    except FileNotFoundError:
        raise AuthFailed(f"identity file {path} does not exist (check target.identity_file)", host=label) from None
    except OSError as e:
        raise AuthFailed(f"identity file {path}: {e.strerror or e}", host=label) from None
    except (paramiko.SSHException, ValueError) as e:
        raise AuthFailed(f"identity file {path} is not a usable private key: {e}", host=label) from None
    return False


def encrypted_key_error(encrypted: list[str], user: str, label: str) -> AuthFailed:
    """Authentication failed and the only usable keys are passphrase-protected: say how to unlock them."""
    keys = " ".join(encrypted)
    add = shlex.join(["ssh-add", *encrypted])  # safe to paste whatever the paths hold (spaces, quotes, $)
    if not os.environ.get("SSH_AUTH_SOCK"):
        why = "no ssh-agent is running (SSH_AUTH_SOCK is unset)"
        todo = f"run `eval \"$(ssh-agent)\"` then `{add}`"
    else:
        why = "the ssh-agent does not hold it"
        todo = f"run `{add}`"
    return AuthFailed(f"authentication as {user} failed: identity file {keys} is encrypted and {why}; {todo} "
                      f"(deployer never asks for passphrases)", host=label)


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
