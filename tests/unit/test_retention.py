"""Retention's plan (pure): what goes, what loses its env file, what is never deleted."""

from __future__ import annotations

from deployer.box.retention import RunSummary, plan_retention


def run(n: int, version: str, ready: bool, status: str = "stopped", env: bool = True) -> RunSummary:
    return RunSummary(f"2026113{n:02d}", version, ready, status, env)


def test_keeps_the_newest_n_and_the_env_files_restart_and_rollback_need() -> None:
    runs = [run(1, "a", True), run(2, "b", True), run(3, "b", False, "exited"), run(4, "c", True),
            run(5, "d", False, "exited")]
    plan = plan_retention(runs, current=runs[-1].run_id, keep=3)
    assert plan.protected == {runs[4].run_id: "current", runs[3].run_id: "newest run that reached ready"}
    assert plan.delete == [runs[0].run_id, runs[1].run_id]
    assert plan.drop_env == [runs[2].run_id, runs[4].run_id]  # the current run never reached ready: no secrets kept


def test_rollback_target_keeps_env_and_dir_when_current_is_the_newest_ready() -> None:
    runs = [run(1, "a", True), run(2, "a", False, "exited"), run(3, "b", True, "ready")]
    plan = plan_retention(runs, current=runs[2].run_id, keep=1)
    assert plan.protected[runs[0].run_id].startswith("rollback's target")
    assert plan.delete == [runs[1].run_id] and plan.drop_env == []


def test_never_deletes_a_run_that_looks_alive_or_the_current_one_even_with_keep_1() -> None:
    runs = [run(1, "a", False, "running"), run(2, "b", False, "exited"), run(3, "c", False, "exited")]
    plan = plan_retention(runs, current=runs[1].run_id, keep=1)
    assert plan.delete == [] and runs[0].run_id in plan.protected and runs[1].run_id in plan.protected
    assert plan.drop_env == [r.run_id for r in runs]  # none reached ready: kept dirs, no secrets


def test_only_runs_that_reached_ready_or_the_live_current_keep_their_env() -> None:
    """Issue 35 item 5: the env file holds secrets; a run that ended in a timeout or a crash loses it."""
    runs = [run(1, "a", True), run(2, "b", False, "exited"), run(3, "c", False, "running")]
    assert plan_retention(runs, current=runs[2].run_id, keep=5).drop_env == [runs[1].run_id]
    assert plan_retention(runs, current=runs[1].run_id, keep=5).drop_env == [runs[1].run_id, runs[2].run_id]
