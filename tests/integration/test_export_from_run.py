"""`deploy export k8s --from-run`: the run that last reached ready on a real target (after healing) becomes the
manifests, with the healed flags and no secret value; a deployment that never reached ready is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import deploy, write_profile

pytestmark = pytest.mark.integration

MTP_ARGS = {"speculative_algorithm": "NEXTN", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4, "tp_size": 1}
TOKEN = "hf_fromRunSecretValue99"


def test_export_from_the_healed_run(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="qwen36-k8s", model="Qwen/Qwen3.6-27B", args=MTP_ARGS,
                         env={"STANDIN_SGLANG_VERSION": "0.5.10", "HF_TOKEN": "${HF_TOKEN}"})
    home = tmp_path / "h"
    up = deploy("up", str(prof), "--skip-preflight", home=home, env={"HF_TOKEN": TOKEN})
    assert up.returncode == 0, up.stderr
    out = tmp_path / "k8s"
    host = "deployer-test"
    env = {"DEPLOYER_SSH_CONFIG": str(sshd.ssh_config)}
    run = deploy("export", "k8s", "--from-run", "qwen36-k8s", "--host", host, "--workdir", str(tmp_path / "work"),
                 "--image", "lmsysorg/sglang:v0.5.10", "-o", str(out), "--check", home=home, env=env)
    assert run.returncode == 0, run.stderr
    assert "(the last that reached ready)" in run.stderr
    text = (out / "engine.yaml").read_text()
    (deployment, _service) = [d for d in yaml.safe_load_all(text) if d]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    # the heal of attempt 1 (extra_buffer + SGLANG_ENABLE_SPEC_V2) is what the cluster gets
    assert args[args.index("--mamba-scheduler-strategy") + 1] == "extra_buffer"
    env_names = {e["name"]: e for e in container["env"]}
    assert env_names["SGLANG_ENABLE_SPEC_V2"]["value"] == "1"
    assert env_names["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "HF_TOKEN"
    assert TOKEN not in text and TOKEN not in run.stderr + run.stdout
    deploy("down", str(prof), home=home)


def test_export_from_a_run_that_never_got_ready_is_refused(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="never-ready", args={"mem_fraction_static": 0.9},
                         env={"STANDIN_MODE": "mem", "STANDIN_MAX_MFS": "0.1"},
                         extra={"retry": {"max_attempts": 1, "backoff_s": 0.1}})
    home = tmp_path / "h"
    up = deploy("up", str(prof), "--skip-preflight", "--no-heal", home=home)
    assert up.returncode == 5, up.stderr
    run = deploy("export", "k8s", "--from-run", "never-ready", "--host", "deployer-test",
                 "--workdir", str(tmp_path / "work"), "--image", "lmsysorg/sglang:v0.5.23", home=home,
                 env={"DEPLOYER_SSH_CONFIG": str(sshd.ssh_config)})
    assert run.returncode == 7 and "ever reached ready" in run.stderr and "Traceback" not in run.stderr
