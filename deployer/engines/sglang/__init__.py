"""Everything deployer knows about SGLang: the engine spec (`spec`), the flag probe run on the target
(`probe`), its failure signatures and flag renames (YAML data).

May import engines.base and the leaves; never another engine package.
"""
