"""`make walkthrough`: follow "From zero to a served model" (docs/getting-started.md) and write docs/walkthrough.md.

Every command below really runs and its real output (stdout and stderr, with the exit code) goes into the
document. The GPU box is a throwaway OpenSSH sshd on 127.0.0.1 (tests/sshbed.py) reached through an
~/.ssh/config-style alias `gpu-box`; its "venv with a pinned SGLang" is a real venv whose `sglang` is the
STAND-IN engine (tests/standin: SGLang 0.5.23's real flags and log lines, no model, no GPU) and its
`nvidia-smi` is the stand-in too. Nothing is downloaded. Needs root (the sshd logs in as root).
The temporary directory is shown as $W in the document.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from sshbed import SSHD, make_sshd  # noqa: E402

STEP_TIMEOUT_S = 180


class Walk:
    """Runs shell commands as the reader would type them and records command, output and exit code."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work, self.env = work, env
        self.doc: list[str] = []

    def text(self, markdown: str) -> None:
        self.doc.append(markdown.strip("\n") + "\n")

    def show(self, text: str) -> str:
        return text.replace(str(self.work), "$W")

    def run(self, command: str, *, expect: int | None = 0) -> subprocess.CompletedProcess[str]:
        print(f"$ {self.show(command)}", flush=True)
        r = subprocess.run(["bash", "-c", command], env=self.env, cwd=str(REPO), capture_output=True, text=True,
                           timeout=STEP_TIMEOUT_S)
        out = (r.stdout + r.stderr).rstrip("\n")
        block = f"$ {self.show(command)}\n{self.show(out)}\n" if out else f"$ {self.show(command)}\n"
        self.doc.append(f"```console\n{block}[exit {r.returncode}]\n```\n")
        print(self.show(out), f"[exit {r.returncode}]", sep="\n", flush=True)
        if expect is not None and r.returncode != expect:
            raise SystemExit(f"walkthrough step failed: {command!r} exited {r.returncode}, expected {expect}")
        return r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fake_box(work: Path, bed: SSHD) -> Path:
    """The box's /workspace: a real venv whose `sglang` is the stand-in (a .pth line), and an HF cache dir."""
    ws = work / "workspace"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(ws / "venv")], check=True, timeout=120)
    site = next((ws / "venv").glob("lib/python3*/site-packages"))
    (site / "standin-sglang.pth").write_text(str(REPO / "tests" / "standin") + "\n")
    (ws / "hf").mkdir()
    (bed.bin_dir / "nvidia-smi").symlink_to(REPO / "tests/standin/bin/nvidia-smi")
    return ws


def ssh_config(work: Path, bed: SSHD) -> Path:
    """What a user has in ~/.ssh/config for the box; known_hosts starts empty (a box never seen before)."""
    path = work / "ssh_config"
    path.write_text(f"Host gpu-box\n    HostName {bed.host}\n    Port {bed.port}\n    User root\n"
                    f"    IdentityFile {bed.identity_file}\n    UserKnownHostsFile {work / 'known_hosts'}\n")
    (work / "known_hosts").write_text("")
    return path


def main() -> int:
    if os.geteuid() != 0:
        print("make walkthrough needs root: the throwaway sshd logs in as root on 127.0.0.1", file=sys.stderr)
        return 2
    out_path = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs" / "walkthrough.md"
    with tempfile.TemporaryDirectory(prefix="deployer-walk-") as tmp:
        work = Path(tmp)
        bed = make_sshd(work / "sshd")
        try:
            walk = Walk(work, {})
            steps(walk, work, bed)
        finally:
            bed.stop()
        out_path.write_text("".join(part + "\n" for part in walk.doc).rstrip("\n") + "\n")
        print(f"wrote {out_path}")
    return 0


def steps(walk: Walk, work: Path, bed: SSHD) -> None:
    ws = fake_box(work, bed)
    cfg = ssh_config(work, bed)
    walk.env = {"PATH": f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", "W": str(work),
                "DEPLOYER_HOME": str(work / "laptop"), "DEPLOYER_SSH_CONFIG": str(cfg)}
    ssh = f"ssh -F {cfg}"
    port = 30000 if port_free(30000) else free_port()
    local = free_port()
    walk.text(HEADER)

    walk.text("## 1. First connection: the host key\n\nThe box has never been seen: deployer refuses it, showing "
              "the key's fingerprint (compare it with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` run on "
              "the box's console), and records it only when asked.")
    walk.run("deploy status --host gpu-box", expect=3)
    walk.run("deploy status --host gpu-box --trust-new-host", expect=7)
    walk.run(f"cat {work}/known_hosts | cut -c1-60")

    walk.text("## 2. Check the GPU box\n\nThe same checks Getting started's \"The GPU box\" step asks for, over plain "
              "ssh (which now finds the host in the same known_hosts). `nvidia-smi` and `sglang` are the "
              "stand-ins here.")
    walk.run(f"{ssh} gpu-box 'nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv'")
    walk.run(f"{ssh} gpu-box 'python3 --version; ls -l /usr/lib/openssh/sftp-server; df -h {work}/workspace | tail -1'")
    walk.run(f"{ssh} gpu-box '{work}/workspace/venv/bin/python -c \"import sglang; print(sglang.__version__)\"'")
    walk.text("`hf download Qwen/Qwen3-0.6B` is **not** run here (no network on this machine; the stand-in loads "
              "no weights).")

    walk.text("## 3. Your profile\n\nCopy the starter and point it at the box: only the venv's python and the "
              "workdir differ from `profiles/starter.yaml` (the box here keeps `/workspace` under $W).")
    mine = work / "starter.yaml"
    text = (REPO / "profiles" / "starter.yaml").read_text()
    text = text.replace("/workspace/", f"{ws}/")  # the venv's python, the workdir and the HF cache
    text = text.replace("port: 30000", f"port: {port}")
    mine.write_text(text)
    walk.run(f"cp profiles/starter.yaml {work}/orig.yaml && diff -u {work}/orig.yaml {work}/starter.yaml",
             expect=1)
    walk.run(f"deploy validate {work}/starter.yaml")
    walk.run(f"deploy up {work}/starter.yaml")
    walk.run(f"deploy status {work}/starter.yaml")

    walk.text("## 4. Reach the server through an SSH port forward\n\nThe engine listens on the box's 127.0.0.1 "
              f"only. Forward a local port (here {local}) to it and talk OpenAI's API:")
    fwd = subprocess.Popen(["ssh", "-F", str(cfg), "-N", "-o", "ExitOnForwardFailure=yes", "-L",
                            f"{local}:127.0.0.1:{port}", "gpu-box"], env=walk.env, stdin=subprocess.DEVNULL)
    try:
        wait_port(local)
        walk.text(f"```console\n$ ssh -N -L {local}:127.0.0.1:{port} gpu-box &\n```\n")
        walk.run(f"curl -sS localhost:{local}/v1/models")
        walk.run(f"curl -sS localhost:{local}/v1/chat/completions -H 'content-type: application/json' "
                 "-d '{\"model\": \"Qwen/Qwen3-0.6B\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                 "\"max_tokens\": 8}'")
    finally:
        fwd.terminate()
        fwd.wait(timeout=10)

    walk.text("## 5. On call: a change that crashes after ready\n\nSomeone deploys a change; it passes its start, "
              "then the engine dies under load, is restarted by the supervisor, dies again: a crash loop "
              "(the stand-in is told to crash 2 s after ready; `restart.max: 1` keeps the walkthrough short).")
    walk.run(f"deploy up {work}/starter.yaml --set engine.args.context_length=16384 "
             "--set engine.env.STANDIN_MODE=crash_after_ready --set engine.env.STANDIN_CRASH_AFTER_S=2 "
             "--set restart.max=1 --set restart.backoff_s=[1,1]")
    for _ in range(60):  # bounded: ~30 s for the crash loop to settle
        r = subprocess.run(["bash", "-c", f"deploy status {work}/starter.yaml --json"], env=walk.env,
                           capture_output=True, text=True, timeout=60)
        if '"crashloop"' in r.stdout:
            break
        time.sleep(0.5)
    walk.text("The monitor's check fails (`deploy status` exits 5: crashed or crash-looping). From any laptop "
              "with the ssh alias, the name is enough:")
    oncall = f"--host gpu-box --workdir {work}/workspace/deployer"
    walk.run(f"deploy status starter {oncall}", expect=5)
    walk.run(f"deploy logs starter {oncall} -n 8")
    walk.run(f"deploy diagnose starter {oncall}")
    walk.run(f"deploy history starter {oncall}")
    walk.run(f"deploy rollback starter {oncall}")
    walk.run(f"deploy status starter {oncall}")

    walk.text("## 6. Stop it\n\n`deploy status` then exits 8 (stopped), so a monitor does not mistake a "
              "deliberate stop for a crash.")
    walk.run(f"deploy down starter {oncall}")
    walk.run(f"deploy status starter {oncall}", expect=8)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"ssh -L did not open port {port}")


HEADER = """
# Walkthrough: from zero to a served model, for real

Generated by `make walkthrough` (scripts/walkthrough.py): every command below ran, in this order, and the text
under it is its real output (stdout and stderr) with its exit code. The GPU box is a throwaway OpenSSH sshd on
127.0.0.1 reached as the ssh alias `gpu-box`; the engine is the **stand-in** SGLang (its real flags and log
lines, no model, no GPU) and so is `nvidia-smi`. `$W` is the run's temporary directory, which holds the box's
`/workspace` and the laptop's `ssh_config`/`known_hosts` (`DEPLOYER_SSH_CONFIG` points at it). On a real box the
commands are the same without `$W` paths and `--workdir` (it defaults to `/workspace/deployer`).
"""


if __name__ == "__main__":
    sys.exit(main())
