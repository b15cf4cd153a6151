"""Deployment profiles: the Pydantic model (strict, `extra="forbid"`) and loading from YAML.

Loading layers `extends:` files, expands `${VAR}` from the local environment, applies CLI overrides
(`--set a.b=c`, `--host`) and validates. Every failure is a `ProfileError` naming file, line and field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

ArgScalar = Union[bool, int, float, str]
ArgValue = Union[ArgScalar, list[ArgScalar], dict[str, Any], None]

NAME_RE = r"^[a-z0-9][a-z0-9-]*$"
FLAG_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_KEY_RE = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
# Flags the profile sets through dedicated fields; giving them in `args` too would be ambiguous.
RESERVED_ARGS = {"model_path": "engine.model_path", "port": "engine.port", "host": "engine.host"}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=False)


class Target(Strict):
    host: str = Field(min_length=1, description='hostname, ~/.ssh/config alias, or "local"')
    user: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None
    workdir: str = Field(default="/workspace/deployer", min_length=1)

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not (v.startswith("/") or v.startswith("~")):
            raise ValueError("must be an absolute path (or start with ~)")
        if "\x00" in v or "\n" in v:
            raise ValueError("must not contain NUL or newline")
        return v.rstrip("/") or "/"


class Engine(Strict):
    kind: Literal["sglang", "vllm"] = "sglang"
    python: str = Field(default="python3", min_length=1, description="interpreter that has the engine installed")
    model_path: str = Field(min_length=1)
    host: str = "127.0.0.1"
    port: int = Field(default=30000, ge=1, le=65535)
    gpus: list[int] | None = None
    version: str | None = Field(default=None, description="expected engine version (checked by preflight)")
    args: dict[str, ArgValue] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (any(g < 0 for g in v) or len(set(v)) != len(v)):
            raise ValueError("GPU indices must be distinct and >= 0")
        return v

    @field_validator("args", mode="before")
    @classmethod
    def _args(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            raise ValueError("must be a mapping of flag name to value")
        out: dict[str, Any] = {}
        for key, value in v.items():
            key = str(key)
            if key.startswith("--"):
                key = key[2:]
            if not FLAG_KEY_RE.match(key):
                raise ValueError(f"bad flag name {key!r} (use snake_case like tp_size)")
            snake = key.replace("-", "_")
            if snake in out:
                raise ValueError(f"flag {snake!r} is given twice (as {snake} and {key})")
            if snake in RESERVED_ARGS:
                raise ValueError(f"set {RESERVED_ARGS[snake]} instead of args.{snake}")
            _check_text(value, f"args.{snake}")
            out[snake] = value
        return out

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            raise ValueError("must be a mapping of NAME to value")
        out: dict[str, str] = {}
        for key, value in v.items():
            if not isinstance(key, str) or not ENV_KEY_RE.match(key):
                raise ValueError(f"bad environment variable name {key!r}")
            if isinstance(value, bool):
                value = "1" if value else "0"
            if isinstance(value, (int, float)):
                value = str(value)
            if not isinstance(value, str):
                raise ValueError(f"{key}: value must be a string")
            _check_text(value, f"env.{key}")
            out[key] = value
        return out


def _check_text(value: Any, where: str) -> None:
    """Values end up in argv or the environment, where NUL cannot exist."""
    if isinstance(value, str) and "\x00" in value:
        raise ValueError(f"{where}: NUL character is not allowed")
    if isinstance(value, list):
        for item in value:
            _check_text(item, where)


class Health(Strict):
    path: str = Field(default="/health", pattern=r"^/[\x21-\x7e]*$")
    interval_s: float = Field(default=2.0, gt=0, le=300)
    startup_timeout_s: float = Field(default=1800.0, gt=0)
    stall_timeout_s: float = Field(default=600.0, gt=0)
    request_timeout_s: float = Field(default=5.0, gt=0, le=120)


class Retry(Strict):
    max_attempts: int = Field(default=3, ge=1, le=20)
    heal: bool = True
    backoff_s: float = Field(default=2.0, ge=0, le=600, description="wait before retrying a transient failure")


class Restart(Strict):
    policy: Literal["no", "on-failure", "always"] = "no"
    max: int = Field(default=5, ge=0, le=1000)
    backoff_s: tuple[float, float] = (10.0, 300.0)
    window_s: float = Field(default=600.0, gt=0)
    grace_s: float = Field(default=30.0, ge=0, le=3600, description="SIGTERM to SIGKILL on stop")

    @field_validator("backoff_s")
    @classmethod
    def _backoff(cls, v: tuple[float, float]) -> tuple[float, float]:
        if v[0] < 0 or v[1] < v[0]:
            raise ValueError("backoff_s must be [min, max] with 0 <= min <= max")
        return v


class Profile(Strict):
    name: str = Field(pattern=NAME_RE, max_length=63)
    extends: str | None = Field(default=None, description="profile file layered under this one (relative path)")
    template: str | None = Field(default=None, description="launch script template (relative to the profile)")
    target: Target
    engine: Engine
    health: Health = Field(default_factory=Health)
    retry: Retry = Field(default_factory=Retry)
    restart: Restart = Field(default_factory=Restart)

    # Not part of the schema: where the profile came from and which env values are secret.
    _source: Path | None = PrivateAttr(default=None)
    _secret_env: frozenset[str] = PrivateAttr(default=frozenset())
    _secret_args: frozenset[str] = PrivateAttr(default=frozenset())

    @model_validator(mode="after")
    def _stall_vs_startup(self) -> Profile:
        if self.health.stall_timeout_s > self.health.startup_timeout_s:
            self.health.stall_timeout_s = self.health.startup_timeout_s
        return self

    @property
    def source(self) -> Path | None:
        return self._source

    def secret_env_keys(self) -> frozenset[str]:
        """Env keys whose values must never be shown: secret-looking names and `${VAR}`-sourced values."""
        looks_secret = {k for k in self.engine.env if SECRET_KEY_RE.search(k)}
        return frozenset(looks_secret) | self._secret_env

    def secret_arg_keys(self) -> frozenset[str]:
        """Flags whose values are secret (api_key, ...; `${VAR}`-sourced): passed via the env file, not launch.sh."""
        looks_secret = {k for k in self.engine.args if SECRET_KEY_RE.search(k)}
        return frozenset(looks_secret) | self._secret_args

    def patched(self, *, args: dict[str, Any] | None = None, env: dict[str, str | None] | None = None) -> Profile:
        """A copy with engine args/env changed; a value of None removes the key."""
        new_args = dict(self.engine.args)
        for key, value in (args or {}).items():
            if value is None:
                new_args.pop(key, None)
            else:
                new_args[key] = value
        new_env = dict(self.engine.env)
        for key, text in (env or {}).items():
            if text is None:
                new_env.pop(key, None)
            else:
                new_env[key] = text
        engine = self.engine.model_copy(update={"args": new_args, "env": new_env})
        copy = self.model_copy(update={"engine": engine})
        copy._source = self._source
        copy._secret_env = self._secret_env
        copy._secret_args = self._secret_args
        return copy

    def public_dict(self) -> dict[str, Any]:
        """The profile as plain data with secret env values masked (safe to print or store)."""
        data = self.model_dump(mode="json")
        secret = self.secret_env_keys()
        data["engine"]["env"] = {k: ("***" if k in secret else v) for k, v in self.engine.env.items()}
        hidden = self.secret_arg_keys()
        data["engine"]["args"] = {k: ("***" if k in hidden and v not in (None, True, False) else v)
                                  for k, v in self.engine.args.items()}
        return data


def load_profile(
    path: str | Path,
    *,
    overrides: list[str] | None = None,
    host: str | None = None,
    environ: dict[str, str] | None = None,
) -> Profile:
    """Load, layer, expand and validate a profile file. Raises ProfileError."""
    from deployer.profile_loader import load

    return load(Path(path), overrides=overrides or [], host=host, environ=environ)
