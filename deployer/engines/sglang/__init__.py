"""Everything deployer knows about SGLang: the `Engine` (`spec`), its launch script template (`launch.sh.j2`), the
flag probe run on the target (`probe`), its GPU memory model (`memory`), its failure signatures, flag renames and
follow-on checks (YAML data).

`ENGINE` is what the registry (deployer.engines) finds. May import engines.base and the leaves; never
another engine package.
"""

from deployer.engines.sglang.spec import SGLANG as ENGINE

__all__ = ["ENGINE"]
