"""Helpers for the managed-environment tests (engine.install, router.install): a tiny real wheel made by hand, the
stand-in engine's profile with `engine.install`, the environments published under a workdir."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import yaml

from deploy_helpers import write_profile

PACKAGE = "h25tiny"


def make_wheel(folder: Path, version: str, package: str = PACKAGE, requires: tuple[str, ...] = ()) -> Path:
    """A real (tiny, pure-Python) wheel of `package` at `version` (its dependencies `requires`), written by hand: a
    wheel is a zip with its dist-info (PEP 427), so no build backend or network is needed."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{package}-{version}.dist-info"
    needs = "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{package}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n{needs}".encode(),
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


TORCH_CU128 = "torch==2.8.0+cu128"


def cuda_mismatch(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A find-links dir with a torch built for CUDA 12.8 (as its local version says) and the engine env that makes
    the stand-in nvidia-smi report a driver for CUDA 11.4: what the compatibility preflight must refuse."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "2.8.0+cu128", package="torch")
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"driver_version": "470.57.02", "cuda_version": "11.4",
                                "gpus": [{"name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920}]}))
    return wheels, {"STANDIN_GPUS_FILE": str(gpus)}


def refused_for_cuda(stderr: str) -> list[str]:
    """The lines of a refused `up` that say the torch needs a newer driver."""
    return [line for line in stderr.splitlines() if "torch 2.8.0+cu128 needs CUDA 12.8" in line and
            "supports CUDA 11.4" in line]
