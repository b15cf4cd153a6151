"""Extract the v1 openAPIV3Schema of a LeaderWorkerSet CRD file into deployer/export/schemas/ (see its README).

    python scripts/vendor-lws-schema.py leaderworkerset.x-k8s.io_leaderworkersets.yaml
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parent.parent / "deployer" / "export" / "schemas" / "leaderworkerset-v1.schema.json.gz"


def main(crd_file: str) -> None:
    crd = yaml.safe_load(Path(crd_file).read_text(encoding="utf-8"))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    data = json.dumps(version["schema"]["openAPIV3Schema"], sort_keys=True, separators=(",", ":")).encode()
    with gzip.GzipFile(OUT, "wb", mtime=0) as f:
        f.write(data)
    print(f"wrote {OUT} ({len(data)} bytes of JSON)")


if __name__ == "__main__":
    main(sys.argv[1])
