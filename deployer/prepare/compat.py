"""The compatibility preflight: the host's facts (driver, GPUs, Python, /dev/shm, disk) against what the
environment would install (the dry resolution) and what the engine is asked to run (its args and env), before
anything is installed or launched. The rules are data (compat.yaml), each with its source; a check is a function
in CHECKS named by its rule. Pure: the facts come from the target through FACT_COMMANDS' answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Callable, Mapping

import yaml

from deployer.prepare.envspec import ResolvedDist, canonical_name

Capability = tuple[int, int]
CudaVersion = tuple[int, int]

# What the helper runs on the target for these facts (each answer parsed below).
FACT_COMMANDS: dict[str, list[str]] = {
    "smi": ["nvidia-smi"],
    "caps": ["nvidia-smi", "--query-gpu=index,name,compute_cap", "--format=csv,noheader"],
    "shm": ["df", "-PB1", "/dev/shm"],
}
_SMI_DRIVER = re.compile(r"Driver Version\s*:?\s*(?P<driver>\d+(?:\.\d+)+)", re.I)
_SMI_CUDA = re.compile(r"CUDA Version\s*:?\s*(?P<major>\d+)\.(?P<minor>\d+)", re.I)
_CU_LOCAL = re.compile(r"^cu(?P<digits>\d{3,4})$")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    capability: Capability

    @property
    def sm(self) -> str:
        return f"sm{self.capability[0]}{self.capability[1]}"


@dataclass(frozen=True)
class HostFacts:
    """What the target is: its driver (and the newest CUDA it supports), GPUs, the build python, /dev/shm, free
    bytes where the environment and the weights go (None: not known, the rule is skipped)."""

    driver_version: str | None = None
    driver_cuda: CudaVersion | None = None
    gpus: tuple[Gpu, ...] = ()
    python_version: str | None = None
    shm_bytes: int | None = None
    env_free_bytes: int | None = None
    weights_free_bytes: int | None = None
    same_filesystem: bool = True


@dataclass(frozen=True)
class Demand:
    """What the deployment asks of the host: the engine, its flags and environment, how many GPUs one host uses,
    and the weights it must hold (bytes still to fetch; 0 when on disk, None when unknown)."""

    engine_kind: str
    args: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    gpus_used: int = 1
    weights_bytes: int | None = None


@dataclass(frozen=True)
class Problem:
    rule: str
    severity: str          # "error" refuses, "warning" is shown
    line: str              # one line: what is wrong and what to change
    source: str


@dataclass(frozen=True)
class Rule:
    id: str
    check: str
    severity: str
    source: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Context:
    """One check's inputs: the facts, the resolution, the demand, and the rule's parameters."""

    facts: HostFacts
    resolved: tuple[ResolvedDist, ...]
    demand: Demand
    params: Mapping[str, Any]

    def dist(self, name: str) -> ResolvedDist | None:
        key = canonical_name(name)
        return next((d for d in self.resolved if d.key == key), None)


# --- facts from the target's answers -------------------------------------------------------------------------


def parse_smi(text: str) -> tuple[str | None, CudaVersion | None]:
    """nvidia-smi's banner (`| NVIDIA-SMI 580.95.05  Driver Version: 580.95.05  CUDA Version: 13.0 |`) or
    `nvidia-smi --version` (`CUDA Version : 13.0`) -> (driver version, the newest CUDA the driver supports)."""
    driver = _SMI_DRIVER.search(text)
    cuda = _SMI_CUDA.search(text)
    return (driver.group("driver") if driver else None,
            (int(cuda.group("major")), int(cuda.group("minor"))) if cuda else None)


def parse_caps(text: str) -> tuple[Gpu, ...]:
    """`nvidia-smi --query-gpu=index,name,compute_cap --format=csv,noheader` (`0, NVIDIA H200, 9.0`) -> GPUs."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit() and re.match(r"^\d+\.\d+$", parts[-1]):
            major, minor = parts[-1].split(".")
            out.append(Gpu(int(parts[0]), ", ".join(parts[1:-1]), (int(major), int(minor))))
    return tuple(out)


def parse_df_available(text: str) -> int | None:
    """`df -PB1 PATH`'s last line -> its available bytes (the 4th column)."""
    lines = [line for line in text.splitlines() if line.strip()]
    fields = lines[-1].split() if lines else []
    return int(fields[3]) if len(fields) >= 4 and fields[3].isdigit() else None


def torch_cuda(resolved: tuple[ResolvedDist, ...]) -> tuple[ResolvedDist | None, str | None, CudaVersion | None]:
    """(torch, its build label, the CUDA it was built for): from torch's local version (`2.8.0+cu128` -> cu128,
    12.8; `+cpu` -> cpu, None), else from the CUDA runtime wheel it pulls (`nvidia-cuda-runtime-cu12 12.8.90`)."""
    torch = next((d for d in resolved if d.key == "torch"), None)
    if torch is None:
        return None, None, None
    _, plus, local = torch.version.partition("+")
    if plus:
        match = _CU_LOCAL.match(local)
        if match:
            digits = match.group("digits")
            return torch, local, (int(digits[:-1]), int(digits[-1]))
        return torch, local, None
    runtime = next((d for d in resolved if re.match(r"^nvidia-cuda-runtime(-cu\d+)?$", d.key)), None)
    if runtime is not None:
        parts = re.findall(r"\d+", runtime.version)
        if len(parts) >= 2:
            return torch, f"cu{parts[0]}{parts[1]}", (int(parts[0]), int(parts[1]))
    return torch, None, None


# --- the checks --------------------------------------------------------------------------------------------


def _fmt_cuda(version: CudaVersion) -> str:
    return f"{version[0]}.{version[1]}"


def _cuda_param(text: str) -> CudaVersion:
    major, minor = str(text).split(".")
    return int(major), int(minor)


def driver_cuda_major(ctx: Context) -> list[str]:
    torch, label, needs = torch_cuda(ctx.resolved)
    have = ctx.facts.driver_cuda
    if torch is None or needs is None or have is None or have[0] >= needs[0]:
        return []
    driver = ctx.params.get("min_driver", {}).get(str(needs[0]), "?")
    return [f"torch {torch.version} needs CUDA {_fmt_cuda(needs)}, the driver {ctx.facts.driver_version or ''} "
            f"supports CUDA {_fmt_cuda(have)} (nvidia-smi): upgrade the driver to >= {driver}, or ask for a torch "
            f"built for CUDA {have[0]}.x (e.g. engine.install.extra_index_urls: "
            f"https://download.pytorch.org/whl/cu{have[0]}{have[1]})".replace("driver  ", "driver ")]


def driver_cuda_minor(ctx: Context) -> list[str]:
    torch, _, needs = torch_cuda(ctx.resolved)
    have = ctx.facts.driver_cuda
    if torch is None or needs is None or have is None or have[0] != needs[0] or have >= needs:
        return []
    return [f"torch {torch.version} is built for CUDA {_fmt_cuda(needs)}, the driver supports CUDA "
            f"{_fmt_cuda(have)}: it runs through minor version compatibility, with a limited feature set; upgrade "
            f"the driver, or ask for a torch built for CUDA <= {_fmt_cuda(have)}"]


def torch_local_build(ctx: Context) -> list[str]:
    torch, label, _ = torch_cuda(ctx.resolved)
    if torch is None or label is None or not ctx.facts.gpus:
        return []
    if not any(label.startswith(p) for p in ctx.params.get("not_for_nvidia", ())):
        return []
    return [f"torch {torch.version} is a {label} build, and this host's GPUs are NVIDIA ones: ask for a CUDA build "
            f"(e.g. engine.install.extra_index_urls: https://download.pytorch.org/whl/cu128, or drop the find_links "
            f"or index that serves the {label} wheel)"]


def capability_needs_cuda(ctx: Context) -> list[str]:
    torch, _, needs = torch_cuda(ctx.resolved)
    floor = _cuda_param(ctx.params["min_cuda"])
    new = [g for g in ctx.facts.gpus if g.capability[0] >= int(ctx.params["min_major"])]
    if torch is None or needs is None or not new or needs >= floor:
        return []
    gpu = new[0]
    return [f"GPU {gpu.index} ({gpu.name}, {gpu.sm}) needs a torch built for CUDA >= {_fmt_cuda(floor)}; torch "
            f"{torch.version} is built for CUDA {_fmt_cuda(needs)}: ask for a cu{floor[0]}{floor[1]} (or newer) build"]


def kernel_capability(ctx: Context) -> list[str]:
    """An engine kernel the profile selects (a flag value or an env value) that the GPUs' architecture lacks."""
    params, demand = ctx.params, ctx.demand
    if demand.engine_kind != params["engine"]:
        return []
    if "arg" in params:
        chosen, where = demand.args.get(params["arg"]), f"engine.args.{params['arg']}"
    else:
        chosen, where = demand.env.get(params["env"]), f"engine.env.{params['env']}"
    if chosen is None or str(chosen) not in [str(v) for v in params["values"]]:
        return []
    majors = [int(m) for m in params["majors"]]
    bad = [g for g in ctx.facts.gpus if g.capability[0] not in majors]
    if not bad:
        return []
    gpu = bad[0]
    archs = "/".join(f"sm{m}x" for m in majors)
    return [f"{where}={chosen} needs {archs}; GPU {gpu.index} ({gpu.name}) is {gpu.sm}: use {params['instead']}"]


def min_capability(ctx: Context) -> list[str]:
    if ctx.demand.engine_kind != ctx.params["engine"]:
        return []
    floor = _cuda_param(ctx.params["min"])
    old = [g for g in ctx.facts.gpus if g.capability < floor]
    if not old:
        return []
    gpu = old[0]
    return [f"{ctx.demand.engine_kind} needs compute capability >= {ctx.params['min']}; GPU {gpu.index} ({gpu.name}) "
            f"has {gpu.capability[0]}.{gpu.capability[1]}: use another GPU or another engine"]


def wheel_python_tags(ctx: Context) -> list[str]:
    version = ctx.facts.python_version
    if not version:
        return []
    major, minor = (int(p) for p in version.split(".")[:2])
    out = []
    for dist in ctx.resolved:
        name = dist.filename
        if not name or not name.endswith(".whl"):
            continue
        parts = name[:-4].split("-")
        if len(parts) < 5 or _python_fits(parts[-3], parts[-2], major, minor):
            continue
        out.append(f"{name} is for {parts[-3]}, not Python {major}.{minor}: set engine.install.python to a "
                   f"matching interpreter or pin a version of {dist.name} with a {_tag(major, minor)} wheel")
    return out[:3]


def _tag(major: int, minor: int) -> str:
    return f"cp{major}{minor}"


def _python_fits(python_tags: str, abi_tags: str, major: int, minor: int) -> bool:
    for tag in python_tags.split("."):
        match = re.match(r"^(?P<impl>py|cp)(?P<digits>\d+)$", tag)
        if not match:
            continue
        digits = match.group("digits")
        tag_major, tag_minor = int(digits[0]), int(digits[1:] or -1)
        if match.group("impl") == "py" and tag_major == major and (tag_minor < 0 or tag_minor <= minor):
            return True
        if tag_major == major and tag_minor == minor:
            return True
        if "abi3" in abi_tags.split(".") and tag_major == major and 0 <= tag_minor <= minor:
            return True
    return False


def shm_for_gpus(ctx: Context) -> list[str]:
    shm, floor = ctx.facts.shm_bytes, int(ctx.params["min_bytes"])
    if shm is None or ctx.demand.gpus_used < 2 or shm >= floor:
        return []
    return [f"/dev/shm has {_gib(shm)} free and {ctx.demand.gpus_used} GPUs talk through it (NCCL): give it >= "
            f"{_gib(floor)} (a container: --shm-size=16g or --ipc=host; a host: mount -o remount,size=16G /dev/shm)"]


def estimate_env_bytes(resolved: tuple[ResolvedDist, ...], unpack_factor: float) -> tuple[int, int]:
    """(the installed size the environment will take, how many distributions had no known size): what
    `deploy plan` shows and the disk rule checks."""
    sizes = [d.size for d in resolved if d.size is not None]
    return int(sum(sizes) * unpack_factor), len(resolved) - len(sizes)


def disk_space(ctx: Context) -> list[str]:
    facts, params = ctx.facts, ctx.params
    env_bytes, unknown = estimate_env_bytes(ctx.resolved, float(params["unpack_factor"]))
    weights = ctx.demand.weights_bytes or 0
    margin = int(params["margin_bytes"])
    if facts.same_filesystem or facts.weights_free_bytes is None:
        need, free = env_bytes + weights + margin, facts.env_free_bytes
        return _short(free, need, f"the environment (~{_gib(env_bytes)}) and the weights ({_gib(weights)})",
                      unknown)
    return (_short(facts.env_free_bytes, env_bytes + margin, f"the environment (~{_gib(env_bytes)})", unknown)
            + _short(facts.weights_free_bytes, weights + margin, f"the weights ({_gib(weights)})", 0))


def _short(free: int | None, need: int, what: str, unknown: int) -> list[str]:
    if free is None or free >= need:
        return []
    note = f" (and {unknown} packages of unknown size)" if unknown else ""
    return [f"{what}{note} need {_gib(need)} with the margin, {_gib(free)} is free: free space on the target or "
            "point target.workdir / HF_HOME at a larger disk"]


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.1f} GiB"


CHECKS: dict[str, Callable[[Context], list[str]]] = {
    "driver_cuda_major": driver_cuda_major, "driver_cuda_minor": driver_cuda_minor,
    "torch_local_build": torch_local_build, "capability_needs_cuda": capability_needs_cuda,
    "kernel_capability": kernel_capability, "min_capability": min_capability,
    "wheel_python_tags": wheel_python_tags, "shm_for_gpus": shm_for_gpus, "disk_space": disk_space,
}


@lru_cache(maxsize=1)
def load_rules() -> tuple[Rule, ...]:
    text = resources.files("deployer.prepare").joinpath("compat.yaml").read_text(encoding="utf-8")
    rules = tuple(Rule(id=str(r["id"]), check=str(r["check"]), severity=str(r["severity"]),
                       source=str(r["source"]), params=r.get("params") or {}) for r in yaml.safe_load(text)["rules"])
    unknown = [r.check for r in rules if r.check not in CHECKS]
    if unknown:
        raise ValueError(f"compat.yaml names checks that do not exist: {', '.join(unknown)}")
    return rules


def check(facts: HostFacts, resolved: tuple[ResolvedDist, ...], demand: Demand,
          rules: tuple[Rule, ...] | None = None) -> list[Problem]:
    """Every rule against the facts: the problems, errors first, each one line saying what to change."""
    out = []
    for rule in rules if rules is not None else load_rules():
        ctx = Context(facts, tuple(resolved), demand, rule.params)
        out += [Problem(rule.id, rule.severity, line, rule.source) for line in CHECKS[rule.check](ctx)]
    return sorted(out, key=lambda p: p.severity != "error")
