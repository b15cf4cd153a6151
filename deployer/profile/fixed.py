"""`--save-fixed PATH`: write the profile that worked: the user's file plus what `up` changed.

The user's own file is the base (not the merged, expanded profile), so `extends:` and `${VAR}` references stay
as written and no secret is ever written out. What changed is the difference between the profile as loaded and
the profile that reached ready: healing's remedies and preflight's flag translations alike.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from deployer.flag_names import key_option
from deployer.profile.bounded import Budget, parse, read_text
from deployer.profile.loader import as_written
from deployer.profile.model import Profile


def profile_diff(before: Profile, after: Profile) -> dict[str, dict[str, Any]]:
    """{"args": {flag: value or None}, "env": {NAME: value or None}}; secret env values are never included."""
    diff: dict[str, dict[str, Any]] = {"args": {}, "env": {}}
    secret = before.secret_env_keys() | after.secret_env_keys()
    for key, old, new in (("args", before.engine.args, after.engine.args), ("env", before.engine.env,
                                                                            after.engine.env)):
        for name in sorted(set(old) | set(new)):
            if key == "env" and name in secret:
                continue
            if name not in new:
                diff[key][name] = None
            elif old.get(name) != new[name] or name not in old:
                diff[key][name] = after.written_arg(name, new[name]) if key == "args" else new[name]
    return diff


def save_fixed(source: Path, before: Profile, after: Profile, reasons: list[str], dest: Path, *,
               by: str = "deploy up --save-fixed", engine_fields: dict[str, Any] | None = None) -> None:
    """`engine_fields`: engine keys written as given, None removes one (`deploy upgrade`: version, install)."""
    data = _written(source, dest)
    engine = data.setdefault("engine", {})
    for name, value in (engine_fields or {}).items():
        engine.pop(name, None) if value is None else engine.__setitem__(name, value)
    diff = profile_diff(before, after)
    _apply(engine.setdefault("args", {}), diff["args"])
    _apply(engine.setdefault("env", {}), diff["env"])
    for key in ("args", "env"):
        if not engine.get(key):
            engine.pop(key, None)
    header = f"# Written by `{by}` from {source.name}. Changes: {'; '.join(reasons) or 'none'}\n"
    dest.write_text(header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")


def _written(source: Path, dest: Path) -> dict[str, Any]:
    """The user's file as written (read within the loader's bounds). Its `extends:` is respelt from dest's folder
    when the base lies inside that folder; otherwise (a profile may only extend files inside its own folder) the
    files it extends are merged in as written, so the saved profile loads on its own."""
    budget = Budget()
    data = parse(read_text(source, budget), str(source), budget)[1]
    data = data if isinstance(data, dict) else {}
    if isinstance(data.get("extends"), str):
        base = os.path.relpath((source.parent / data["extends"]).resolve(), dest.resolve().parent)
        if ".." in PurePosixPath(base).parts:
            return as_written(source)
        data["extends"] = base
    return data


def _apply(mapping: dict[str, Any], updates: dict[str, Any]) -> None:
    for key, value in updates.items():
        for spelling in (key_option(key)[2:], key_option(key), "--" + key):
            mapping.pop(spelling, None)  # the user may have written another form of the flag
        if value is None:
            mapping.pop(key, None)
        else:
            mapping[key] = value
