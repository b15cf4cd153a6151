"""Everything deployer knows about SGLang: the engine spec (`spec`), the flag probe run on the target
(`probe`), its failure signatures and flag renames (YAML data).

`ENGINE` is what the registry (deployer.engines) finds. May import engines.base and the leaves; never
another engine package.
"""

from deployer.engines.sglang.spec import SGLANG as ENGINE

__all__ = ["ENGINE"]
