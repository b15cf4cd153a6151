"""A definite HTTP answer to the readiness probe ends the wait at once (issue 36): the stand-in vLLM serving a
model name other than the profile's (STANDIN_SERVES_MODEL, a stand-in-only mode) answers the probe with real vLLM's
404 "The model `X` does not exist."; `up` fails within seconds, not after startup_timeout_s, names both models,
is not called a hang and is not retried as transient."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from deploy_helpers import deploy, events, write_profile

pytestmark = pytest.mark.integration

TIMEOUT_S = 30


def test_a_404_to_the_probe_ends_the_wait_at_once_naming_the_model(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="wrongname", args={"served_model_name": "asked-name"},
                         env={"STANDIN_SERVES_MODEL": "served-name"},
                         extra={"engine": {"kind": "vllm"}, "health": {"startup_timeout_s": TIMEOUT_S},
                                "retry": {"max_attempts": 3}})
    home = tmp_path / "h"
    started = time.monotonic()
    up = deploy("up", str(prof), "--skip-preflight", "--json", home=home)
    took = time.monotonic() - started
    said = up.stdout + up.stderr
    try:
        assert up.returncode == 5, said
        assert took < TIMEOUT_S / 2, (took, said)   # the answer, not the whole startup timeout
        report = [e for e in events(up.stdout) if e.get("event") == "report"][-1]
        assert [a["outcome"] for a in report["attempts"]] == ["probe-refused"], report["attempts"]  # not retried
        diagnoses = [e for e in events(up.stdout) if e.get("event") == "diagnosis"]
        assert diagnoses and diagnoses[-1]["signature"] == "probe-refused" and not diagnoses[-1]["transient"]
        summary = diagnoses[-1]["summary"]
        assert summary.startswith("HTTP 404: The model `asked-name` does not exist."), summary
        assert "'asked-name'" in summary and "'served-name'" in summary, summary
        assert "NCCL" not in said and "hang" not in summary, said
        text = deploy("up", str(prof), "--skip-preflight", home=home)
        assert text.returncode == 5, text.stderr
        lines = [line for line in text.stderr.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1 and "refused the readiness probe" in lines[0], text.stderr
        assert "'asked-name'" in lines[0] and "'served-name'" in lines[0], lines
    finally:
        deploy("down", str(prof), home=home)


def test_an_engine_serving_the_name_the_probe_asks_is_ready(tmp_path: Path, sshd: Any) -> None:
    """The same profile with the stand-in serving the profile's name: ready (the 404 above is the name, nothing
    else)."""
    prof = write_profile(tmp_path, sshd, name="rightname", args={"served_model_name": "asked-name"},
                         env={"STANDIN_SERVES_MODEL": "asked-name"}, extra={"engine": {"kind": "vllm"}})
    home = tmp_path / "h"
    up = deploy("up", str(prof), "--skip-preflight", "--json", home=home)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        report = [e for e in events(up.stdout) if e.get("event") == "report"][-1]
        assert json.dumps(report["attempts"][-1]["outcome"]) == '"ready"'
    finally:
        deploy("down", str(prof), home=home)
