"""Real vLLM 0.32.0 (CPU build) with `engine.weights` (issue 25): deployer fetches the tiny Llama from the local
stand-in of the hub's file API (tests/standin/hubstub.py) into the target's hub cache, and real vLLM loads that
commit offline (HF_HUB_OFFLINE=1, --revision pinned) and answers a real chat completion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import MODEL, free_port, vllm_engine, write_real_profile
from deploy_helpers import deploy
from lifecycle import chat, up_json
from standin.hubstub import HubStub, repo_from_dir


def test_real_vllm_loads_the_weights_deployer_fetched(tmp_path: Path, host: Any) -> None:
    home, port = tmp_path / "home", free_port()
    repo = repo_from_dir("test/tiny-llama", MODEL)
    with HubStub(repo) as hub:
        engine = vllm_engine(port, tmp_path)
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
        finally:
            deploy("down", str(prof), home=home, timeout=60)
