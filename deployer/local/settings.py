"""The user's defaults: a config file and environment variables for the default host, workdir and engine python,
and where each effective value comes from (`deploy config`).

The file is `$XDG_CONFIG_HOME/deployer/config.yaml` (default `~/.config/deployer/config.yaml`; `DEPLOYER_CONFIG`
names another), a flat mapping:

    host: gpu-box                    # [USER@]HOST[:PORT] or an ~/.ssh/config alias
    workdir: /workspace/deployer
    engine_python: /opt/venv/bin/python

Precedence, strongest first: the command line (`--host`, `--workdir`, `--set`), the environment (`DEPLOYER_HOST`,
`DEPLOYER_WORKDIR`, `DEPLOYER_ENGINE_PYTHON`), the profile, this file, the built-in default. A bad file is one
ProfileError naming file:line (exit 2); a missing file is no defaults.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from deployer.errors import ProfileError

if TYPE_CHECKING:
    import yaml

CONFIG_ENV = "DEPLOYER_CONFIG"
MAX_BYTES = 64 << 10


@dataclass(frozen=True)
class Key:
    """One default: its name in the file, its environment variable, the profile field it fills, built-in value."""

    name: str
    env: str
    field: str
    builtin: str | None


KEYS: tuple[Key, ...] = (
    Key("host", "DEPLOYER_HOST", "target.host", None),
    Key("workdir", "DEPLOYER_WORKDIR", "target.workdir", "/workspace/deployer"),
    Key("engine_python", "DEPLOYER_ENGINE_PYTHON", "engine.python", "python3"),
)
BY_NAME = {key.name: key for key in KEYS}


@dataclass(frozen=True)
class Config:
    """The config file's values, each with its line (an absent file: no values)."""

    path: Path
    values: dict[str, str] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    digest: str | None = None

    def where(self, name: str) -> str:
        return f"{self.path}:{self.lines[name]}"


@dataclass(frozen=True)
class Setting:
    """An effective value and where it came from ("--host", "env DEPLOYER_HOST", "profile FILE:LINE",
    "config FILE:LINE", "built-in", "local history")."""

    name: str
    value: str | None
    source: str

    def to_json(self) -> dict[str, str | None]:
        return {"name": self.name, "value": self.value, "source": self.source}


def config_path(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or ""
    root = Path(base).expanduser() if os.path.isabs(os.path.expanduser(base)) else Path("~/.config").expanduser()
    return root / "deployer" / "config.yaml"


def load_config(environ: dict[str, str] | None = None) -> Config:
    """The config file, checked: every key known, every value a non-empty string. Raises ProfileError."""
    path = config_path(environ)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return Config(path)
    except OSError as exc:
        raise ProfileError(f"cannot read the config file: {exc.strerror}", file=str(path)) from None
    if len(raw) > MAX_BYTES:
        raise ProfileError(f"config file too large ({len(raw)} bytes)", file=str(path))
    import yaml  # only for a config file that exists: a status connects before anything else imports YAML

    try:
        node = yaml.compose(raw.decode("utf-8"), Loader=yaml.SafeLoader)
    except UnicodeDecodeError:
        raise ProfileError("not a UTF-8 text file", file=str(path)) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise ProfileError(f"YAML syntax error: {exc.problem or exc.context}", file=str(path),
                           line=mark.line + 1 if mark else None) from None
    return _read(path, node, hashlib.sha256(raw).hexdigest())


def _read(path: Path, node: yaml.Node | None, digest: str) -> Config:
    import yaml  # imported by load_config, which calls this

    if node is None:
        return Config(path, digest=digest)
    if not isinstance(node, yaml.MappingNode):
        raise ProfileError("the config file must be a mapping of host, workdir, engine_python", file=str(path),
                           line=node.start_mark.line + 1)
    values: dict[str, str] = {}
    lines: dict[str, int] = {}
    for key_node, value_node in node.value:
        key, line = str(key_node.value), key_node.start_mark.line + 1
        if key not in BY_NAME:
            close = difflib.get_close_matches(key, list(BY_NAME), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(BY_NAME)})"
            raise ProfileError(f"unknown key {key!r}{hint}", file=str(path), line=line)
        if not isinstance(value_node, yaml.ScalarNode) or value_node.tag != "tag:yaml.org,2002:str" \
                or not str(value_node.value).strip():
            raise ProfileError(f"{key}: must be a non-empty string", file=str(path),
                               line=value_node.start_mark.line + 1)
        values[key], lines[key] = str(value_node.value).strip(), line
    return Config(path, values, lines, digest)


def from_env(name: str, environ: dict[str, str] | None = None) -> str | None:
    value = (os.environ if environ is None else environ).get(BY_NAME[name].env, "").strip()
    return value or None


def weak_default(name: str, config: Config) -> Setting:
    """Below the profile: the config file's value, else the built-in one."""
    if name in config.values:
        return Setting(name, config.values[name], f"config {config.where(name)}")
    return Setting(name, BY_NAME[name].builtin, "built-in")


def strong_default(name: str, cli: str | None, cli_label: str,
                   environ: dict[str, str] | None = None) -> Setting | None:
    """Above the profile: the command line's value, else the environment's; None when neither is set."""
    if cli:
        return Setting(name, cli, cli_label)
    env = from_env(name, environ)
    return Setting(name, env, f"env {BY_NAME[name].env}") if env else None
