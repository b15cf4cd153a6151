"""Red team, issue #34 finding 2 (the engine's side): SGLang's API key out of every command line.

Another local user reads `/proc/PID/cmdline` of any process. SGLang (0.5.10, 0.5.23) reads --api-key only from its
argv, so deployer starts it through a one-line shim that appends the key to the module's sys.argv in memory, from
the 0600 env file (render/bundle.py ARGV_SHIM): while the stand-in SGLang serves, no /proc/*/cmdline on the bed holds
the key, and its API answers 401 without it (as SGLang's middleware does), 200 with it."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import deploy, write_profile

pytestmark = pytest.mark.integration
KEY = "sk-redteam-engine-key-5d0c9e1a"


def _cmdlines() -> dict[int, bytes]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                out[int(name)] = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
    return out


def _chat(port: int, key: str | None) -> int:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_the_sglang_api_key_is_in_no_command_line_and_requests_need_it(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="keyed", args={"api_key": KEY})
    assert yaml.safe_load(prof.read_text())["engine"].get("kind", "sglang") == "sglang"
    home = tmp_path / "h"
    up = deploy("up", str(prof), "--skip-preflight", home=home)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        lines = _cmdlines()
        engines = [pid for pid, line in lines.items() if b"sglang.launch_server" in line and str(tmp_path).encode()
                   in Path(f"/proc/{pid}/environ").read_bytes()] if lines else []
        assert engines, "the stand-in SGLang was not found among the processes"
        holders = {pid: line.replace(b"\0", b" ")[:300] for pid, line in lines.items() if KEY.encode() in line}
        assert not holders, holders
        port = int(yaml.safe_load(prof.read_text())["engine"]["port"])
        assert _chat(port, None) == 401 and _chat(port, "sk-wrong") == 401
        assert _chat(port, KEY) == 200
        run = Path(json.loads(deploy("status", str(prof), "--json", home=home).stdout)["run_dir"])
        assert KEY not in (run / "launch.sh").read_text() and KEY in (run / "env").read_text()
    finally:
        deploy("down", str(prof), home=home)
