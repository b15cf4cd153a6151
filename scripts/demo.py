"""`make demo`: the whole deployer flow against a throwaway sshd on 127.0.0.1 and a STAND-IN engine.

DEMO ONLY: the engine is tests/standin (a small program that prints SGLang's real log lines and serves its
endpoints; no model, no GPU). It plays an older SGLang that fails the Qwen3.6 + MTP launch the way the real one
does, so you see deployer diagnose the failure, change two settings and bring it up on the second attempt.
Needs root (the throwaway sshd logs in as root) and OpenSSH's sshd.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from deploy_helpers import write_profile  # noqa: E402
from sshbed import make_sshd  # noqa: E402


def deploy(*argv: str, env: dict[str, str]) -> int:
    print(f"\n$ deploy {' '.join(argv)}", flush=True)
    return subprocess.call([str(REPO / ".venv/bin/deploy"), *argv], env=env)


def main() -> int:
    if os.geteuid() != 0:
        print("make demo needs root: the throwaway sshd logs in as root on 127.0.0.1", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="deployer-demo-") as tmp:
        work = Path(tmp)
        bed = make_sshd(work / "sshd")
        (bed.bin_dir / "nvidia-smi").symlink_to(REPO / "tests/standin/bin/nvidia-smi")  # stand-in: one H200
        try:
            profile = write_profile(work, bed, name="qwen36-mtp-demo", model="Qwen/Qwen3.6-27B",
                                    args={"speculative_algorithm": "NEXTN", "speculative_num_steps": 3,
                                          "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4},
                                    env={"STANDIN_SGLANG_VERSION": "0.5.10", "STANDIN_STEP_S": "0.15"})
            env = {**os.environ, "DEPLOYER_HOME": str(work / "home"), "DEPLOYER_SSH_CONFIG": str(bed.ssh_config),
                   "PATH": f"{bed.bin_dir}:{os.environ.get('PATH', '')}"}
            print("DEMO: throwaway sshd on 127.0.0.1:%d, STAND-IN engine (no GPU, no model)" % bed.port)
            model = REPO / "tests/fixtures/models/qwen36-27b-like"  # config.json only, for the memory plan
            rc = deploy("up", str(profile), "--model-config", str(model), "--save-fixed", str(work / "fixed.yaml"),
                        env=env)
            deploy("status", "qwen36-mtp-demo", "--host", "deployer-test", "--workdir", str(work / "work"), env=env)
            deploy("history", "qwen36-mtp-demo", "--host", "deployer-test", "--workdir", str(work / "work"),
                   env=env)
            deploy("down", str(profile), env=env)
            print(f"\nThe profile that worked:\n{(work / 'fixed.yaml').read_text()}" if rc == 0 else "")
            return rc
        finally:
            bed.stop()


if __name__ == "__main__":
    sys.exit(main())
