"""Engine-neutral knowledge every engine uses: the failures whose text is not the engine's own but a library's
or the system's (Hugging Face hub, ports, Python imports of a broken install, CUDA, NCCL, Gloo), as data in
`signatures.yaml`; the lines after which a server never becomes ready though it may not exit (`fatal.yaml`); and
the lines that are never evidence of a failure (`noise.yaml`).

Not an engine (defines no `ENGINE`): `deployer.diagnose.signatures.load_signatures(engine)` gives an engine's own
signatures first, then these; `load_signatures(None)` (a log whose engine cannot be told) gives only these.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

DATA_DIR = Path(__file__).parent
SIGNATURES_FILE = DATA_DIR / "signatures.yaml"
FATAL_FILE = DATA_DIR / "fatal.yaml"
NOISE_FILE = DATA_DIR / "noise.yaml"
# What an engine gets to exit by itself after a fatal line before it is ended (one that exits does so in a second
# or two): the watcher of a start and the supervisor of a restart both wait this long.
FATAL_GRACE_S = 5.0


def fatal_patterns() -> tuple[re.Pattern[str], ...]:
    """The compiled patterns of fatal.yaml."""
    entries = yaml.safe_load(FATAL_FILE.read_text(encoding="utf-8")) or []
    return tuple(re.compile(str(entry["pattern"])) for entry in entries)


def noise_patterns() -> tuple[re.Pattern[str], ...]:
    """The compiled patterns of noise.yaml: lines that are never evidence of why an engine failed."""
    entries = yaml.safe_load(NOISE_FILE.read_text(encoding="utf-8")) or []
    return tuple(re.compile(str(entry["pattern"])) for entry in entries)
