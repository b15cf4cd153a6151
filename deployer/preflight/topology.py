"""The GPUs a profile asks for, checked against the box's own (nvidia-smi facts) before anything is launched.

Two mistakes reach the engine otherwise and fail late or, worse, quietly: GPU indices the box does not have
(`engine.gpus: [3]` on a one-GPU box: CUDA sees no device, an engine's memory plan divides by zero), and fewer
GPUs than the engine's parallelism flags need (`tp_size: 2` with `gpus: [0]`: the memory plan halves the weights of a
model that then does not fit). The count one engine needs is the engine's own rule (Launch.gpus_per_engine);
with `nodes:` it is spread over the nodes (`--nnodes`). Pure: facts and profile in, problem lines out.
"""

from __future__ import annotations

import math
import re

from deployer.flag_names import option_key
from deployer.preflight.facts import Gpu
from deployer.profile.model import Profile

_INDICES_RE = re.compile(r"^\s*\d+(\s*,\s*\d+)*\s*$")


def visible_gpus(profile: Profile, gpus: list[Gpu]) -> tuple[list[int], str]:
    """The GPU indices the engine will see, and where that choice comes from (for the message)."""
    if profile.engine.gpus is not None:
        return list(profile.engine.gpus), "engine.gpus"
    text = profile.engine.env.get("CUDA_VISIBLE_DEVICES")
    if text is not None and _INDICES_RE.match(text):
        return [int(t) for t in text.split(",")], "engine.env.CUDA_VISIBLE_DEVICES"
    return [g.index for g in gpus], "the box"


def gpu_problems(profile: Profile, gpus: list[Gpu]) -> list[str]:
    """One line per problem: indices the box does not have, then too few GPUs for the parallelism flags."""
    if not gpus:
        return []  # no nvidia-smi answer: facts already say so
    have = sorted(g.index for g in gpus)
    box = f"the box has {len(have)} GPU{'s' if len(have) != 1 else ''}: {_indices(have)}"
    wanted, source = visible_gpus(profile, gpus)
    problems = []
    missing = [i for i in wanted if i not in have]
    if missing:
        which = ", ".join(str(i) for i in missing)
        problems.append(f"{source}: GPU {which} {'is' if len(missing) == 1 else 'are'} not on this box ({box})")
    nodes = _nodes(profile)
    need = math.ceil(profile.engine.definition.launch.gpus_per_engine(dict(profile.engine.args)) / nodes)
    if need > len(wanted):
        over = f" over {nodes} nodes" if nodes > 1 else ""
        per = " per node" if nodes > 1 else ""
        given = f"{source} gives it {len(wanted)} ({_indices(wanted)})" if source != "the box" else box
        problems.append(f"{_parallelism(profile)}{over} needs {need} GPUs{per}, but {given}")
    return problems


def _parallelism(profile: Profile) -> str:
    """`tp_size 2 x pp_size 2`: the parallelism flags the profile sets, as written."""
    args = profile.engine.args
    parts = []
    for names in profile.engine.definition.launch.gpu_flags:
        for name in names:
            value = args.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                parts.append(f"{name} {value}")
                break
    return " x ".join(parts) or "the engine"


def _nodes(profile: Profile) -> int:
    multinode = profile.engine.definition.launch.multinode
    if multinode is None:
        return 1
    value = profile.engine.args.get(option_key(multinode.nnodes))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


def _indices(indices: list[int]) -> str:
    return ", ".join(str(i) for i in indices) if indices else "none"

