"""The commands that build a managed environment on the target, as argv lists (never shell text): `uv` when the
target has it (much faster), `python -m venv` + pip otherwise; the target's own pip configuration honoured; the
dry resolution first, whose answer feeds the compatibility preflight (compat) and the disk check.

pip reads its configuration itself; uv reads none of pip's (`pip.conf`, `PIP_*`), so what `pip config list` reports
is passed to uv as flags, and where uv has no equivalent for a key the build uses pip and says which key
(uv's pip interface: https://docs.astral.sh/uv/pip/compatibility/).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from deployer.prepare.envspec import EnvPaths, EnvRecord, EnvSpec, ResolvedDist

# The lock and the publish step, implemented by the target-side helper (stdlib) under `<envs>/<hash>.lock`.
LOCK_PROTOCOL = """\
1. open <envs>/<hash>.lock (O_CREAT, 0600) and flock(LOCK_EX), waiting up to the build timeout; the kernel drops
   the lock when its holder dies, so a crashed deploy never leaves a stale lock.
2. holding it: if <envs>/<hash> resolves to a directory whose deployer-env.json is intact (EnvRecord.intact),
   reuse it and stop (another deploy built it meanwhile).
3. remove every <envs>/<hash>.build-* that <envs>/<hash> does not point to (builds that died: no live holder).
4. build into <envs>/<hash>.build-<id> (the steps of InstallPlan, in order), write deployer-env.json into it,
   fsync it and the directory.
5. publish: symlink <envs>/<hash>.link-<id> -> <hash>.build-<id>, then rename(2) it over <envs>/<hash> (atomic:
   a reader sees no environment or a complete one, never half of one).
6. release the lock. Readers (launch, status) never take it: <envs>/<hash> exists only when complete.
Why a symlink and not renaming the build directory into place: a venv is not relocatable (console scripts carry
its absolute path in their #! line, pip's RECORD files too), so the directory keeps the name it was built under.
"""

# `pip config list` lines: `global.find-links='/opt/wheels'`, `:env:.find-links='/opt/wheels'`.
_CONFIG_LINE = re.compile(r"^(?P<section>[^.\s=]+)\.(?P<key>[A-Za-z0-9_-]+)=(?P<value>.*)$")
# For the install command, pip takes the environment over the `install` section over `global` (pip's docs,
# "Configuration": environment variables override configuration files; command sections override global).
_SECTION_ORDER = ("global", "install", ":env:")
# Keys that change nothing in what gets installed: safe to drop for uv.
_HARMLESS = frozenset({"disable-pip-version-check", "no-cache-dir", "cache-dir", "progress-bar", "quiet", "verbose",
                       "no-input", "root-user-action", "no-warn-script-location", "no-color", "retries", "log",
                       "python", "require-virtualenv", "timeout", "default-timeout", "no-python-version-warning"})
_LIST_KEYS = frozenset({"find-links", "extra-index-url", "constraint", "trusted-host", "only-binary", "no-binary"})
PIP_REPORT_MIN = (22, 2)   # `pip install --dry-run --report` (pip 22.2 release notes)


@dataclass(frozen=True)
class PipConfig:
    """The target's effective pip configuration for `pip install`: key -> values (lists split on whitespace)."""

    values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def get(self, key: str) -> tuple[str, ...]:
        return tuple(self.values.get(key, ()))

    def items(self) -> tuple[tuple[str, str], ...]:
        """Flat (key, value) pairs, sorted: what a record stores as honoured."""
        return tuple((k, v) for k in sorted(self.values) for v in self.values[k])


def parse_pip_config(text: str) -> PipConfig:
    """What `pip config list` printed, resolved the way `pip install` resolves it (env > install > global)."""
    ranked: dict[str, tuple[int, tuple[str, ...]]] = {}
    for line in text.splitlines():
        match = _CONFIG_LINE.match(line.strip())
        if not match or match.group("section") not in _SECTION_ORDER:
            continue
        rank = _SECTION_ORDER.index(match.group("section"))
        key = match.group("key").replace("_", "-")
        raw = _unquote(match.group("value"))
        values = tuple(raw.split()) if key in _LIST_KEYS else (raw,)
        if key not in ranked or rank >= ranked[key][0]:
            ranked[key] = (rank, values)
    return PipConfig({k: v for k, (_, v) in ranked.items()})


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


@dataclass(frozen=True)
class TargetTools:
    """What the target offers to build with (from the probe: `uv --version`, `<python> -m pip --version`)."""

    python_version: str                     # of the interpreter named by install.python
    uv: str | None = None                   # path of uv, when on PATH
    uv_version: str | None = None
    pip_version: str | None = None          # of `<python> -m pip`; None: no pip for that python

    @property
    def pip_has_report(self) -> bool:
        return self.pip_version is not None and _version_tuple(self.pip_version) >= PIP_REPORT_MIN


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def probe_commands(spec: EnvSpec) -> dict[str, list[str]]:
    """What the helper runs once per host before planning (each answer parsed by the functions here)."""
    return {"python": [spec.python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
            "pip": [spec.python, "-m", "pip", "--version"],
            "pip_config": [spec.python, "-m", "pip", "config", "list"],
            # the same files and PIP_* variables read by any pip on the box, when the build python has none (a
            # venv made --without-pip): uv is then told what pip would honour
            "pip_config_any": ["python3", "-m", "pip", "config", "list"],
            "uv": ["uv", "--version"]}


@dataclass(frozen=True)
class Step:
    """One command of a build: its argv, extra environment, and what it is for (shown as the phase's detail)."""

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ToolChoice:
    tool: str                       # "uv" or "pip"
    why: str                        # one line: why this tool
    flags: tuple[str, ...] = ()     # index/find-links/constraint flags for install and resolve
    env: tuple[tuple[str, str], ...] = ()


# `uv pip compile` printing only the pins (`name==version` per line): what the resolve step reads back.
UV_COMPILE_QUIET = ("--no-header", "--no-annotate", "--quiet")


@dataclass(frozen=True)
class InstallPlan:
    """Build one environment: venv, resolve (dry run), install, list; then the helper writes the record and
    publishes (LOCK_PROTOCOL). `resolve` may be None (pip older than 22.2: no report; said in `notes`). uv's
    resolve is `uv pip compile` of the packages given on its stdin (`-`): it needs neither the environment nor a
    pip, and resolves with the very flags the install gets."""

    spec: EnvSpec
    paths: EnvPaths
    build_id: str
    choice: ToolChoice
    venv: Step
    resolve: Step | None
    install: Step
    freeze: Step
    notes: tuple[str, ...] = ()

    @property
    def build_dir(self) -> str:
        return self.paths.build_dir(self.build_id)

    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(s for s in (self.venv, self.resolve, self.install, self.freeze) if s is not None)


def profile_flags(spec: EnvSpec) -> list[str]:
    """The profile's own index and find-links as pip flags (pip reads the target's configuration itself)."""
    flags: list[str] = []
    if spec.index_url:
        flags += ["--index-url", spec.index_url]
    for url in spec.extra_index_urls:
        flags += ["--extra-index-url", url]
    for link in spec.find_links:
        flags += ["--find-links", link]
    return flags


# pip configuration keys uv has a flag for: each value becomes `flag value`; switches become their flags when on;
# environment keys become the variable uv reads instead (uv: `SSL_CERT_FILE` for a custom CA bundle).
_UV_VALUE_FLAGS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links",
                   "trusted-host": "--allow-insecure-host", "only-binary": "--only-binary",
                   "no-binary": "--no-binary"}
_UV_SWITCHES = {"pre": ("--prerelease", "allow"), "no-index": ("--no-index",)}
_UV_ENV = {"cert": "SSL_CERT_FILE"}
_TRUE = ("1", "true", "yes", "on")


def _uv_flags(spec: EnvSpec, config: PipConfig) -> tuple[list[str], list[tuple[str, str]]] | str:
    """The target's pip configuration as uv flags (and environment), the profile's values on top; or the reason
    uv cannot honour it (a key it has no flag for, a constraint given as a URL)."""
    flags: list[str] = []
    env: list[tuple[str, str]] = []
    for key in sorted(config.values):
        values = config.get(key)
        if key in _HARMLESS or (key == "index-url" and spec.index_url):
            continue
        if key == "index-url":
            flags += ["--index-url", values[0]]
        elif key == "constraint":
            remote = [v for v in values if re.match(r"^[a-z]+://", v)]
            if remote:
                return f"pip's configuration names a constraint file by URL ({remote[0]}); uv reads local ones only"
            flags += [item for value in values for item in ("--constraints", value)]
        elif key in _UV_VALUE_FLAGS:
            flags += [item for value in values for item in (_UV_VALUE_FLAGS[key], value)]
        elif key in _UV_SWITCHES:
            flags += list(_UV_SWITCHES[key]) if values[0].lower() in _TRUE else []
        elif key in _UV_ENV:
            env.append((_UV_ENV[key], values[0]))
        else:
            return f"pip's configuration sets {key} ({values[0]}), which uv has no flag for"
    flags += profile_flags(spec)
    return flags + _index_strategy(flags), env


def _index_strategy(flags: list[str]) -> list[str]:
    """pip looks for a package on every index and find-links and takes the best match; uv stops at the first
    index that has it unless told otherwise (https://docs.astral.sh/uv/pip/compatibility/)."""
    sources = flags.count("--extra-index-url") + flags.count("--find-links") + ("--index-url" in flags)
    return ["--index-strategy", "unsafe-best-match"] if sources > 1 else []


def choose_tool(spec: EnvSpec, tools: TargetTools, config: PipConfig) -> ToolChoice:
    """uv when the target has it and it can honour the target's pip configuration; pip otherwise. ValueError when
    neither can build (no uv, and `python -m pip` missing)."""
    pip_ok = tools.pip_version is not None
    if tools.uv:
        mapped = _uv_flags(spec, config)
        if not isinstance(mapped, str):
            return ToolChoice("uv", f"uv {tools.uv_version or ''} found on the target".replace("  ", " "),
                              tuple(mapped[0]), tuple(mapped[1]))
        if pip_ok:
            return ToolChoice("pip", f"pip, not uv: {mapped}", tuple(profile_flags(spec)))
        raise ValueError(f"cannot build the environment: {mapped}, and {spec.python} has no pip")
    if pip_ok:
        return ToolChoice("pip", f"pip {tools.pip_version} ({spec.python} -m pip; no uv on the target's PATH)",
                          tuple(profile_flags(spec)))
    raise ValueError(f"cannot build the environment: no uv on the target's PATH and {spec.python} has no pip "
                     "(install uv: `pip install uv` or https://docs.astral.sh/uv/, or python3-venv/python3-pip)")


def plan_install(spec: EnvSpec, workdir: str, tools: TargetTools, config: PipConfig, build_id: str) -> InstallPlan:
    """The build of `spec` under `workdir` with the tool `choose_tool` picks."""
    paths = EnvPaths.of(workdir, spec)
    choice = choose_tool(spec, tools, config)
    build = paths.build_dir(build_id)
    py = f"{build}/bin/python"
    packages = list(spec.packages)
    if choice.tool == "uv":
        uv = tools.uv or "uv"
        return InstallPlan(
            spec, paths, build_id, choice,
            venv=Step("venv", (uv, "venv", "--quiet", "--python", spec.python, build), choice.env),
            resolve=Step("resolve", (uv, "pip", "compile", "--python", spec.python, *UV_COMPILE_QUIET,
                                     *choice.flags, "-"), choice.env),
            install=Step("install", (uv, "pip", "install", "--python", py, *choice.flags, *packages), choice.env),
            freeze=Step("freeze", (uv, "pip", "list", "--python", py, "--format", "json"), choice.env))
    notes: tuple[str, ...] = ()
    resolve: Step | None = Step("resolve", (py, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                                            "--no-input", "--disable-pip-version-check", *choice.flags, *packages))
    if not tools.pip_has_report:
        resolve = None
        notes = (f"pip {tools.pip_version} has no --dry-run --report (pip >= 22.2): the preflight checks only "
                 "the host, not the resolved packages",)
    return InstallPlan(
        spec, paths, build_id, choice,
        venv=Step("venv", (spec.python, "-m", "venv", build)),
        resolve=resolve,
        install=Step("install", (py, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                                 *choice.flags, *packages)),
        freeze=Step("freeze", (py, "-m", "pip", "list", "--format", "json", "--disable-pip-version-check")),
        notes=notes)


# --- reading the answers -------------------------------------------------------------------------------------


def parse_tool_version(text: str) -> str | None:
    """`uv 0.13.9 (x86_64-unknown-linux-gnu)` / `pip 23.2.1 from ... (python 3.11)` -> the version."""
    match = re.search(r"^(?:uv|pip)\s+(\d+(?:\.\d+)*)", text.strip())
    return match.group(1) if match else None


def parse_pip_report(text: str) -> tuple[ResolvedDist, ...]:
    """pip's `--report -` JSON (installation report format 1) -> what it would install; text before the JSON
    (warnings pip printed to the same stream) is skipped. ValueError when there is no report."""
    start = text.find("\n{")
    body = text if text.lstrip().startswith("{") else (text[start + 1:] if start >= 0 else "")
    try:
        data: Any = json.loads(body)
        items = data["install"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("no pip installation report in the output") from None
    out = []
    for item in items:
        meta = item.get("metadata") or {}
        info = item.get("download_info") or {}
        out.append(ResolvedDist(name=str(meta.get("name")), version=str(meta.get("version")),
                                url=info.get("url"), requires_python=meta.get("requires_python")))
    return tuple(out)


_UV_WOULD = re.compile(r"^\s*\+\s+(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)\s*$")


def parse_uv_dry_run(text: str) -> tuple[ResolvedDist, ...]:
    """`uv pip install --dry-run` -> the ` + name==version` lines it would install (no URLs, no sizes). uv prints
    them on stderr: pass both streams."""
    return tuple(ResolvedDist(name=m.group("name"), version=m.group("version"))
                 for m in map(_UV_WOULD.match, text.splitlines()) if m)


_UV_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*"
                     r"(?:==\s*(?P<version>[^\s;]+)|@\s*(?P<url>[^\s;]+))")


def parse_uv_compile(text: str) -> tuple[ResolvedDist, ...]:
    """`uv pip compile --no-header --no-annotate` -> its pins (`name==version`; `name @ url` for a direct
    reference, version unknown); comments, option lines and warnings skipped. No sizes: uv prints no URLs for
    index packages."""
    out = []
    for line in text.splitlines():
        match = _UV_PIN.match(line.strip())
        if match:
            out.append(ResolvedDist(name=match.group("name"), version=match.group("version") or "",
                                    url=match.group("url")))
    return tuple(out)


def parse_freeze(text: str) -> dict[str, str]:
    """`pip list --format json` / `uv pip list --format json` -> {name: version}."""
    try:
        return {str(d["name"]): str(d["version"]) for d in json.loads(text)}
    except (ValueError, KeyError, TypeError):
        raise ValueError("not a package list (pip list --format json)") from None


# The helper's size probe (stdlib): a JSON list of URLs on stdin -> a JSON list of sizes (None when unknown).
# file:// is a stat; http(s) a HEAD request's Content-Length.
SIZES_PY = r"""
import json, os, sys, urllib.parse, urllib.request
out = []
for url in json.load(sys.stdin):
    size = None
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme == "file":
            size = os.stat(urllib.parse.unquote(parts.path)).st_size
        elif parts.scheme in ("http", "https"):
            req = urllib.request.Request(url.split("#", 1)[0], method="HEAD")
            with urllib.request.urlopen(req, timeout=20) as resp:
                size = int(resp.headers.get("Content-Length") or 0) or None
    except Exception:
        size = None
    out.append(size)
print(json.dumps(out))
"""


def with_sizes(dists: tuple[ResolvedDist, ...], sizes: list[int | None]) -> tuple[ResolvedDist, ...]:
    """The resolved distributions with the sizes SIZES_PY answered (in the same order)."""
    if len(sizes) != len(dists):
        raise ValueError(f"{len(sizes)} sizes for {len(dists)} distributions")
    return tuple(ResolvedDist(d.name, d.version, d.url, s, d.requires_python) for d, s in zip(dists, sizes))


def record_for(plan: InstallPlan, *, python_version: str, tool_version: str | None, freeze: Mapping[str, str],
               resolved: tuple[ResolvedDist, ...], config: PipConfig, built_at: str) -> EnvRecord:
    """The record the helper writes into the build dir before publishing it: the spec, when, which tool, the
    environment's python, what is installed (the freeze, with the resolution's URLs and sizes where it had them)
    and what of the target's pip configuration the build honoured."""
    known = {d.key: d for d in resolved}
    dists = tuple(ResolvedDist(name, version, *_url_size(known.get(_key(name)), version))
                  for name, version in sorted(freeze.items(), key=lambda kv: _key(kv[0])))
    tool = f"{plan.choice.tool} {tool_version}" if tool_version else plan.choice.tool
    return EnvRecord(spec=plan.spec, built_at=built_at, tool=tool, python_version=python_version, resolved=dists,
                     pip_config=config.items(), digest=plan.spec.digest)


def _key(name: str) -> str:
    return ResolvedDist(name, "").key


def _url_size(dist: ResolvedDist | None, version: str) -> tuple[str | None, int | None]:
    if dist is None or dist.version != version:
        return None, None
    return dist.url, dist.size
