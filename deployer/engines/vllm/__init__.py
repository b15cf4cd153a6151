"""Everything deployer knows about vLLM: the `Engine` (`spec`), its launch script template (`launch.sh.j2`), the
flag probe run on the target (`probe`), its GPU memory model (`memory`), its failure signatures (YAML data, with
the sources of their texts).

`ENGINE` is what the registry (deployer.engines) finds. May import engines.base and the leaves; never
another engine package.
"""

from deployer.engines.vllm.spec import VLLM as ENGINE

__all__ = ["ENGINE"]
