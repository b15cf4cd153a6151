"""render/bundle.py's ARGV_SHIM run for real (a stand-in module, not SGLang): the module runs as `-m` would run it
(`__main__`, its argv after its name), the secret flags appended from the environment, and the process's own
command line (/proc/self/cmdline, what other local users read) never holds a secret value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from deployer.render.bundle import ARGV_SHIM, SECRET_ARGV_VAR

MODULE = """
import json, sys
with open("/proc/self/cmdline", "rb") as f:
    cmdline = f.read().decode().split("\\0")
print(json.dumps({"name": __name__, "argv": sys.argv[1:], "cmdline": cmdline, "argv0": sys.argv[0]}))
"""


def test_the_shim_appends_the_secret_words_in_memory_only(tmp_path: Path) -> None:
    (tmp_path / "standin_engine_mod.py").write_text(MODULE)
    words = ["--api-key", ["", "DEPLOYER_SECRET_API_KEY"], "--lora-paths", "plain", ["x=", "DEPLOYER_SECRET_L_1"]]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path), SECRET_ARGV_VAR: json.dumps(words),
           "DEPLOYER_SECRET_API_KEY": "sk-shim-secret-1", "DEPLOYER_SECRET_L_1": "lora-secret-2"}
    out = subprocess.run([sys.executable, "-c", ARGV_SHIM, "standin_engine_mod", "--port", "1"], env=env,
                         capture_output=True, timeout=30, check=True).stdout
    seen = json.loads(out)
    assert seen["name"] == "__main__" and seen["argv0"].endswith("standin_engine_mod.py")
    assert seen["argv"] == ["--port", "1", "--api-key", "sk-shim-secret-1", "--lora-paths", "plain", "x=lora-secret-2"]
    shown = " ".join(seen["cmdline"])
    assert "sk-shim-secret-1" not in shown and "lora-secret-2" not in shown and "standin_engine_mod" in shown


def test_without_secret_words_the_shim_is_plain_dash_m(tmp_path: Path) -> None:
    (tmp_path / "standin_engine_mod.py").write_text(MODULE)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", ARGV_SHIM, "standin_engine_mod", "--x"], env=env,
                         capture_output=True, timeout=30, check=True).stdout
    assert json.loads(out)["argv"] == ["--x"]
