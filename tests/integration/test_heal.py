"""Self-healing `up` end to end: real sshd and supervisor, the stand-in engine failing like SGLang does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy_helpers import deploy, events, write_profile

pytestmark = pytest.mark.integration

MTP_ARGS = {"speculative_algorithm": "NEXTN", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4, "tp_size": 1}


def report_of(stdout: str) -> dict[str, Any]:
    evs = events(stdout)
    if evs and evs[-1]["event"] == "error":  # a failed --json run ends with its error event, after the report
        evs = evs[:-1]
    assert evs and evs[-1]["event"] == "report", stdout[-2000:]
    return evs[-1]


def test_mamba_spec_scenario_heals_in_two_attempts(tmp_path: Path, sshd: Any) -> None:
    """Old-era SGLang, Qwen3.6 + MTP, no strategy chosen: extra_buffer + SGLANG_ENABLE_SPEC_V2=1 fixes it.

    Without preflight the failure shows at launch (attempt 1 dies, attempt 2 is healed)."""
    prof = write_profile(tmp_path, sshd, name="qwen36-mtp", model="Qwen/Qwen3.6-27B", args=MTP_ARGS,
                         env={"STANDIN_SGLANG_VERSION": "0.5.10"})
    fixed = tmp_path / "fixed.yaml"
    up = deploy("up", str(prof), "--json", "--skip-preflight", "--save-fixed", str(fixed), home=tmp_path / "h")
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    report = report_of(up.stdout)
    first, second = report["attempts"]
    assert first["outcome"] == "crashed" and second["outcome"] == "ready"
    assert first["diagnosis"]["signature"] == "mamba-spec-needs-extra-buffer"
    assert any("not compatible with radix cache" in line for line in first["diagnosis"]["evidence"])
    assert first["change"]["args"] == {"mamba_scheduler_strategy": "extra_buffer"}
    assert first["change"]["env"] == {"SGLANG_ENABLE_SPEC_V2": "1"}
    saved = yaml.safe_load(fixed.read_text())
    assert saved["engine"]["args"]["mamba_scheduler_strategy"] == "extra_buffer"
    assert saved["engine"]["env"]["SGLANG_ENABLE_SPEC_V2"] == "1"
    # the saved profile deploys as is (preflight passes it): same content -> already running
    again = deploy("up", str(fixed), home=tmp_path / "h")
    assert again.returncode == 0 and "already running" in again.stderr, again.stderr
    hist = deploy("history", str(prof), "--json", home=tmp_path / "h")
    rows = json.loads(hist.stdout)
    assert [r["outcome"] for r in rows[:2]] == ["ready", "crashed"]
    assert rows[1]["change"]["env"] == {"SGLANG_ENABLE_SPEC_V2": "1"}
    local = json.loads(deploy("history", "qwen36-mtp", "--local", "--json", home=tmp_path / "h").stdout)
    assert [r["outcome"] for r in local[:2]] == ["ready", "crashed"]
    assert local[1]["diagnosis"]["signature"] == "mamba-spec-needs-extra-buffer"
    deploy("down", str(prof), home=tmp_path / "h")


def test_preflight_heals_the_scenario_before_launch(tmp_path: Path, sshd: Any) -> None:
    """With preflight, the engine's own argument check (run on the target) shows the error in seconds: healed
    before anything is launched, one attempt, and --save-fixed still records the change."""
    prof = write_profile(tmp_path, sshd, name="qwen36-pre", model="Qwen/Qwen3.6-27B", args=MTP_ARGS,
                         env={"STANDIN_SGLANG_VERSION": "0.5.10"})
    fixed = tmp_path / "fixed.yaml"
    up = deploy("up", str(prof), "--json", "--save-fixed", str(fixed), home=tmp_path / "h")
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    report = report_of(up.stdout)
    assert [a["outcome"] for a in report["attempts"]] == ["ready"]
    (note,) = report["before_launch"]
    assert note["signature"] == "mamba-spec-needs-extra-buffer"
    assert note["change"]["args"] == {"mamba_scheduler_strategy": "extra_buffer"}
    saved = yaml.safe_load(fixed.read_text())
    assert saved["engine"]["env"]["SGLANG_ENABLE_SPEC_V2"] == "1"
    no_heal = write_profile(tmp_path, sshd, name="qwen36-pre2", model="Qwen/Qwen3.6-27B", args=MTP_ARGS,
                            env={"STANDIN_SGLANG_VERSION": "0.5.10"})
    refused = deploy("up", str(no_heal), "--no-heal", home=tmp_path / "h")
    assert refused.returncode == 4 and "the engine rejects these arguments" in refused.stderr
    assert not (tmp_path / "work" / "qwen36-pre2" / "runs").exists() or \
        not any((tmp_path / "work" / "qwen36-pre2" / "runs").iterdir())
    deploy("down", str(prof), home=tmp_path / "h")


def test_human_report_names_attempts_diagnosis_and_change(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="qwen36-human", model="Qwen/Qwen3.6-27B", args=MTP_ARGS,
                         env={"STANDIN_SGLANG_VERSION": "0.5.10"})
    up = deploy("up", str(prof), "--skip-preflight", home=tmp_path / "h")
    assert up.returncode == 0, up.stderr
    err = up.stderr
    assert "attempt 1: crashed" in err and "attempt 2: ready" in err
    assert "mamba-spec-needs-extra-buffer" in err and "SGLANG_ENABLE_SPEC_V2" in err
    assert "Traceback" not in err.split("attempt 1: crashed")[1]
    deploy("down", str(prof), home=tmp_path / "h")


def test_capture_cuda_graph_oom_heals_by_lowering_mem_fraction(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="oom", args={"mem_fraction_static": 0.9},
                         env={"STANDIN_MODE": "mem", "STANDIN_MAX_MFS": "0.82"})
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=tmp_path / "h")
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    report = report_of(up.stdout)
    first = report["attempts"][0]
    assert first["diagnosis"]["signature"] == "capture-cuda-graph-failed"
    assert first["change"]["args"]["mem_fraction_static"] == 0.8  # the value SGLang's message suggests
    assert report["attempts"][-1]["outcome"] == "ready"
    deploy("down", str(prof), home=tmp_path / "h")


def test_unknown_traceback_stops_after_one_attempt_with_traceback(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="unknown", env={"STANDIN_MODE": "crash"})
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=tmp_path / "h")
    assert up.returncode == 5, up.stderr
    report = report_of(up.stdout)
    assert len(report["attempts"]) == 1
    diag = report["attempts"][0]["diagnosis"]
    assert diag["signature"] is None and diag["summary"].startswith("unknown failure")
    assert "RuntimeError" in diag["traceback"]
    assert "no known change fixes it" in up.stderr and "Traceback" not in up.stderr


def test_sigkill_with_empty_log_is_diagnosed_as_killed(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="killed", env={"STANDIN_MODE": "sigkill_empty"})
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=tmp_path / "h")
    assert up.returncode == 5
    diag = report_of(up.stdout)["attempts"][0]["diagnosis"]
    assert diag["signature"] == "killed-by-signal"
    assert "SIGKILL" in diag["summary"] and "OOM killer" in diag["summary"]


def test_hang_is_killed_and_diagnosed(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="hang", env={"STANDIN_MODE": "hang"},
                         extra={"health": {"interval_s": 0.2, "stall_timeout_s": 2, "startup_timeout_s": 60}})
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=tmp_path / "h")
    assert up.returncode == 5, up.stderr
    report = report_of(up.stdout)
    # a hang may be transient (NCCL init): retried unchanged once, never twice
    assert [a["outcome"] for a in report["attempts"]] == ["hung", "hung"]
    diag = report["attempts"][0]["diagnosis"]
    assert diag["signature"] == "hang" and diag["evidence"]
    st = deploy("status", str(prof), "--json", home=tmp_path / "h")
    assert json.loads(st.stdout)["status"] in ("stopped", "exited")
    once = deploy("up", str(prof), "--json", "--skip-preflight", "--no-heal", home=tmp_path / "h")
    assert once.returncode == 5 and len(report_of(once.stdout)["attempts"]) == 1  # --no-heal: no retry at all
    assert "healing disabled (--no-heal)" in once.stderr


def test_no_heal_only_diagnoses(tmp_path: Path, sshd: Any) -> None:
    prof = write_profile(tmp_path, sshd, name="noheal", model="Qwen/Qwen3.6-27B", args=MTP_ARGS,
                         env={"STANDIN_SGLANG_VERSION": "0.5.10"})
    up = deploy("up", str(prof), "--json", "--skip-preflight", "--no-heal", home=tmp_path / "h")
    assert up.returncode == 5
    report = report_of(up.stdout)
    assert len(report["attempts"]) == 1 and report["attempts"][0]["change"] is None
    assert report["attempts"][0]["diagnosis"]["signature"] == "mamba-spec-needs-extra-buffer"


def test_renamed_flag_rejected_at_launch_is_renamed_and_retried(tmp_path: Path, sshd: Any) -> None:
    """A profile of the mamba_scheduler_strategy era on SGLang 0.5.23 without preflight: argparse rejects the
    old name (exit 2); the rename table turns it into mamba_radix_cache_strategy, keeping the value."""
    prof = write_profile(tmp_path, sshd, name="renamed", model="Qwen/Qwen3.6-27B",
                         args={**MTP_ARGS, "mamba_scheduler_strategy": "extra_buffer"})
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=tmp_path / "h")
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    first, second = report_of(up.stdout)["attempts"]
    assert first["diagnosis"]["signature"] == "unrecognized-arguments"
    assert any("unrecognized arguments: --mamba-scheduler-strategy" in e for e in first["diagnosis"]["evidence"])
    assert first["change"]["args"] == {"mamba_scheduler_strategy": None, "mamba_radix_cache_strategy": "extra_buffer"}
    assert second["outcome"] == "ready"
    deploy("down", str(prof), home=tmp_path / "h")


def test_graph_oom_below_the_old_default_heals_below_the_effective_value(tmp_path: Path, sshd: Any) -> None:
    """No mem_fraction_static in the profile; the engine resolves 0.72 (a 24 GB GPU) and graph capture runs out
    of memory. SGLang suggests "0.8 or 0.7": 0.8 would raise it (the old default-based heal did exactly that),
    so every value tried is below the engine's own 0.72, and the report says where it started."""
    prof = write_profile(tmp_path, sshd, name="oom-eff",
                         env={"STANDIN_MODE": "mem", "STANDIN_GPU_MEM_GB": "24", "STANDIN_MAX_MFS": "0.66"})
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=tmp_path / "h")
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    attempts = report_of(up.stdout)["attempts"]
    changes = [a["change"] for a in attempts if a["change"]]
    assert all(a["diagnosis"]["signature"] == "capture-cuda-graph-failed" for a in attempts[:-1])
    tried = [c["args"]["mem_fraction_static"] for c in changes]
    assert tried == [0.7, 0.65] and all(v < 0.72 for v in tried)
    assert changes[0]["basis"] == {"mem_fraction_static": "engine resolved 0.72"}
    assert changes[0]["reason"] == "mem_fraction_static: engine resolved 0.72 -> 0.7"
    assert attempts[-1]["outcome"] == "ready"
    deploy("down", str(prof), home=tmp_path / "h")


def test_a_typo_is_respelt_before_launch_and_an_unknown_flag_never_dropped(tmp_path: Path, sshd: Any) -> None:
    """Preflight finds flags 0.5.23 does not have: a typo of exactly one flag is respelt (loudly, value kept,
    --save-fixed writes it); a flag with no rename, no documented removal and no single close spelling is refused
    before launch (exit 2), never dropped (issue 24)."""
    prof = write_profile(tmp_path, sshd, name="flags", model="Qwen/Qwen3.6-27B", args={"mem_fraction_statc": 0.85})
    fixed = tmp_path / "fixed.yaml"
    up = deploy("up", str(prof), "--json", "--save-fixed", str(fixed), home=tmp_path / "h")
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    report = report_of(up.stdout)
    assert any("did you mean --mem-fraction-static? respelt as --mem-fraction-static" in w for w in report["warnings"])
    saved = yaml.safe_load(fixed.read_text())["engine"]["args"]
    assert saved == {"mem_fraction_static": 0.85}
    assert [a["outcome"] for a in report["attempts"]] == ["ready"]
    deploy("down", str(prof), home=tmp_path / "h")
    retired = write_profile(tmp_path, sshd, name="flags2", model="Qwen/Qwen3.6-27B",
                            args={"mem_fraction_statc": 0.85, "enable_beta_spec": True})
    refused = deploy("up", str(retired), "--json", home=tmp_path / "h")
    assert refused.returncode == 2, refused.stderr + refused.stdout[-3000:]
    assert "unknown flag --enable-beta-spec for sglang 0.5.23" in refused.stderr.splitlines()[-1]


def test_kv_cache_too_small_raises_past_the_effective_value(tmp_path: Path, sshd: Any) -> None:
    """The engine resolved 0.72 and has no room for a KV cache: the raise starts from 0.72 (not the old 0.88
    default, which would "raise" by lowering) and moves a real step past it."""
    prof = write_profile(tmp_path, sshd, name="kv-eff",
                         env={"STANDIN_MODE": "mem", "STANDIN_GPU_MEM_GB": "24", "STANDIN_MIN_MFS": "0.74"})
    up = deploy("up", str(prof), "--json", "--skip-preflight", home=tmp_path / "h")
    assert up.returncode == 0, up.stderr + up.stdout[-3000:]
    attempts = report_of(up.stdout)["attempts"]
    first = attempts[0]
    assert first["diagnosis"]["signature"] == "kv-cache-not-enough-memory"
    assert first["change"]["args"] == {"mem_fraction_static": 0.75}
    assert first["change"]["basis"]["mem_fraction_static"] in ("engine message 0.72", "engine resolved 0.72")
    assert [a["outcome"] for a in attempts] == ["crashed", "ready"]
    deploy("down", str(prof), home=tmp_path / "h")
