"""Helpers for the managed-environment tests (engine.install, router.install): a tiny real wheel made by hand, the
stand-in engine's profile with `engine.install`, the environments published under a workdir."""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path
from typing import Any

import yaml

from deploy_helpers import write_profile

PACKAGE = "h25tiny"


def make_wheel(folder: Path, version: str, package: str = PACKAGE) -> Path:
    """A real (tiny, pure-Python) wheel of `package` at `version`, written by hand: a wheel is a zip with its
    dist-info (PEP 427), so no build backend or network is needed."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{package}-{version}.dist-info"
    files = {
        f"{package}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: deployer-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for name, data in files.items()) + f"{dist}/RECORD,,\n"
    path = folder / f"{package}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{dist}/RECORD", record)
    return path


def install_profile(tmp_path: Path, sshd: Any, wheels: Path, version: str, name: str = "envdemo",
                    packages: list[str] | None = None, env: dict[str, str] | None = None,
                    python: str = "/usr/bin/python3") -> Path:
    """The stand-in engine's profile with `engine.install` instead of `engine.python`."""
    path = write_profile(tmp_path, sshd, name=name, env=env)
    data = yaml.safe_load(path.read_text())
    data["engine"].pop("python")
    empty_index = tmp_path / "empty-index"
    empty_index.mkdir(exist_ok=True)
    data["engine"]["install"] = {"packages": packages or [f"{PACKAGE}=={version}"], "find_links": [str(wheels)],
                                 "index_url": empty_index.as_uri(), "python": python}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def envs(work: Path) -> dict[str, str]:
    """Published environments: <digest> -> the build dir it links to."""
    root = work / ".deployer" / "envs"
    return {p.name: os.readlink(p) for p in root.iterdir() if p.is_symlink()} if root.is_dir() else {}
