"""The supervisor: runs ON THE TARGET with its system python3 (>= 3.8), pushed into every run dir as files.

STANDARD LIBRARY ONLY: it imports nothing from deployer outside this package and no third-party module
(an import-linter contract enforces it). Beside each other on the target its modules import each other by
their bare names (`supervise_base`), here as `deployer.supervisor.*`. Other packages may import its
constants and parsers (e.g. the env file format).
"""
