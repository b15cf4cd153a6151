"""Reading profile files: YAML with line numbers, `extends:` layering, `${VAR}` expansion, `--set` overrides.

The output is a validated `Profile`; every problem becomes one `ProfileError` that names the file, the line and
the field, with a "did you mean" for misspelt keys. Files are read and parsed within bounds (deployer.profile.bounded:
size, kind of file, nesting, nodes with aliases expanded, number lengths), and `extends:` stays inside the folder of
the profile named on the command line.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from deployer.errors import ProfileError, ProfileProblems
from deployer.profile.bounded import Budget, parse, parse_value, read_text
from deployer.host import parse_host
from deployer.profile.model import Profile, UnsetVar
from deployer.secrets import remember
from deployer.local.settings import KEYS, from_env, load_config

Loc = tuple[Any, ...]
VAR_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
MAX_LAYERS = 16  # files in one extends chain
MAX_SHOWN = 20   # problems listed one per line by validate; the rest counted
# allow_unset for the commands that only read a deployment (status, logs, history): at 3 a.m. nobody has
# HF_TOKEN exported, and those commands never use the engine's values; a `${VAR}` anywhere else stays an error.
READ_ONLY = ("engine.",)


@dataclass
class Layered:
    """Raw profile data with, for every key path, the file and line it came from."""

    data: dict[str, Any]
    lines: dict[Loc, tuple[str, int]] = field(default_factory=dict)
    templates: dict[str, str] = field(default_factory=dict)  # dotted path -> text with ${VAR}, as written
    unset: list[UnsetVar] = field(default_factory=list)
    unexpanded: set[str] = field(default_factory=set)  # texts left as written because a ${VAR} is not set
    files: list[Path] = field(default_factory=list)  # every file read (extends chain), resolved, base first


def load(path: Path, *, overrides: list[str], host: str | None, environ: dict[str, str] | None,
         allow_unset: bool | tuple[str, ...] = False) -> Profile:
    """allow_unset: an unset `${VAR}` is left as written and listed in `profile.unset` (validate, render); a tuple
    of field prefixes allows it only under those (`("engine.",)`: the on-call reads never use the engine's values,
    but they do need the target's)."""
    layered = _layered(path, overrides, host, environ, allow_unset)
    return _finish(_validate(layered, str(path)), layered, path)


def _layered(path: Path, overrides: list[str], host: str | None, environ: dict[str, str] | None,
             allow_unset: bool | tuple[str, ...]) -> Layered:
    """The profile's data as `load` validates it: layers merged, `${VAR}`s expanded, --set, defaults, --host."""
    env = dict(os.environ if environ is None else environ)
    root = path.absolute().parent.resolve()
    layered = _load_layers(path, stack=[], root=root, budget=Budget())
    _expand_vars(layered, env, allow_unset)
    for text in overrides:
        _apply_override(layered, text)
    _apply_defaults(layered, env)
    if host:
        _apply_host(layered, host)
        layered.lines[("target", "host")] = ("--host", 0)
    layered.data.pop("extends", None)
    return layered


def _finish(profile: Profile, layered: Layered, path: Path) -> Profile:
    profile._source = path.resolve()
    profile._templates = dict(layered.templates)
    profile._unset = list(layered.unset)
    profile._files = list(layered.files)
    profile._lines = {_dotted(_secret_loc(loc)): at for loc, at in layered.lines.items() if loc}
    remember(v for v in profile.secret_values() if v not in layered.unexpanded)
    return profile


STAND_IN_NAME = "engine-only"  # what engine_only puts where the profile's own name, target... do not validate
STAND_IN_HOST = "stand-in-host"
STAND_IN_MODEL = "stand-in/model"


def engine_only(path: str | Path, *, overrides: list[str] | None = None, host: str | None = None,
                environ: dict[str, str] | None = None) -> Profile | None:
    """The profile's engine section under a stand-in name and target, for `validate` to check engine.args when
    other parts of the profile do not validate (so one run lists schema and flag problems together). An engine key
    with a problem of its own (not kind, not args) is left out; None when the section still does not validate.
    Never for deploying: its name and target are stand-ins."""
    file = Path(path)
    try:
        layered = _layered(file, overrides or [], host, environ, allow_unset=True)
    except ProfileError:
        return None
    engine = layered.data.get("engine")
    if not isinstance(engine, dict):
        return None
    engine = dict(engine)
    data = {"name": STAND_IN_NAME, "target": {"host": STAND_IN_HOST}, "engine": engine}
    for _ in range(2):  # once as written, once without the engine keys that failed
        try:
            return _finish(Profile.model_validate(data), layered, file)
        except ValidationError as exc:
            broken = {err["loc"][1] for err in exc.errors() if len(err["loc"]) > 1 and err["loc"][0] == "engine"}
            if not broken or broken & {"kind", "args"}:
                return None
            for key in broken:
                engine.pop(key, None)
            engine.setdefault("model_path", STAND_IN_MODEL)  # the one required key: missing or misspelt
    return None


# --- YAML with lines -------------------------------------------------------------------------------------------


def _parse_yaml(path: Path, budget: Budget) -> Layered:
    file = str(path)
    node, data = parse(read_text(path, budget), file, budget)
    if data is None:
        raise ProfileError("file is empty", file=file)
    if not isinstance(data, dict):
        raise ProfileError("a profile must be a YAML mapping (name:, target:, engine: ...)", file=file, line=1)
    lines: dict[Loc, tuple[str, int]] = {}
    assert node is not None
    _record_lines(node, (), file, lines)
    return Layered(data=data, lines=lines, files=[path.resolve()])


def _record_lines(node: yaml.Node, loc: Loc, file: str, lines: dict[Loc, tuple[str, int]]) -> None:
    lines.setdefault(loc, (file, node.start_mark.line + 1))
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise ProfileError(f"duplicate key {key!r}", file=file, line=key_node.start_mark.line + 1,
                                   field=_dotted(loc) or None)
            seen.add(key)
            lines[loc + (key,)] = (file, key_node.start_mark.line + 1)
            _record_lines(value_node, loc + (key,), file, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _record_lines(item, loc + (index,), file, lines)


# --- extends ---------------------------------------------------------------------------------------------------


def _load_layers(path: Path, stack: list[Path], root: Path, budget: Budget) -> Layered:
    """`path` and the chain of files it extends, base first. Every file of the chain lies inside `root` (the folder
    of the profile named on the command line) and all of them share one budget of bytes and nodes."""
    resolved = path.resolve()
    if resolved in stack:
        chain = " -> ".join(p.name for p in stack + [resolved])
        raise ProfileError(f"extends loop: {chain}", file=str(path))
    if len(stack) >= MAX_LAYERS:
        raise ProfileError(f"extends chain longer than {MAX_LAYERS} files", file=str(path))
    layer = _parse_yaml(path, budget)
    base_name = layer.data.get("extends")
    if base_name is None:
        return layer
    base_path = _extends_path(path, base_name, root, _line(layer, ("extends",)))
    base = _load_layers(base_path, stack + [resolved], root, budget)
    base.data.pop("extends", None)
    return Layered(data=_merge(base.data, layer.data), lines={**base.lines, **layer.lines},
                   files=base.files + layer.files)


def _extends_path(path: Path, base_name: object, root: Path, line: int | None) -> Path:
    """The file `extends:` names: a relative path, from the folder of the file that says it, that stays inside
    `root` (no absolute path, no `..`, no symbolic link leading out). Refused before it is opened, so an error
    never shows anything of a file outside the profile's folder."""
    def refuse(why: str) -> ProfileError:
        return ProfileError(f"must be a relative file path inside the profile's folder ({root}); {why}",
                            file=str(path), line=line, field="extends")

    if not isinstance(base_name, str) or not base_name:
        raise refuse("it is not a file name")
    written = PurePosixPath(base_name)
    if written.is_absolute() or base_name.startswith("~"):
        raise refuse(f"{base_name!r} is not relative")
    if ".." in written.parts:
        raise refuse(f"{base_name!r} goes up with '..'")
    base_path = path.parent / base_name
    if not base_path.exists():
        raise ProfileError(f"extends file not found: {base_path}", file=str(path), line=line, field="extends")
    if not base_path.resolve().is_relative_to(root):
        raise refuse(f"{base_name!r} leads outside it through a symbolic link")
    return base_path


def as_written(path: Path) -> dict[str, Any]:
    """The profile file's data as written, the files it extends merged under it (no `${VAR}` expanded, no defaults,
    no `extends:` left), read within the same bounds as `load`."""
    layered = _load_layers(path, stack=[], root=path.absolute().parent.resolve(), budget=Budget())
    layered.data.pop("extends", None)
    return layered.data


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


# --- ${VAR} and overrides --------------------------------------------------------------------------------------


def _expand_vars(layered: Layered, env: dict[str, str], allow_unset: bool | tuple[str, ...]) -> None:
    def allowed(loc: Loc) -> bool:
        if isinstance(allow_unset, tuple):
            return _dotted(loc).startswith(allow_unset)
        return allow_unset

    def expand(value: Any, loc: Loc) -> Any:
        if isinstance(value, dict):
            return {k: expand(v, loc + (k,)) for k, v in value.items()}
        if isinstance(value, list):
            return [expand(v, loc + (i,)) for i, v in enumerate(value)]
        if not isinstance(value, str) or "$" not in value:
            return value
        text, used, missing = expand_template(value, env)
        if missing and not allowed(loc):
            file, line = layered.lines.get(loc, (None, None))
            raise ProfileError(f"${{{missing[0]}}} is not set in the local environment", file=file, line=line,
                               field=_dotted(loc))
        if used or missing:
            layered.templates[_dotted(_secret_loc(loc))] = value
        if missing:
            layered.unexpanded.add(value)
        for name in missing:
            file, line = layered.lines.get(loc, (None, None))
            layered.unset.append(UnsetVar(name, _dotted(loc), file, line))
        return value if missing else text

    layered.data = expand(layered.data, ())


def expand_template(text: str, env: dict[str, str]) -> tuple[str, list[str], list[str]]:
    """`${VAR}` and `$$` expanded from `env`: (text, names used, names not set)."""
    used: list[str] = []
    missing: list[str] = []

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        if name not in env:
            missing.append(name)
            return match.group(0)
        used.append(name)
        return env[name]

    return VAR_RE.sub(sub, text), used, missing


def _secret_loc(loc: Loc) -> Loc:
    """Flag names are normalised by the schema (`--tp-size` -> tp_size); their paths follow."""
    if len(loc) >= 3 and loc[:2] == ("engine", "args"):
        return loc[:2] + (str(loc[2]).lstrip("-").replace("-", "_"),) + loc[3:]
    return loc


def _apply_override(layered: Layered, text: str) -> None:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ProfileError(f"--set {text!r}: expected KEY=VALUE like engine.args.tp_size=2", file="--set")
    parts = key.strip().split(".")
    value = parse_value(raw, "--set") if raw.strip() else ""
    node = layered.data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ProfileError(f"--set {key}: {'.'.join(parts[:i + 1])} is not a mapping", file="--set")
        node = child
    node[parts[-1]] = value
    layered.lines[tuple(parts)] = ("--set", 0)
    path = _dotted(_secret_loc(tuple(parts)))
    for old in [p for p in layered.templates if p == path or p.startswith(path + ".")]:
        del layered.templates[old]  # a value given on the command line replaces the ${VAR} one


def _apply_host(layered: Layered, text: str) -> None:
    """`--host [user@]host[:port]` replaces the profile's target host (and user/port when given)."""
    target = layered.data.setdefault("target", {})
    if not isinstance(target, dict):
        raise ProfileError("target: must be a mapping", file="--host")
    try:
        user, host, port = parse_host(text)
    except ValueError as exc:
        raise ProfileError(str(exc), file="--host") from None
    target["host"] = host
    if user:
        target["user"] = user
    if port is not None:
        target["port"] = port


def with_host(profile: Profile, text: str) -> Profile:
    """A single-host profile already loaded, with `--host [user@]host[:port]` applied as `load_profile(host=...)`
    applies it (host, and user/port when given), without reading the file again."""
    try:
        user, host, port = parse_host(text)
    except ValueError as exc:
        raise ProfileError(str(exc), file="--host") from None
    data: dict[str, Any] = {**profile.target.model_dump(exclude_unset=True), "host": host}
    if user:
        data["user"] = user
    if port is not None:
        data["port"] = port
    try:
        target = type(profile.target).model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"target: {exc.errors()[0]['msg']}", file="--host") from None
    moved = profile.model_copy(update={"target": target})   # its private attributes (source, secrets) kept
    moved._lines = {**profile._lines, "target.host": ("--host", 0)}  # where the host came from, as load says
    return moved


def _apply_defaults(layered: Layered, env: dict[str, str]) -> None:
    """The user's defaults (deployer.local.settings): the environment's over the profile's values, the config file's
    under them; each recorded as where that value came from (`deploy config`, and the file:line of a problem)."""
    data = layered.data
    config = load_config(env)
    for key in KEYS:
        loc = tuple(key.field.split("."))
        if key.name != "engine_python" and ("replicas" in data or "nodes" in data):
            continue  # a fleet or node group names its hosts and workdirs per member
        parent = data.get(loc[0])
        if parent is not None and not isinstance(parent, dict):
            continue  # the validation says what is wrong with it
        if key.name == "engine_python" and isinstance(parent, dict) and "install" in parent:
            continue  # a managed environment's python is deployer's to choose
        if layered.lines.get(loc, ("",))[0] == "--set":
            continue
        value = from_env(key.name, env)
        if value is not None:
            _set_default(layered, loc, value, (f"env {key.env}", 0))
        elif key.name in config.values and (parent is None or loc[1] not in parent):
            _set_default(layered, loc, config.values[key.name], (str(config.path), config.lines[key.name]))


def _set_default(layered: Layered, loc: Loc, value: str, origin: tuple[str, int]) -> None:
    if loc == ("target", "host"):
        _apply_host(layered, value)
    else:
        layered.data.setdefault(loc[0], {})[loc[1]] = value
    layered.lines[loc] = origin


# --- validation ------------------------------------------------------------------------------------------------


def _validate(layered: Layered, path: str) -> Profile:
    """Every problem pydantic finds, not only the first: unknown keys first, then in file order, each with its
    file:line and a did-you-mean (a missing required key names the unknown key that looks like it)."""
    try:
        return Profile.model_validate(layered.data)
    except ValidationError as exc:
        problems = _problems(layered, exc.errors(), path)
        if len(problems) == 1:
            raise problems[0] from None
        if len(problems) > MAX_SHOWN:
            more = ProfileError(f"... and {len(problems) - MAX_SHOWN} more problems", file=path)
            problems = problems[:MAX_SHOWN] + [more]
        raise ProfileProblems(problems, file=path) from None


def _problems(layered: Layered, errors: list[Any], path: str) -> list[ProfileError]:
    unknown: dict[Loc, list[str]] = {}  # parent loc -> the unknown keys written there
    for err in errors:
        if err["type"] == "extra_forbidden":
            loc = _clean_loc(layered.data, tuple(err["loc"]))
            unknown.setdefault(loc[:-1], []).append(str(loc[-1]))
    found: dict[Loc, tuple[tuple[int, str, int, int], list[str]]] = {}  # loc -> (sort key, messages)
    for index, err in enumerate(errors):
        loc = _clean_loc(layered.data, tuple(err["loc"]))
        message, at = _message(err, loc, unknown.get(loc[:-1], []), layered)
        file, line = at or _where(layered, loc, path)
        order = (0 if err["type"] == "extra_forbidden" else 1, file, line or 0, index)
        if loc in found:
            if message not in found[loc][1]:
                found[loc][1].append(message)  # a union's branches: "a valid list or a valid integer"
            continue
        found[loc] = (order, [message])
    out = []
    for loc, (order, messages) in sorted(found.items(), key=lambda item: item[1][0]):
        file, line = order[1], order[2] or None
        out.append(ProfileError(" or ".join(messages), file=file, line=line, field=_dotted(loc) or None))
    return out


def _clean_loc(data: Any, loc: Loc) -> Loc:
    """pydantic's location without its union branch tags (`replicas.list[Replica].0.host` -> replicas.0.host):
    the parts that are keys or indices of the data, and the last part (a missing or unknown key)."""
    out: list[Any] = []
    node = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out.append(part)
            node = node[part]
        elif last and isinstance(node, dict) and isinstance(part, str):
            out.append(part)
        # else: a branch tag (`list[Replica]`, `int`, `function-after[...]`), not a place in the file
    return tuple(out)


def _message(err: Any, loc: Loc, unknown_here: list[str],
             layered: Layered) -> tuple[str, tuple[str, int | None] | None]:
    """The problem's text, and where to point when that is better than the field's own place (a missing key that
    was written misspelt: the misspelling's line)."""
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        known = _known_fields(loc[:-1])
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        suggestion = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown key {key!r}{suggestion}; known keys: {', '.join(sorted(known))}", None
    if kind == "missing":
        key = str(loc[-1]) if loc else ""
        close = difflib.get_close_matches(key, unknown_here, n=1, cutoff=0.6)
        if close:
            hit = layered.lines.get(loc[:-1] + (close[0],))
            where = f" at line {hit[1]}" if hit and hit[1] else ""
            return (f"required field is missing ({close[0]!r}{where} looks like a misspelling of it)",
                    (hit[0], hit[1] or None) if hit else None)
        return "required field is missing", None
    msg = str(err["msg"])
    return (msg[len("Value error, "):] if msg.startswith("Value error, ") else msg), None


def _known_fields(loc: Loc) -> list[str]:
    model: type[BaseModel] = Profile
    for part in loc:
        info = model.model_fields.get(str(part))
        annotation = info.annotation if info else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _where(layered: Layered, loc: Loc, path: str) -> tuple[str, int | None]:
    for end in range(len(loc), -1, -1):
        hit = layered.lines.get(loc[:end])
        if hit:
            return hit[0], hit[1] or None
    return path, None


def _line(layered: Layered, loc: Loc) -> int | None:
    hit = layered.lines.get(loc)
    return hit[1] if hit else None


def _dotted(loc: Loc) -> str:
    return ".".join(str(p) for p in loc)


def load_profile(
    path: str | Path,
    *,
    overrides: list[str] | None = None,
    host: str | None = None,
    environ: dict[str, str] | None = None,
    allow_unset: bool | tuple[str, ...] = False,
) -> Profile:
    """Load, layer, expand and validate a profile file. Raises ProfileError.

    allow_unset: an unset `${VAR}` is a warning (`profile.unset`), not an error; for validate and render, which
    never need secret values. Everything that starts an engine loads without it.
    """
    return load(Path(path), overrides=overrides or [], host=host, environ=environ, allow_unset=allow_unset)
