"""Putting the real secret values back into a recorded run's profile (restart, rollback).

A run's profile.json holds its profile with every secret masked (`***`), plus the `${VAR}` text each
`${VAR}`-sourced value was written as. The real value of each masked field comes from the run's 0600 env file
on the target while it is kept (see retention), else from the local environment through its `${VAR}` text;
when neither has it, the restore refuses with one line that names what is missing. Nothing is ever started
with a `***` in place of a value.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from deployer.engines.registry import engine_for, kinds
from deployer.errors import NotFound, ProfileError, RecordUnreadable
from deployer.remote.base import Remote
from deployer.secrets import MASK, SECRET_ENV_PREFIX, is_secret_env_name, remember, secret_var
from deployer.supervisor.base import SuperviseError, parse_env_text


class SecretUnavailable(ProfileError):
    """A secret of the recorded run is neither in its env file on the target nor settable from here (exit 2)."""


def learn_secrets(remote: Remote, env_path: str, record: dict[str, Any]) -> None:
    """Remember the secret values of a run (its env file) so that engine text shown from it is masked."""
    learn_env(read_env_file(remote, env_path), record)


def learn_env_text(text: str | None, record: Mapping[str, Any], path: str = "env") -> None:
    """learn_secrets for an env file's text already fetched (None: gone); a damaged one teaches nothing."""
    try:
        env = parse_env_text(text, path) if text is not None else None
    except SuperviseError:
        env = None
    learn_env(env, record)


def learn_env(env: dict[str, str] | None, record: Mapping[str, Any]) -> None:
    """Remember the values of `env` that are secrets: masked in the run's record, or secret by their name."""
    masked = {k for k, v in (record.get("env") or {}).items() if v == MASK}
    remember(v for k, v in (env or {}).items()
             if k in masked or k.startswith(SECRET_ENV_PREFIX) or is_secret_env_name(k))


def read_env_file(remote: Remote, path: str, run_id: str | None = None) -> dict[str, str] | None:
    """A run's env file as {NAME: value}; None when it is gone (pruned). A damaged one is None as well, unless
    `run_id` is given (a restore, which must not guess): then one RecordUnreadable line naming the run."""
    try:
        text = remote.read(path, 0, 1 << 20).decode("utf-8", "replace")
    except NotFound:
        return None
    try:
        return parse_env_text(text, path)
    except SuperviseError as exc:
        if run_id is None:
            return None
        raise RecordUnreadable(f"run {run_id}: {exc}") from None


class Restorer:
    """Real values for the masked fields of one recorded run."""

    def __init__(self, run_id: str, env_file: dict[str, str] | None, templates: Mapping[str, str],
                 environ: Mapping[str, str] | None = None) -> None:
        self.run_id = run_id
        self.env_file = env_file
        self.templates = dict(templates)
        self.environ = dict(os.environ if environ is None else environ)

    def engine(self, engine: dict[str, Any]) -> dict[str, Any]:
        """The recorded engine section with every *** replaced by its real value (or SecretUnavailable)."""
        out = dict(engine)
        out["env"] = {k: self._value(f"engine.env.{k}", k) if v == MASK else v
                      for k, v in (engine.get("env") or {}).items()}
        kind = engine.get("kind")
        launch = engine_for(kind).launch if isinstance(kind, str) and kind in kinds() else None
        out["args"] = {k: self._arg(k, v, launch.secret_env_var(k) if launch else None)
                       for k, v in (engine.get("args") or {}).items()}
        return out

    def _arg(self, name: str, value: Any, engine_var: str | None = None) -> Any:
        """`engine_var`: the engine's own variable for this credential (Launch.secret_env), where render put it."""
        path = f"engine.args.{name}"
        if value == MASK:
            held = engine_var if engine_var and engine_var in (self.env_file or {}) else secret_var(name)
            return self._value(path, held)
        if isinstance(value, list) and MASK in value:
            return [self._value(f"{path}.{i}", secret_var(name, i)) if item == MASK else item
                    for i, item in enumerate(value)]
        if isinstance(value, dict) and _has_mask(value):
            whole = (self.env_file or {}).get(secret_var(name))
            if whole is not None:
                remember([whole])
                return json.loads(whole)
            return self._leaves(value, path)
        return value

    def _leaves(self, value: Any, path: str) -> Any:
        if value == MASK:
            return self._value(path, None)
        if isinstance(value, dict):
            return {k: self._leaves(v, f"{path}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [self._leaves(v, f"{path}.{i}") for i, v in enumerate(value)]
        return value

    def _value(self, path: str, env_name: str | None) -> str:
        if self.env_file is not None and env_name is not None and env_name in self.env_file:
            value = self.env_file[env_name]
            remember([value])
            return value
        where = f"the env file of run {self.run_id} is gone from the target" if self.env_file is None else \
            f"the env file of run {self.run_id} has no {env_name or path}"
        template = self.templates.get(path)
        if template is None:
            raise SecretUnavailable(f"{path}: {where}, and the profile wrote this secret literally (not as ${{VAR}})",
                                    hint="deploy the profile again with `deploy up PROFILE`")
        from deployer.profile.loader import expand_template  # here: `status` learns secrets without the loader

        text, _, missing = expand_template(template, self.environ)
        if missing:
            raise SecretUnavailable(f"{path}: {where}, and ${{{missing[0]}}} is not set here",
                                    hint=f"export {missing[0]} and run again")
        remember([text])
        return text


def _has_mask(value: Any) -> bool:
    if value == MASK:
        return True
    if isinstance(value, dict):
        return any(_has_mask(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_mask(v) for v in value)
    return False
