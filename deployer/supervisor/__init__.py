"""The supervisor: runs ON THE TARGET with its system python3 (>= 3.8), one real package.

STANDARD LIBRARY ONLY: it imports nothing from deployer outside this package and no third-party module
(an import-linter contract enforces it). Its modules import each other relatively (`from .base import
...`): here as `deployer.supervisor.*`, on the target as the package deployer_supervisor that the programs built
by deployer/remote/program.py load from their own text (the helper, a run dir's supervise.py). Other packages may
import its constants and parsers (e.g. the env file format).
"""
