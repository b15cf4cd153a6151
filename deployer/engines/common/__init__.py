"""Engine-neutral knowledge every engine uses: the failures whose text is not the engine's own but a library's
or the system's (Hugging Face hub, ports, Python imports of a broken install, CUDA, NCCL, Gloo), as data in
`signatures.yaml`.

Not an engine (defines no `ENGINE`): `deployer.diagnose.signatures.load_signatures(kind)` gives an engine's own
signatures first, then these; `load_signatures(None)` (a log whose engine cannot be told) gives only these.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).parent
SIGNATURES_FILE = DATA_DIR / "signatures.yaml"
