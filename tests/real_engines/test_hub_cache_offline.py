"""The real huggingface_hub and transformers (the real vLLM venv's) read what deployer's fetch left in a hub cache,
offline, as the engines do with HF_HUB_OFFLINE=1. In this tier (not the fast one) because it needs the real-engine
venv and the tiny model, which `make real-engines` builds after `make test`: in the fast tier it always skipped on a
fresh CI machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import MODEL as TINY, VLLM_VENV as REAL_VENV
from standin.hubstub import HubStub


def test_the_real_huggingface_hub_reads_the_cache_offline(tmp_path: Path) -> None:
    """What the engines do with HF_HUB_OFFLINE=1: the real huggingface_hub and transformers find the fetched
    commit (pinned and through refs/main), and the cache scan finds nothing corrupt."""
    from deployer.prepare.weights import WeightsPlan
    from deployer.remote.local import LocalRemote
    from deployer.box.weights import fetch
    from standin.hubstub import repo_from_dir

    repo = repo_from_dir("test/tiny-llama", TINY)
    with HubStub(repo) as hub:
        fetch(LocalRemote(), WeightsPlan("test/tiny-llama", "main", str(tmp_path / "hub"), hub.endpoint, None),
              lambda e: None)
    code = f"""
import sys
from huggingface_hub import scan_cache_dir, snapshot_download
from transformers import AutoConfig, AutoTokenizer
pinned = snapshot_download("test/tiny-llama", revision="{repo.commit}")
main = snapshot_download("test/tiny-llama")
assert pinned == main and pinned.endswith("{repo.commit}"), (pinned, main)
AutoConfig.from_pretrained("test/tiny-llama", revision="{repo.commit}")
AutoTokenizer.from_pretrained("test/tiny-llama", revision="{repo.commit}")
scan = scan_cache_dir()
assert not scan.warnings, scan.warnings
repos = list(scan.repos)
assert [r.repo_id for r in repos] == ["test/tiny-llama"] and repos[0].nb_files == {len(repo.files)}, repos
print("ok", pinned)
"""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path),
           "HF_HUB_CACHE": str(tmp_path / "hub")}
    done = subprocess.run([str(REAL_VENV / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0 and "ok " in done.stdout, done.stderr[-3000:]
