"""Engine knowledge: the `Engine` interface and its parts (`base`), one package per engine (`sglang/`, `vllm/`,
each defining `ENGINE`, with its data files, launch template and probe), the engine-neutral knowledge
(`common/`), the renames and follow-on table readers (`renames`, `followons`), and the registry (`registry`,
re-exported here) that finds the engines and tells a log's engine.

Layer below profile (which validates `engine.kind` against `kinds()` and holds the one default for a profile
without one): may import only the leaves and third-party libraries, never a Profile (engines take plain values).
No engine package imports another (import-linter contract).
"""

from __future__ import annotations

from deployer.engines.base import Engine
from deployer.engines.registry import all_secret_flags, detect, detect_kind, engine_for, engines, kinds

__all__ = ["Engine", "all_secret_flags", "detect", "detect_kind", "engine_for", "engines", "kinds"]
