"""Command lines deployer prints for a person to paste (up's ssh tunnel and curl requests, export's `kubectl create
secret`): pasted into a real bash with hostile profile values, no command hidden in a value runs and every value
arrives at the program intact.

The programs are stand-ins (`STAND_IN`: a script named curl, ssh or kubectl on PATH that records its argv as JSON),
so nothing reaches a network; bash itself is real and reads the pasted text on its standard input, as a terminal
would hand it over.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import deployer.output.text_runs  # noqa: F401  (adds the text form of UpReport that `up` prints)
from deployer.output.text import text
from deployer.export.k8s import Export
from deployer.output.console import LiveProgress
from deployer.profile.loader import load_profile
from deployer.remote.ssh.config import encrypted_key_error
from deployer.runner.report import UpReport
from deployer.runner.up import reach_of

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")

# each would run `touch PWNED` (or start a second command line) if pasted unquoted, in single or double quotes
HOSTILE = [
    "m'; touch PWNED; '",
    "$(touch PWNED)",
    "`touch PWNED`",
    "m\ntouch PWNED\n",
    'm"; touch PWNED; "',
    "m\\'; touch PWNED #",
    "m$IFS$(touch$IFS'PWNED')",
    "m' & touch PWNED & '",
]
IDS = ["single-quote", "dollar-paren", "backticks", "newlines", "double-quote", "backslash", "ifs", "ampersand"]

STAND_IN = """#!{python}
# stand-in for {name}: records the argv it was given, does nothing else
import json, os, sys
with open(os.path.join(os.environ["ARGV_DIR"], "{name}.json"), "w") as out:
    json.dump(sys.argv[1:], out)
"""


def paste(tmp_path: Path, line: str, env: dict[str, str] | None = None) -> dict[str, list[str]]:
    """`line` checked by `bash -n`, then pasted into bash (its stdin) in `tmp_path`, with the stand-ins first on
    PATH; returns the argv each stand-in received. Fails when the paste made a file PWNED."""
    bin_dir, argv_dir = tmp_path / "bin", tmp_path / "argv"
    for folder in (bin_dir, argv_dir):
        folder.mkdir(exist_ok=True)
    for name in ("curl", "ssh", "kubectl", "ssh-add"):
        script = bin_dir / name
        script.write_text(STAND_IN.format(python=sys.executable, name=name))
        script.chmod(0o755)
    assert BASH is not None
    checked = subprocess.run([BASH, "-n"], input=line + "\n", capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, (line, checked.stderr)
    full = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ARGV_DIR": str(argv_dir), **(env or {})}
    ran = subprocess.run([BASH, "--norc", "--noprofile", "-s"], input=line + "\nwait\n", capture_output=True,
                         text=True, timeout=30, cwd=tmp_path, env=full)
    assert ran.returncode == 0, (line, ran.stderr)
    assert not (tmp_path / "PWNED").exists(), f"pasting ran a hidden command: {line!r}"
    return {p.stem: json.loads(p.read_text()) for p in sorted(argv_dir.iterdir())}


def up_hints(tmp_path: Path, capsys: pytest.CaptureFixture[str], target: dict[str, object],
             args: dict[str, object]) -> list[str]:
    """The lines `deploy up` prints after ready for a profile with these target and engine.args values (the
    profile written as JSON, which is YAML, so every value goes in exactly as given)."""
    profile = {"name": "demo", "target": {"workdir": "/srv/deployer", **target},
               "engine": {"kind": "sglang", "model_path": "Qwen/Qwen3-8B", "args": args}}
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps(profile))
    prof = load_profile(path, environ={"XDG_CONFIG_HOME": str(tmp_path / "config")})  # no user's defaults
    capsys.readouterr()
    text(UpReport(name=prof.name, host=prof.target.host, status="ready", reach=reach_of(prof)), LiveProgress())
    return capsys.readouterr().err.splitlines()


def commands(lines: list[str]) -> tuple[str, list[str]]:
    """(the tunnel's ssh command, the curl commands) out of up's printed lines; a quoted newline continues a
    command onto the next printed line, as it would in the terminal."""
    joined = "\n".join(lines)
    start = joined.index("ssh -N")
    tunnel, _, rest = joined[start:].partition(" &\n")
    curls = ["curl" + part.rstrip("\n") for part in rest.split("  curl")[1:]]
    return tunnel, curls


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_up_curl_hints_pasted_run_nothing_and_carry_the_model_name(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  value: str) -> None:
    lines = up_hints(tmp_path, capsys, {"host": "gpu-box"}, {"served_model_name": value, "api_key": "sk-x"})
    _, (models, chat) = commands(lines)
    got = paste(tmp_path, models, env={"API_KEY": "sk-pasted"})
    assert got["curl"] == ["-H", "Authorization: Bearer sk-pasted", "http://127.0.0.1:30000/v1/models"]
    got = paste(tmp_path, chat, env={"API_KEY": "sk-pasted"})
    argv = got["curl"]
    assert argv[:5] == ["-H", "Authorization: Bearer sk-pasted", "http://127.0.0.1:30000/v1/chat/completions",
                        "-H", "content-type: application/json"]
    assert argv[5] == "-d" and len(argv) == 7
    assert json.loads(argv[6])["model"] == value   # the value arrives intact, in valid JSON


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_up_ssh_tunnel_hint_pasted_runs_nothing_and_carries_user_and_host(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str],
                                                                         value: str) -> None:
    lines = up_hints(tmp_path, capsys, {"host": value, "user": value, "port": 2222}, {})
    tunnel, _ = commands(lines)
    got = paste(tmp_path, tunnel)
    assert got["ssh"] == ["-N", "-L", "30000:127.0.0.1:30000", "-p", "2222", f"{value}@{value}"]


def test_a_destination_that_looks_like_an_option_follows_a_double_dash(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    lines = up_hints(tmp_path, capsys, {"host": "gpu-box", "user": "-oProxyCommand=touch PWNED"}, {})
    got = paste(tmp_path, commands(lines)[0])
    assert got["ssh"][-2:] == ["--", "-oProxyCommand=touch PWNED@gpu-box"]


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_export_secret_command_pasted_runs_nothing_and_takes_values_from_the_shell(tmp_path: Path,
                                                                                  value: str) -> None:
    export = Export(manifests=[], secret_name=f"n{value}", secret_keys=["API_KEY", "HF_TOKEN"], namespace=value,
                    engine_version=None)
    command = export.secret_command()
    assert command is not None
    got = paste(tmp_path, command, env={"HF_TOKEN": value, "API_KEY": "sk-1"})
    assert got["kubectl"] == ["-n", value, "create", "secret", "generic", f"n{value}", "--from-literal=API_KEY=sk-1",
                              f"--from-literal=HF_TOKEN={value}"]


@pytest.mark.parametrize("value", HOSTILE, ids=IDS)
def test_ssh_add_hint_pasted_runs_nothing_and_names_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            value: str) -> None:
    """The encrypted-key hint's `ssh-add KEY` (issue 36): a key path with quotes, `$(...)` or a newline in it."""
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
    key = f"/keys/id {value}"
    message = str(encrypted_key_error([key], "root", "root@gpu-box:22"))
    command = message.split("run `", 1)[1].rsplit("` (deployer never asks", 1)[0]
    assert paste(tmp_path, command)["ssh-add"] == [key]


def test_ordinary_hints_stay_as_people_type_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Quoting adds nothing where nothing needs it: the lines a normal profile gets read as before."""
    lines = up_hints(tmp_path, capsys, {"host": "gpu-box", "user": "root", "port": 2222}, {})
    tunnel, (models, chat) = commands(lines)
    assert tunnel == "ssh -N -L 30000:127.0.0.1:30000 -p 2222 root@gpu-box"
    assert models == "curl http://127.0.0.1:30000/v1/models"
    assert chat.startswith("curl http://127.0.0.1:30000/v1/chat/completions -H 'content-type: application/json' "
                           "-d '{\"model\": \"Qwen/Qwen3-8B\"")
