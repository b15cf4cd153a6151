"""Preflight on the target: facts (GPUs, disk, engine, port, model), flags, dry resolution, memory plan.

Two round trips at most: one bash script that prints every fact in sections (and, when this engine
version's flag set is not cached locally yet, the probe's flag set), then one probe run that resolves
the translated argv the way the engine will. Problems would fail the launch; warnings would not.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deployer import flags as fl
from deployer.errors import DeployError
from deployer.memory import MemoryPlan, ModelInfo, UnsupportedModel, plan_memory
from deployer.profile import Profile
from deployer.remote import Remote

FACTS_TIMEOUT = 120.0
RESOLVE_TIMEOUT = 180.0
DISK_WARN_BYTES = 2 << 30
NOISE = {"random_seed", "served_model_name", "tokenizer_path"}


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    total_mib: int
    used_mib: int
    free_mib: int


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_mib: int
    gpu_uuid: str


@dataclass
class ModelFiles:
    dir: str
    config: dict[str, Any] | None = None
    weight_bytes: int | None = None
    error: str | None = None


@dataclass
class Facts:
    gpus: list[Gpu] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    disk_path: str | None = None
    disk_free_bytes: int | None = None
    python_version: str | None = None
    engine_version: str | None = None
    port: int = 0
    port_free: bool | None = None
    model: ModelFiles | None = None
    flag_probe: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def env_exports(profile: Profile) -> str:
    """`export NAME=value` lines for the engine's environment (sent on stdin, never in argv)."""
    from deployer.render import engine_env

    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(engine_env(profile).items()))


def _home_path(path: str) -> str:
    """Shell text for `path`, with a leading ~ expanded by the target's shell."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + shlex.quote(path[1:]) if path != "~" else '"$HOME"'
    return shlex.quote(path)


VERSION_PY = """import sys
print(sys.version.split()[0])
try:
    from importlib import metadata
    print(metadata.version("sglang"))
except Exception:
    try:
        import sglang
        print(sglang.__version__)
    except Exception:
        print("-")
"""

FACTS_SCRIPT = r"""
sec() { printf '\n@@@%s\n' "$1"; }
sec gpus
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,memory.free --format=csv,noheader,nounits 2>&1
  echo "@@rc $?"
  sec apps
  nvidia-smi --query-compute-apps=pid,process_name,used_memory,gpu_uuid --format=csv,noheader,nounits 2>&1
else
  echo "@@missing"
fi
sec disk
d=$WORKDIR; while [ ! -e "$d" ] && [ "$d" != / ]; do d=$(dirname "$d"); done
echo "$d"; df -PB1 "$d" 2>&1 | tail -n 1
sec python
if command -v "$PY" >/dev/null 2>&1; then
  out=$("$PY" -c "$VERSION_PY" 2>&1); printf '%s\n' "$out"; v=$(printf '%s\n' "$out" | sed -n 2p)
else
  echo "@@missing"; v=
fi
sec port
if command -v ss >/dev/null 2>&1; then ss -Hltn "sport = :$PORT" 2>/dev/null | head -n 1
elif (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then echo busy; fi
sec model
m=$MODEL
if [ ! -d "$m" ]; then
  hub=${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}; repo="$hub/models--$(printf %s "$MODEL" | sed 's#/#--#g')"
  snap=$(cat "$repo/refs/main" 2>/dev/null); m="$repo/snapshots/$snap"
  [ -n "$snap" ] && [ -d "$m" ] || m=$(ls -d "$repo"/snapshots/*/ 2>/dev/null | head -n 1)
fi
echo "${m%/}"
sec config
cat "$m/config.json" 2>/dev/null
sec index
grep -o '"total_size"[^,}]*' "$m/model.safetensors.index.json" 2>/dev/null | head -n 1
sec stsize
ls "$m"/*.safetensors >/dev/null 2>&1 && du -cbL "$m"/*.safetensors 2>/dev/null | tail -n 1
sec flags
case " $CACHED " in *" $v "*) ;; *) [ -n "$v" ] && [ "$v" != - ] && "$PY" -c "$PROBE" --flags 2>/dev/null ;; esac
sec end
"""


def gather_facts(remote: Remote, profile: Profile, *, cached_versions: list[str] | tuple[str, ...] = ()) -> Facts:
    """One round trip: GPUs, processes on them, disk, engine python/version, port, model files (+ flags)."""
    engine = profile.engine
    head = env_exports(profile) + "".join(
        f"{name}={value}\n" for name, value in (
            ("PY", shlex.quote(engine.python)), ("WORKDIR", _home_path(profile.target.workdir)),
            ("PORT", str(engine.port)), ("MODEL", _home_path(engine.model_path)),
            ("CACHED", shlex.quote(" ".join(cached_versions))), ("VERSION_PY", shlex.quote(VERSION_PY)),
            ("PROBE", shlex.quote(fl.probe_source(engine.kind)))))
    result = remote.run("bash -s", stdin=(head + FACTS_SCRIPT).encode(), timeout=FACTS_TIMEOUT, check=False)
    return parse_facts(result.stdout, profile)


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if re.fullmatch(r"@@@[a-z]+", line):
            current = line[3:]
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return out


def parse_facts(text: str, profile: Profile) -> Facts:
    sec = _sections(text)
    facts = Facts(port=profile.engine.port)
    _parse_gpus(facts, sec.get("gpus", []), sec.get("apps", []))
    _parse_disk(facts, sec.get("disk", []))
    _parse_python(facts, sec.get("python", []), profile)
    facts.port_free = not any(line.strip() for line in sec.get("port", []))
    if not facts.port_free:
        facts.problems.append(f"port {facts.port} is already in use on the target")
    facts.model = _parse_model(sec)
    facts.flag_probe = fl.parse_probe_output("\n".join(sec.get("flags", [])))
    return facts


def _csv(line: str) -> list[str]:
    return [part.strip() for part in line.split(",")]


def _parse_gpus(facts: Facts, lines: list[str], apps: list[str]) -> None:
    if "@@missing" in lines:
        facts.problems.append("no NVIDIA driver / nvidia-smi on the target")
        return
    for line in lines:
        parts = _csv(line)
        if len(parts) == 6 and parts[0].isdigit():
            facts.gpus.append(Gpu(int(parts[0]), parts[1], parts[2], *(_int(p) for p in parts[3:])))
    if not facts.gpus:
        detail = next((ln for ln in lines if ln.strip() and not ln.startswith("@@")), "no GPUs listed")
        facts.problems.append(f"nvidia-smi found no GPU: {detail.strip()}")
    for line in apps:
        parts = _csv(line)
        if len(parts) == 4 and parts[0].isdigit():
            facts.processes.append(GpuProcess(int(parts[0]), parts[1], _int(parts[2]), parts[3]))


def _int(text: str) -> int:
    try:
        return int(float(text))
    except ValueError:
        return 0


def _parse_disk(facts: Facts, lines: list[str]) -> None:
    if len(lines) >= 2:
        facts.disk_path = lines[0]
        parts = lines[1].split()
        if len(parts) >= 4 and parts[3].isdigit():
            facts.disk_free_bytes = int(parts[3])
    if facts.disk_free_bytes is not None and facts.disk_free_bytes < DISK_WARN_BYTES:
        facts.warnings.append(f"only {facts.disk_free_bytes >> 20} MiB free on disk under {facts.disk_path}")


def _parse_python(facts: Facts, lines: list[str], profile: Profile) -> None:
    engine = profile.engine
    if "@@missing" in lines or len(lines) < 2:
        facts.problems.append(f"engine python {engine.python!r} not found on the target")
        return
    facts.python_version = lines[0].strip()
    version = lines[1].strip()
    if version in ("", "-"):
        facts.problems.append(f"{engine.kind} is not installed for {engine.python} (python {facts.python_version})")
        return
    facts.engine_version = version
    if engine.version and engine.version != version:
        facts.problems.append(f"the profile expects {engine.kind} {engine.version}, the target has {version}")


def weight_bytes_from_index(text: str) -> int | None:
    match = re.search(r'"total_size"\s*:\s*([0-9]+)', text)
    return int(match.group(1)) if match else None


def _parse_model(sec: dict[str, list[str]]) -> ModelFiles | None:
    folder = next((ln for ln in sec.get("model", []) if ln.strip()), "")
    files = ModelFiles(dir=folder)
    text = "\n".join(sec.get("config", [])).strip()
    if not text:
        files.error = f"no config.json under {folder or 'the model path'} on the target"
        return files
    try:
        files.config = json.loads(text)
    except ValueError as exc:
        files.error = f"config.json is not JSON: {exc}"
    files.weight_bytes = weight_bytes_from_index("\n".join(sec.get("index", [])))
    if files.weight_bytes is None:
        sizes = [ln.split()[0] for ln in sec.get("stsize", []) if ln.split() and ln.split()[0].isdigit()]
        files.weight_bytes = int(sizes[0]) if sizes else None
    return files


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
    resolved: dict[str, Any] | None = None
    rejection: str | None = None      # the engine's own error when it rejected these arguments

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def engine_version(self) -> str | None:
        """The engine version installed on the target (None if none was found)."""
        return self.facts.engine_version

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "problems": self.problems,
            "warnings": self.warnings,
            "overrides": self.overrides,
            "facts": {k: v for k, v in asdict(self.facts).items() if k != "flag_probe"},
            "engine_args": self.profile.engine.args,
            "engine_env": self.profile.public_dict()["engine"]["env"],
            "flagset_version": self.flagset_version,
            "flags_cached": self.flags_cached,
            "resolution": self.resolution,
            "rejection": self.rejection,
            "memory": None if self.memory is None else {
                **self.memory.to_json(), "rows": self.memory.rows()},
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
                  f"port {f.port} {'free' if f.port_free else 'BUSY'}; disk free {disk}",
                  f"  flags: {self.flagset_version or 'not checked'}{' (cached)' if self.flags_cached else ''}; "
                  f"dry resolution: {self.resolution}"]
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
    if own_port and facts.port_free is False:
        facts.problems = [p for p in facts.problems if not p.startswith(f"port {facts.port} is already in use")]
    report = PreflightReport(facts=facts, profile=profile, problems=list(facts.problems),
                             warnings=list(facts.warnings))
    flagset = _flagset(report, cache_dir, engine)
    if flagset is not None:
        checked = fl.check_flags(profile, flagset, fl.load_renames(engine=engine))
        report.profile = checked.profile
        report.problems += checked.errors
        report.warnings += checked.warnings
        if checked.ok:
            _resolve(remote, report)
    _memory(report, model_config)
    return report


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


def _resolve(remote: Remote, report: PreflightReport) -> None:
    """Dry resolution on the target: what the engine will change in the args it is given."""
    from deployer.render import engine_argv

    profile = report.profile
    argv = engine_argv(profile)[3:]  # drop `python -m module`
    script = env_exports(profile) + (
        f"exec {shlex.quote(profile.engine.python)} -c {shlex.quote(fl.probe_source(profile.engine.kind))} "
        f"--resolve {' '.join(shlex.quote(a) for a in argv)}\n")
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
    _read_resolution(report, data)


def _read_resolution(report: PreflightReport, data: dict[str, Any]) -> None:
    if not data.get("ok"):
        error = str(data.get("error", "unknown error"))
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
    given = set(report.profile.engine.args)
    for change in data.get("changed") or []:
        name = str(change["name"])
        if name.startswith("_") or name in NOISE:
            continue
        before, after = _short(change.get("from")), _short(change.get("to"))
        note = " (overrides the profile)" if name in given else ""
        report.overrides.append(f"engine will resolve {name} {before} -> {after}{note}")


def _short(value: Any, limit: int = 60) -> str:
    text = "unset" if value is None else value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _memory(report: PreflightReport, model_config: Path | None) -> None:
    model = _model_info(report, model_config)
    facts, profile = report.facts, report.profile
    if model is None or not facts.gpus:
        return
    # The engine's own resolution, where there is one, knows the defaults (spec algorithm, chunk size...).
    args: dict[str, Any] = {**profile.engine.args, **(report.resolved or {})}
    if report.resolved is not None and "mem_fraction_static" not in profile.engine.args:
        args["mem_fraction_static"] = None  # let the plan show the automatic value the same way SGLang does
    tp = int(args.get("tp_size") or 1)
    used = [g for g in facts.gpus if profile.engine.gpus is None or g.index in profile.engine.gpus]
    try:
        plan = plan_memory(model, args, [g.free_mib for g in used], [g.total_mib for g in used], tp)
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
