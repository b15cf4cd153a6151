"""Rendering: `Profile` -> `Bundle` (launch script, env file, argv, content hash), and the router's bundle from its
words (`render_launch`). Pure: no I/O but templates (the profile's own, the engine's: `Launch.template`, in the
engine's package, or the router's: deployments/fleet/router_launch.sh.j2).

Every value that reaches shell text goes through `shq` (shlex.quote); secrets live only in the env file.
"""

from __future__ import annotations

import hashlib
import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import jinja2

from deployer import __version__
from deployer.errors import RenderError
from deployer.flag_names import key_option
from deployer.prepare.envspec import engine_python
from deployer.profile.model import Profile
from deployer.secrets import MASK, SECRET_ENV_PREFIX, secret_var

__all__ = ["Bundle", "EnvRef", "Word", "engine_argv", "engine_env", "render", "render_launch", "secret_var", "sh_word"]


@dataclass(frozen=True)
class EnvRef:
    """An argv word taken from the engine's environment at exec time: secret flag values stay out of launch.sh.

    `prefix` is literal text before the value in the same word (`--api-key=` for a value that starts with -).
    """

    name: str
    prefix: str = ""

    def __str__(self) -> str:
        return self.prefix + "${" + self.name + "}"


Word = Union[str, EnvRef]


def sh_word(word: Word) -> str:
    """Shell text for one argv word: quoted literal, or a quoted reference to an environment variable."""
    return f'"{word.prefix}${word.name}"' if isinstance(word, EnvRef) else shlex.quote(word)


@dataclass(frozen=True)
class Bundle:
    """What one attempt pushes to the target."""

    script: str                 # launch.sh
    env: str                    # env file: NAME='value' lines, bash- and shlex-parsable
    argv: list[str]             # the engine's argv for display: secret values shown as ${DEPLOYER_SECRET_...}
    words: list[Word]           # the same, as launch.sh passes it
    content_hash: str           # sha256 of script + env: same effective profile -> same hash
    env_names: list[str]        # names set in the env file (values never leave the bundle)
    masked_env: dict[str, str]  # the env with secret values replaced by ***, for display
    shim_words: list[Word] = field(default_factory=list)  # appended to the argv in memory (ARGV_SHIM): secret flags

    @property
    def short_hash(self) -> str:
        return self.content_hash[:12]


def flag_tokens(name: str, value: Any, false_prefix: str = "") -> list[Word]:
    """One profile arg as argv tokens: true -> bare flag, false/None -> nothing, list -> several values.

    `false_prefix` ("--no-" for an engine whose booleans are --x/--no-x): false is written as that form instead."""
    flag = key_option(name)
    if value is False and false_prefix:
        return [false_prefix + key_option(name)[2:]]
    if value is None or value is False:
        return []
    if value is True:
        return [flag]
    if isinstance(value, dict):
        return [flag, json.dumps(value, sort_keys=True)]
    if isinstance(value, list):
        return [flag, *(_scalar(v) for v in value)]
    text = _scalar(value)
    # "--flag -x" would make argparse read -x as an option; the = form keeps it a value.
    return [f"{flag}={text}"] if text.startswith("-") else [flag, text]


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def engine_argv(profile: Profile) -> list[Word]:
    return _engine_words(profile)[0]


def engine_env(profile: Profile) -> dict[str, str]:
    """The engine's environment: the profile's env, CUDA_VISIBLE_DEVICES, and the values of secret flags."""
    return _engine_words(profile)[1]


# launch.sh's program for an engine whose credentials are argv-only (Launch.secret_argv_shim): `python -c ARGV_SHIM
# MODULE ARGS...` takes the module's name off its argv, appends the secret flags' words (JSON in SECRET_ARGV_VAR:
# a literal word, or [prefix, variable] for a value from the env file) and runs the module as `-m` would. Changing
# sys.argv never changes /proc/PID/cmdline: other users see these words, never the values.
SECRET_ARGV_VAR = SECRET_ENV_PREFIX + "ARGV"
ARGV_SHIM = ("import json, os, runpy, sys; m = sys.argv.pop(1); sys.argv += [w if isinstance(w, str) else "
             "w[0] + os.environ[w[1]] for w in json.loads(os.environ.pop(" + repr(SECRET_ARGV_VAR) + ", '[]'))]; "
             "runpy.run_module(m, run_name='__main__', alter_sys=True)")


def _shimmed(profile: Profile) -> tuple[list[Word], dict[str, str], list[Word]]:
    """The launch words and env of an engine started through ARGV_SHIM, and the secret flags' words it appends."""
    hidden: list[Word] = []
    argv, env = _engine_words(profile, hidden)
    if not hidden:
        return argv, env, []
    env[SECRET_ARGV_VAR] = json.dumps([w if isinstance(w, str) else [w.prefix, w.name] for w in hidden])
    return [argv[0], "-c", ARGV_SHIM, *argv[2:]], env, hidden


def _engine_words(profile: Profile, hidden: list[Word] | None = None) -> tuple[list[Word], dict[str, str]]:
    engine = profile.engine
    launch = engine.definition.launch
    env = dict(profile.engine.env)
    if profile.engine.gpus is not None:
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(g) for g in profile.engine.gpus))
    # engine.install: the managed environment's python (`up` builds it there before it renders)
    argv: list[Word] = [engine_python(engine, profile.target.workdir), "-m", launch.module]
    argv += flag_tokens(launch.model_flag, engine.model_path)
    argv += flag_tokens("host", engine.host)
    argv += flag_tokens("port", engine.port)
    secret = profile.secret_arg_keys()
    for name, value in engine.args.items():
        from_env = launch.secret_env_var(name)
        if name in secret and from_env and isinstance(value, str):
            env[from_env] = value  # the engine reads it from there (Launch.secret_env): not an argv word at all
        elif name in secret and value is not None and not isinstance(value, bool):
            (argv if hidden is None else hidden).extend(_secret_tokens(profile, name, value, env))
        else:
            argv += flag_tokens(name, value, launch.false_prefix)
    drain, drain_flag = profile.restart.drain_s, launch.drain_flag_for(engine.version)  # where the release has it
    if drain and drain_flag and drain_flag not in engine.args:  # restart.drain_s (a stop drains)
        argv += flag_tokens(drain_flag, math.ceil(drain))
    return argv, env


def _secret_tokens(profile: Profile, name: str, value: Any, env: dict[str, str]) -> list[Word]:
    """A secret flag: its value (each secret item of a list; a whole dict) goes to the env file by reference."""
    flag = "--" + name.replace("_", "-")
    whole, items = profile.secret_arg_paths(name)
    if isinstance(value, list):
        words: list[Word] = [flag]
        for index, item in enumerate(value):
            text = _scalar(item)
            if whole or str(index) in items:
                env[secret_var(name, index)] = text
                words.append(EnvRef(secret_var(name, index)))
            else:
                words.append(text)
        return words
    text = json.dumps(value, sort_keys=True) if isinstance(value, dict) else _scalar(value)
    env[secret_var(name)] = text
    # "--flag -x" would make argparse read -x as an option; the = form keeps it a value.
    return [EnvRef(secret_var(name), prefix=flag + "=")] if text.startswith("-") else [flag, EnvRef(secret_var(name))]


def env_file_text(env: dict[str, str]) -> str:
    lines = ["# Environment of the engine, written by deployer. Mode 0600: it may hold secrets."]
    lines += [f"{name}={shlex.quote(value)}" for name, value in sorted(env.items())]
    return "\n".join(lines) + "\n"


def render(profile: Profile) -> Bundle:
    hidden: list[Word] = []
    if profile.engine.definition.launch.secret_argv_shim:
        argv, env, hidden = _shimmed(profile)
    else:
        argv, env = engine_argv(profile), engine_env(profile)
    try:
        script = _template(profile).render(name=profile.name, argv=argv, deployer_version=__version__,
                                           profile=profile.public_dict())
    except jinja2.TemplateError as exc:
        raise RenderError(f"template error: {exc}") from None
    if hidden:  # said, never run: JSON keeps it one line whatever a word holds; values only by variable name
        script = script.replace("\nexec ", "\n# the shim adds to the engine's argv, in memory: "
                                + json.dumps([str(w) for w in hidden]) + "\nexec ", 1)
    secret = profile.secret_env_keys() | {var for _, var in profile.engine.definition.launch.secret_env}
    masked = {k: (MASK if k in secret or k.startswith(SECRET_ENV_PREFIX) else v) for k, v in sorted(env.items())}
    return _bundle(script, argv, env, masked, hidden)


def render_launch(template: Path, name: str, words: list[Word], env: dict[str, str]) -> Bundle:
    """A launch script from a template of deployer's own (the router's, deployments/fleet/router_launch.sh.j2) with the same
    variables an engine's template gets but `profile`; every env value is masked for display."""
    try:
        text = template.read_text(encoding="utf-8")
        script = _environment(jinja2.BaseLoader()).from_string(text).render(
            name=name, argv=words, deployer_version=__version__)
    except jinja2.TemplateError as exc:
        raise RenderError(f"template error: {exc}") from None
    return _bundle(script, words, env, {k: MASK for k in sorted(env)})


def _bundle(script: str, words: list[Word], env: dict[str, str], masked: dict[str, str],
            hidden: list[Word] | None = None) -> Bundle:
    """The bundle of a rendered script: its content hash covers the script and the env file."""
    env_text = env_file_text(env)
    digest = hashlib.sha256(script.encode() + b"\0" + env_text.encode()).hexdigest()
    return Bundle(script=script, env=env_text, argv=[str(w) for w in words], words=words,
                  content_hash=digest, env_names=sorted(env), masked_env=masked, shim_words=list(hidden or []))


def _environment(loader: jinja2.BaseLoader) -> jinja2.Environment:
    env = jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, autoescape=False,
                             keep_trailing_newline=True)
    env.filters["shq"] = lambda v: shlex.quote(str(v))
    env.filters["shjoin"] = lambda items: " ".join(sh_word(i if isinstance(i, EnvRef) else str(i)) for i in items)
    return env


def _template(profile: Profile) -> jinja2.Template:
    try:
        if profile.template:
            base = profile.source.parent if profile.source else Path.cwd()
            path = (base / profile.template).resolve()
            if not path.is_file():
                raise RenderError(f"template not found: {path}")
            env = _environment(jinja2.FileSystemLoader(str(path.parent)))
            return env.get_template(path.name)
        text = profile.engine.definition.launch.template.read_text(encoding="utf-8")
        return _environment(jinja2.BaseLoader()).from_string(text)
    except jinja2.TemplateError as exc:
        raise RenderError(f"template error: {exc}") from None
