"""Manifests as YAML files: one file per component, several documents each, stable key order."""

from __future__ import annotations

from pathlib import Path

import yaml

from deployer.export.k8s import Export

class _NoAliases(yaml.SafeDumper):
    """Shared sub-objects (one probe action used by three probes) are written out, never as &anchors."""

    def ignore_aliases(self, data: object) -> bool:
        return True


HEADER = "# Written by `deploy export k8s` from profile {name}; deployer {version}. Edit the profile, not this file.\n"


def texts(export: Export, profile_name: str, version: str) -> list[tuple[str, str]]:
    """(filename, YAML text) for each manifest."""
    out = []
    for manifest in export.manifests:
        body = yaml.dump_all(manifest.objects, Dumper=_NoAliases, sort_keys=False, default_flow_style=False,
                             width=100)
        out.append((manifest.filename, HEADER.format(name=profile_name, version=version) + body))
    return out


def write(directory: Path, files: list[tuple[str, str]]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files:
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
