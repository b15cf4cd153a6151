"""Preflight on the target: facts (GPUs, disk, engine, port, model), flags, dry resolution, memory plan.

Two round trips at most: one bash script that prints every fact in sections (and, when this engine
version's flag set is not cached locally yet, the probe's flag set), then one probe run that resolves
the translated argv the way the engine will. Problems would fail the launch; warnings would not.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from deployer.engines.base import (GpuBudget, KvAllocated, MemoryInput, MemoryPlan, ModelInfo,
                                   UnsupportedModel)
from deployer.engines.renames import load_renames
from deployer.errors import DeployError, ProfileError, ProfileProblems
from deployer.flag_names import key_option
from deployer.preflight import flags as fl
from deployer.preflight.facts import PROBE_CACHE, STORE_SH, Facts, ModelFiles, env_exports, gather_facts
from deployer.preflight.facts import weight_bytes_from_index
from deployer.preflight.known import record_target_version
from deployer.preflight.topology import gpu_problems
from deployer.profile.model import Profile
from deployer.prepare.pushed import pinned_to_copy, source_of
from deployer.prepare.weights import WeightsPlan, pinned, plan_for
from deployer.remote.base import Remote
from deployer.render.bundle import engine_argv, sh_word
from deployer.box.push import expand_workdir

RESOLVE_TIMEOUT = 180.0
NOISE = {"random_seed", "served_model_name", "tokenizer_path"}


@dataclass
class PreflightReport:
    facts: Facts
    profile: Profile
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    memory: MemoryPlan | None = None
    flagset_version: str | None = None
    flags_cached: bool = False
    resolution: str = "not run"
    resolution_cached: bool = False   # answered from the target's probe cache (same install, GPUs, args, env)
    resolved: dict[str, Any] | None = None
    rejection: str | None = None      # the engine's own error when it rejected these arguments
    unknown_flags: dict[str, str] = field(default_factory=dict)   # flags the engine does not have -> problem
    gpu_problems: list[str] = field(default_factory=list)         # GPU indices/count vs the box (topology.py)
    own_port: bool = False            # the port is busy, held by this deployment's running version (up replaces it)
    flag_names: list[str] = field(default_factory=list)           # every flag the target's engine has
    allocated: KvAllocated | None = None   # what the running version's engine allocated for its KV cache (its log)
    allocated_run: str | None = None       # the run whose log said so
    # each value the dry resolution changed: {"name", "from", "to", "source"} (the engine's resolution step)
    resolution_changes: list[dict[str, Any]] = field(default_factory=list)

    def gpu_budgets(self) -> list[GpuBudget]:
        """The memory plan on each GPU the engine uses (the plan is one GPU's: the smallest; each bar is drawn on
        its own GPU's total)."""
        if self.memory is None:
            return []
        budget = self.memory.budget()
        engine = self.profile.engine
        used = [g for g in self.facts.gpus if engine.gpus is None or g.index in engine.gpus]
        used = used[:engine.definition.launch.gpus_per_engine(dict(engine.args))] or used[:1]
        return [GpuBudget(g.index, g.name, replace(budget, total_mib=float(g.total_mib))) for g in used] or \
            [GpuBudget(0, None, budget)]

    @property
    def ok(self) -> bool:
        return not self.problems

    def refusal(self) -> ProfileError | None:
        """The flags this engine version does not have that nothing may fix (no rename, no documented removal, not
        exactly one close spelling): never dropped, refused with exit 2, each with its file:line."""
        refused = [ProfileError(line, file=self.profile.where(f"engine.args.{key}")[0],
                                line=self.profile.where(f"engine.args.{key}")[1], field=f"engine.args.{key}")
                   for key, line in self.unknown_flags.items()]
        if not refused:
            return None
        return refused[0] if len(refused) == 1 else ProfileProblems(refused, file=refused[0].file)

    @property
    def engine_version(self) -> str | None:
        """The engine version installed on the target (None if none was found)."""
        return self.facts.engine_version

    def _port_state(self) -> str:
        if self.own_port:
            return "held by this deployment's running version (up replaces it)"
        return "free" if self.facts.port_free else "BUSY"

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "problems": self.problems,
            "warnings": self.warnings,
            "overrides": self.overrides,
            "facts": {k: v for k, v in asdict(self.facts).items() if k != "flag_probe"},
            "engine_args": self.profile.public_dict()["engine"]["args"],
            "engine_env": self.profile.public_dict()["engine"]["env"],
            "own_port": self.own_port,
            "flagset_version": self.flagset_version,
            "flags_cached": self.flags_cached,
            "flags_from_target_cache": self.facts.flags_from_target_cache,
            "resolution": self.resolution,
            "resolution_cached": self.resolution_cached,
            "rejection": self.rejection,
            "memory": None if self.memory is None else {
                **self.memory.to_json(), "rows": self.memory.rows(),
                "budget": [g.to_json() for g in self.gpu_budgets()],
                "kv_estimate": {k: v for k, v in self.memory.kv_estimate().to_json().items() if k != "line"}},
            "allocated": None if self.allocated is None else {"run_id": self.allocated_run,
                                                              **self.allocated.to_json()},
        }

    def render_text(self) -> str:
        """The table `deploy plan` prints."""
        f = self.facts
        lines = [f"preflight of {self.profile.name}: {'OK' if self.ok else 'PROBLEMS'}"]
        for g in f.gpus:
            lines.append(f"  GPU {g.index} {g.name}: {g.free_mib}/{g.total_mib} MiB free")
        for p in f.processes:
            lines.append(f"  process {p.pid} {p.name} uses {p.used_mib} MiB on {p.gpu_uuid}")
        disk = "?" if f.disk_free_bytes is None else f"{f.disk_free_bytes / (1 << 30):.1f} GiB"
        lines += [f"  python {f.python_version or '?'}, {self.profile.engine.kind} {f.engine_version or '?'}; "
                  f"port {f.port} {self._port_state()}; disk free {disk}",
                  f"  flags: {self.flagset_version or 'not checked'}{' (cached)' if self.flags_cached else ''}; "
                  f"dry resolution: {self.resolution}{' (cached on the target)' if self.resolution_cached else ''}"]
        if self.memory is not None:
            width = max(len(k) for k, _ in self.memory.rows())
            lines += ["memory plan (one GPU):"] + [f"  {k.ljust(width)}  {v}" for k, v in self.memory.rows()]
            lines += [f"  suggestion: {s}" for s in self.memory.suggestions]
        for title, items in (("problems", self.problems), ("warnings", self.warnings),
                             ("overrides", self.overrides)):
            if items:
                lines += [f"{title}:"] + [f"  - {item}" for item in items]
        return "\n".join(lines) + "\n"


def run_preflight(remote: Remote, profile: Profile, *, cache_dir: Path, model_config: Path | None = None,
                  own_port: bool = False) -> PreflightReport:
    """Everything `deploy plan` shows and `deploy up` checks before pushing anything.

    own_port: this deployment's running version holds the engine port (`up` stops it first), so a busy port is
    not a problem.
    """
    engine = profile.engine.kind
    facts = gather_facts(remote, profile, cached_versions=fl.cached_versions(cache_dir, engine))
    if facts.engine_version is not None:  # what `deploy render` shows next time for this target
        record_target_version(cache_dir, profile, facts.engine_version)
    if own_port and facts.port_free is False:
        facts.problems = [p for p in facts.problems if not p.startswith(f"port {facts.port} is already in use")]
    report = PreflightReport(facts=facts, profile=profile, problems=list(facts.problems),
                             warnings=list(facts.warnings))
    report.own_port = own_port and facts.port_free is False
    report.gpu_problems = gpu_problems(profile, facts.gpus)
    report.problems += report.gpu_problems
    flagset = _flagset(report, cache_dir, engine)
    if flagset is not None:
        checked = fl.check_flags(profile, flagset, load_renames(profile.engine.definition.knowledge))
        report.profile = checked.profile
        report.problems += checked.errors
        report.warnings += checked.warnings
        report.unknown_flags = dict(checked.unknown)
        report.flag_names = flagset.option_keys()
        if checked.ok:
            _resolve_where_the_model_is(remote, report, cache_dir)
    _drain_flag(report)
    _memory(report, model_config or pushed_source(profile))
    return report


def _drain_flag(report: PreflightReport) -> None:
    """restart.drain_s on a release without the engine's drain flag (Launch.drain_since): said once, and the
    profile carries the target's version so render leaves the flag out; the supervisor's stop still waits."""
    profile, version = report.profile, report.facts.engine_version
    launch = profile.engine.definition.launch
    if not profile.restart.drain_s or version is None or launch.drain_flag is None or \
            launch.drain_flag in profile.engine.args or launch.drain_flag_for(version) is not None:
        return
    report.warnings.append(
        f"{profile.engine.kind} {version} has no {key_option(launch.drain_flag)} (from {launch.drain_since}): "
        f"restart.drain_s {profile.restart.drain_s:g} is not passed to the engine, which ends what is in flight "
        f"on a stop; the supervisor still waits drain_s and the grace before SIGKILL")
    report.profile = profile.model_copy(update={"engine": profile.engine.model_copy(update={"version": version})})


def _resolve_where_the_model_is(remote: Remote, report: PreflightReport, cache_dir: Path) -> None:
    """The dry resolution needs the model where the engine will find it (an engine may read its config as it
    resolves). A directory not pushed yet is resolved against its copy on the target when that
    is there already (the same content pushed before), else skipped: the engine would look for the controller's
    path. A hub repo deployer fetches is resolved offline against the commit the target's hub cache has for its
    revision, else skipped: the engine would download it (or fail offline) during preflight."""
    fetch = plan_for(report.profile)
    if fetch is not None:
        commit = _cached_commit(remote, fetch)
        if commit is None:
            report.resolution = "after the fetch"
            report.warnings.append(f"dry resolution skipped: {fetch.describe()} is fetched after preflight (not in "
                                   "the target's hub cache yet); effective args are checked after start")
            return
        _resolve(remote, report, pinned(report.profile, commit))
        return
    if pushed_source(report.profile) is None:
        _resolve(remote, report)
        return
    at_copy = pinned_to_copy(report.profile, expand_workdir(remote, report.profile.target.workdir), cache_dir)
    assert at_copy is not None
    pinned_there, plan, folder = at_copy
    if remote.run(f"test -d {shlex.quote(folder)}", timeout=30, check=False).exit_code != 0:
        report.resolution = "after the push"
        report.warnings.append(f"dry resolution skipped: {plan.source.name} is pushed after preflight (not on the "
                               "target yet); effective args are checked after start")
        return
    _resolve(remote, report, pinned_there)


def pushed_source(profile: Profile) -> Path | None:
    """`engine.weights.push`: the directory here is the model (its copy on the target exists only after the push)."""
    weights = profile.engine.weights
    return source_of(profile) if weights is not None and weights.push and weights.pushed is None else None


def _flagset(report: PreflightReport, cache_dir: Path, engine: str) -> fl.FlagSet | None:
    facts = report.facts
    if facts.engine_version is None:
        return None
    cached = fl.load_cached_flagset(cache_dir, engine, facts.engine_version)
    if cached is not None:
        report.flags_cached = True
        report.flagset_version = cached.version
        return cached
    probe = facts.flag_probe or {}
    if not probe.get("flags"):
        why = probe.get("flags_error") or probe.get("error") or "the probe printed no flag set"
        report.warnings.append(f"could not introspect the flags of {engine} {facts.engine_version}: {why}; "
                               "flags are not checked before launch")
        return None
    flagset = fl.FlagSet.from_json({**probe, "version": facts.engine_version}, engine=engine)
    try:
        fl.save_flagset(cache_dir, flagset)
    except OSError as exc:
        report.warnings.append(f"could not cache the flag set under {cache_dir}: {exc.strerror or exc}")
    report.flagset_version = flagset.version
    return flagset


def _cached_commit(remote: Remote, plan: WeightsPlan) -> str | None:
    """The commit the target's hub cache holds for the plan's revision (a ref, or the commit itself), with its
    config.json; None when it has none."""
    hub = shlex.quote(plan.hub) if plan.hub else '"${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}"'
    folder = shlex.quote("models--" + plan.repo.replace("/", "--"))
    script = (f"d={hub}/{folder}; r={shlex.quote(plan.revision)}; c=\n"
              'if [ -f "$d/refs/$r" ]; then c=$(cat "$d/refs/$r"); elif [ -d "$d/snapshots/$r" ]; then c=$r; fi\n'
              '[ -n "$c" ] && [ -e "$d/snapshots/$c/config.json" ] && printf %s "$c"\n')
    found = remote.run("sh -s", stdin=script.encode(), timeout=30, check=False).stdout.strip()
    return found if re.fullmatch(r"[0-9a-f]{40}", found) else None


def _resolve(remote: Remote, report: PreflightReport, profile: Profile | None = None) -> None:
    """Dry resolution on the target: what the engine will change in the args it is given (`profile`: the one to
    resolve, default the report's)."""
    profile = profile or report.profile
    argv = engine_argv(profile)[3:]  # drop `python -m module`
    probe = (f"{shlex.quote(profile.engine.python)} -c {shlex.quote(profile.engine.definition.probe.source())} "
             f"--resolve {' '.join(sh_word(a) for a in argv)}")
    key = _resolution_cache(report, env_exports(profile) + probe)
    script = env_exports(profile) + (f"exec {probe}\n" if key is None else _cached(probe, f"resolve-{key}"))
    try:
        result = remote.run("bash -s", stdin=script.encode(), timeout=RESOLVE_TIMEOUT, check=False)
    except DeployError as exc:
        report.resolution = f"not available: {exc}"
        report.warnings.append(f"dry resolution failed to run ({exc}); effective args are checked after start")
        return
    data = (fl.parse_probe_output(result.stdout) or {}).get("resolve")
    if not isinstance(data, dict):
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        report.resolution = f"not available: {tail[0]}"
        report.warnings.append(f"dry resolution printed nothing usable ({tail[0]}); "
                               "effective args are checked after start")
        return
    report.resolution_cached = "@@cached" in result.stdout.splitlines()
    _read_resolution(report, data, result.stderr or "")


def _cached(probe: str, name: str) -> str:
    """Shell that answers from the target's probe cache (then prints @@cached), else runs `probe` and keeps what
    it printed when that holds the probe's JSON."""
    return STORE_SH + (f'f={PROBE_CACHE}/{name}.out\n'
                       'if [ -s "$f" ] && [ ! -L "$f" ] && owned "${f%/*}"; then\n'
                       '  cat "$f"; echo "@@cached"; exit 0\nfi\n'
                       f'o=$({probe}); rc=$?\n'
                       "printf '%s\\n' \"$o\"\n"
                       f'case "$o" in *{shlex.quote(fl.PROBE_MARKER)}*) store "$f" "$o" ;; esac\n'
                       'exit $rc\n')


def _resolution_cache(report: PreflightReport, probe: str) -> str | None:
    """The key of this dry resolution in the target's probe cache, None when it must not be kept: no install
    stamp to key it by, or secret args (the resolved values would hold them)."""
    facts, profile = report.facts, report.profile
    if not facts.engine_stamp or profile.secret_arg_keys():
        return None
    material = json.dumps([profile.engine.kind, facts.engine_version, facts.engine_stamp,
                           [[g.name, g.total_mib] for g in facts.gpus], probe])
    return hashlib.sha256(material.encode()).hexdigest()[:40]


def _read_resolution(report: PreflightReport, data: dict[str, Any], stderr: str = "") -> None:
    if not data.get("ok"):
        error = _argparse_message(str(data.get("error", "unknown error")), stderr)
        if data.get("supported") is False:
            report.resolution = f"not supported: {error}"
            report.warnings.append(f"this engine version cannot resolve args without starting ({error}); "
                                   "effective args are checked after start")
        else:
            report.resolution = f"failed: {error}"
            report.rejection = error
            report.problems.append(f"the engine rejects these arguments ({data.get('stage', 'resolve')}): {error}")
        return
    report.resolution = "done"
    report.resolved = data.get("resolved") or {}
    report.resolution_changes = [c for c in data.get("changed") or [] if isinstance(c, dict) and "name" in c]
    given = set(report.profile.engine.args)
    for change in data.get("changed") or []:
        name = str(change["name"])
        if name.startswith("_") or name in NOISE:
            continue
        before, after = _short(change.get("from")), _short(change.get("to"))
        note = " (overrides the profile)" if name in given else ""
        report.overrides.append(f"engine will resolve {name} {before} -> {after}{note}")


_ARGPARSE_EXIT_RE = re.compile(r"^argparse exit \d+$")
_ARGPARSE_ERROR_RE = re.compile(r"^\S.*?: error: .+$")


def _argparse_message(error: str, stderr: str) -> str:
    """argparse's own words for a rejected argv (`<prog> serve: error: argument --tp-size: invalid int value:
    'two'`): a probe that reports only "argparse exit 2" left them on its stderr."""
    if not _ARGPARSE_EXIT_RE.match(error.strip()):
        return error
    said = [ln.strip() for ln in stderr.splitlines() if _ARGPARSE_ERROR_RE.match(ln.strip())]
    return said[-1] if said else error


def _short(value: Any, limit: int = 60) -> str:
    text = "unset" if value is None else value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _memory(report: PreflightReport, model_config: Path | None) -> None:
    """The engine's own memory model (Engine.memory) on the GPUs the profile uses."""
    facts, profile = report.facts, report.profile
    model_of = profile.engine.definition.memory
    if model_of is None:
        report.warnings.append(f"memory: no memory plan for {profile.engine.kind} yet (not checked before launch)")
        return
    if report.gpu_problems:  # a plan over GPUs the engine will not have would only mislead
        return
    model = _model_info(report, model_config)
    if model is None or not facts.gpus:
        return
    used = [g for g in facts.gpus if profile.engine.gpus is None or g.index in profile.engine.gpus]
    request = MemoryInput(model=model, args=dict(profile.engine.args), resolved=report.resolved,
                          gpu_free_mib=[g.free_mib for g in used], gpu_total_mib=[g.total_mib for g in used],
                          version=facts.engine_version)
    try:
        plan = model_of(request)
    except (UnsupportedModel, KeyError, ValueError, ZeroDivisionError) as exc:
        report.warnings.append(f"no memory estimate for this model: {exc}")
        return
    report.memory = plan
    report.problems += [f"memory: {p}" for p in plan.problems]
    report.warnings += [f"memory: {w}" for w in plan.warnings]


def _model_info(report: PreflightReport, model_config: Path | None) -> ModelInfo | None:
    if model_config is not None:
        return _local_model(report, model_config)
    files: ModelFiles | None = report.facts.model
    if files is None or files.config is None:
        why = files.error if files is not None and files.error else "config.json not found on the target"
        report.warnings.append(f"no memory estimate: {why} (give a local copy with --model-config DIR)")
        return None
    return ModelInfo(config=files.config, weight_bytes=files.weight_bytes, source=files.dir)


def _local_model(report: PreflightReport, folder: Path) -> ModelInfo | None:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        report.problems.append(f"--model-config {folder}: cannot read config.json: {exc}")
        return None
    index = folder / "model.safetensors.index.json"
    size = weight_bytes_from_index(index.read_text(encoding="utf-8")) if index.is_file() else None
    if size is None:
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors")) or None
    return ModelInfo(config=config, weight_bytes=size, source=str(folder))
