"""Everything deployer knows about vLLM: the engine spec (`spec`), the flag probe run on the target
(`probe`), its failure signatures (YAML data, with the sources of their texts).

`ENGINE` is what the registry (deployer.engines) finds. May import engines.base and the leaves; never
another engine package.
"""

from deployer.engines.vllm.spec import VLLM as ENGINE

__all__ = ["ENGINE"]
