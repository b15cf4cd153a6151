"""Facts from the target in one round trip: GPUs and their processes (nvidia-smi), free disk under the workdir,
the engine python and engine version, whether the engine port is free, the model's files (and, when this engine
version's flag set is not cached yet, the probe's flag set). Parsed into `Facts`.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from deployer.engines.base import Install
from deployer.preflight import flags as fl
from deployer.profile.model import Profile
from deployer.remote.base import Remote
from deployer.render.bundle import engine_env

FACTS_TIMEOUT = 120.0
DISK_WARN_BYTES = 2 << 30


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
    engine_stamp: str | None = None   # engine python realpath, package origin, their mtimes (probe cache key)
    flags_from_target_cache: bool = False
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def env_exports(profile: Profile) -> str:
    """`export NAME=value` lines for the engine's environment (sent on stdin, never in argv)."""
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(engine_env(profile).items()))


def _home_path(path: str) -> str:
    """Shell text for `path`, with a leading ~ expanded by the target's shell."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + shlex.quote(path[1:]) if path != "~" else '"$HOME"'
    return shlex.quote(path)


# Marked lines: a sitecustomize or a warning on the target may print anything around them.
VERSION_PY = """import sys
print("@@python " + sys.version.split()[0])
def engine_version():
    from importlib import metadata
    for name in DISTRIBUTIONS:  # a CPU build can be another distribution of the same package (Install.distributions)
        try:
            return metadata.version(name)
        except Exception:
            pass
    try:
        import importlib
        return importlib.import_module(DISTRIBUTION).__version__
    except Exception:
        return "-"
print("@@engine " + engine_version())
try:  # where the engine is installed and when it last changed (an upgrade, a reinstall, an edit): nothing imported
    import importlib.util, os
    origin = importlib.util.find_spec(DISTRIBUTION).origin
    newest, seen = 0, 0
    for root, dirs, files in os.walk(os.path.dirname(origin)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]  # bytecode comes and goes with every import
        for name in files:
            seen += 1
            if seen > 50000:
                break
            try:
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime_ns)
            except OSError:
                pass
    print("@@stamp %s %s %d %d" % (os.path.realpath(sys.executable), origin, newest, seen))
except Exception:
    pass
"""


def version_py(install: Install) -> str:
    """The target-side snippet that prints the python and the engine's version: `install.package` is the import
    package, `install.names` the distributions (package metadata) that may hold it, tried in order."""
    return f"DISTRIBUTION = {install.package!r}\nDISTRIBUTIONS = {list(install.names)!r}\n" + VERSION_PY

# What the target keeps of probe runs (flag tables, dry resolutions), keyed by what decides their answer.
PROBE_CACHE = '"${XDG_CACHE_HOME:-$HOME/.cache}/deployer/probes"'
PROBES_KEPT = 200
# `store FILE TEXT`: write atomically, best effort (a full disk only costs the next probe run); the oldest answers
# beyond PROBES_KEPT go. Only into a real directory of this user's that nobody else can write (`owned`), and the
# temporary file made new (noclobber: a planted file or symlink at its name is refused, never followed).
STORE_SH = """owned() { [ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ] && [ -z "$(find "$1" -maxdepth 0 -perm /022)" ]; }
store() { d=${1%%/*}; mkdir -p -m 0700 "$d" && owned "$d" && (set -C; printf '%%s\\n' "$2" > "$1.$$.tmp") &&
  mv -f "$1.$$.tmp" "$1" && (cd "$d" && ls -1t | tail -n +%d | xargs -r rm -f --); } 2>/dev/null
""" % (PROBES_KEPT + 1)

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
  out=$("$PY" -c "$VERSION_PY" 2>&1); printf '%s\n' "$out"; v=$(printf '%s\n' "$out" | sed -n 's/^@@engine //p')
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
st=$(printf '%s\n' "$out" | sed -n 's/^@@stamp //p')
case " $CACHED " in *" $v "*) ;; *) if [ -n "$v" ] && [ "$v" != - ]; then
  # the flag table, kept on the target for this engine install (any laptop's next preflight skips the probe)
  f=""; [ -n "$st" ] && f="$PROBES/flags-$(printf '%s\n' "$KIND" "$v" "$st" "$PROBE" | sha256sum | cut -c1-40).out"
  if [ -n "$f" ] && [ -s "$f" ] && [ ! -L "$f" ] && owned "$PROBES"; then cat "$f"; echo "@@cached"
  else o=$("$PY" -c "$PROBE" --flags 2>/dev/null); printf '%s\n' "$o"
    [ -n "$f" ] && case "$o" in *"$MARKER"*) store "$f" "$o" ;; esac
  fi
fi ;; esac
sec end
"""


def gather_facts(remote: Remote, profile: Profile, *, cached_versions: list[str] | tuple[str, ...] = ()) -> Facts:
    """One round trip: GPUs, processes on them, disk, engine python/version, port, model files (+ flags)."""
    engine = profile.engine
    known = engine.definition
    head = env_exports(profile) + "".join(
        f"{name}={value}\n" for name, value in (
            ("PY", shlex.quote(engine.python)), ("WORKDIR", _home_path(profile.target.workdir)),
            ("PORT", str(engine.port)), ("MODEL", _home_path(engine.model_path)),
            ("CACHED", shlex.quote(" ".join(cached_versions))),
            ("VERSION_PY", shlex.quote(version_py(known.install))),
            ("PROBE", shlex.quote(known.probe.source())), ("KIND", shlex.quote(engine.kind)),
            ("MARKER", shlex.quote(fl.PROBE_MARKER)), ("PROBES", PROBE_CACHE)))
    script = head + STORE_SH + FACTS_SCRIPT
    result = remote.run("bash -s", stdin=script.encode(), timeout=FACTS_TIMEOUT, check=False)
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
    facts.flags_from_target_cache = facts.flag_probe is not None and "@@cached" in sec.get("flags", [])
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
    marked = {line.split(" ", 1)[0]: line.split(" ", 1)[1].strip() for line in lines
              if line.startswith("@@") and " " in line}
    if "@@missing" in lines or "@@python" not in marked:
        said = next((line.strip() for line in lines if line.strip() and not line.startswith("@@")), "")
        detail = f" ({said[:160]})" if said else ""
        facts.problems.append(f"engine python {engine.python!r} not found on the target{detail}")
        return
    facts.python_version = marked["@@python"]
    facts.engine_stamp = marked.get("@@stamp")
    version = marked.get("@@engine", "-")
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
