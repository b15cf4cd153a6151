"""An engine started with its metrics off (SGLang without enable_metrics) is never asked for /metrics: not by
`status`, `top` nor the supervisor's probe; the row says "metrics off" with the fix (issue 36: deployer's own polling
filled the engine log with `GET /metrics 404`). The stand-in SGLang writes uvicorn's access line per request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deploy_helpers import deploy, write_profile


def _metrics_gets(log: Path) -> int:
    return sum('"GET /metrics ' in line for line in log.read_text(errors="replace").splitlines())


def test_with_metrics_off_no_get_metrics_reaches_the_engine_and_status_says_off(tmp_path: Path, sshd: Any) -> None:
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="quiet")  # no enable_metrics: SGLang serves no /metrics
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    try:
        status = deploy("status", str(prof), home=home)
        assert status.returncode == 0, status.stderr
        assert "serving: metrics off (add `enable_metrics: true` to engine.args" in status.stdout, status.stdout
        top = deploy("top", str(prof), "--once", home=home)
        assert top.returncode == 0, top.stderr
        assert "quiet quiet: metrics off" in top.stdout and " off " in top.stdout.splitlines()[1], top.stdout
        log = tmp_path / "work" / "quiet" / "current" / "engine.log"
        assert '"POST /v1/completions' in log.read_text()  # the access log is on: a request would show
        assert _metrics_gets(log) == 0
    finally:
        assert deploy("down", str(prof), home=home).returncode == 0


def test_with_metrics_on_status_reads_them(tmp_path: Path, sshd: Any) -> None:
    """The other side of the switch: the same status asks /metrics once and shows the engine's numbers (the
    supervisor's own hang watch, which reads /metrics every second, is off here so that the count is status's)."""
    home = tmp_path / "h"
    prof = write_profile(tmp_path, sshd, name="loud", args={"enable_metrics": True},
                         extra={"health": {"hang_s": "off"}})
    assert deploy("up", str(prof), "--skip-preflight", home=home).returncode == 0
    try:
        status = deploy("status", str(prof), home=home)
        assert status.returncode == 0 and "serving: " in status.stdout and "metrics off" not in status.stdout
        assert _metrics_gets(tmp_path / "work" / "loud" / "current" / "engine.log") == 1
    finally:
        assert deploy("down", str(prof), home=home).returncode == 0
