"""Retention's plan (pure): what goes, what loses its env file, what is never deleted."""

from __future__ import annotations

from deployer.box.retention import PAYLOAD_UNUSED_S, Payloads, RunSummary, plan_retention, unused_payloads


def run(n: int, version: str, ready: bool, status: str = "stopped", env: bool = True, payload: str = "") -> RunSummary:
    return RunSummary(f"2026113{n:02d}", version, ready, status, env, payload)


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


def test_a_payload_stays_while_a_kept_run_the_root_or_this_deployer_names_it_or_while_it_is_new() -> None:
    """Runs 1-2 go (keep 2): the payload only they named goes once old; what runs 3-4 name, what the root's entries
    name, this deployer's own, and one written within the hour (another deployer's push may be about to name it)
    stay; a payload of an old run of its own (no name: "") is nothing to keep."""
    old = PAYLOAD_UNUSED_S + 1
    runs = [run(1, "a", False, "exited", payload="p1"), run(2, "a", False, "exited", payload="p2"),
            run(3, "a", True, payload="p3"), run(4, "b", True, payload=""),]
    plan = plan_retention(runs, current=runs[-1].run_id, keep=2)
    assert plan.delete == [runs[0].run_id, runs[1].run_id]
    ages = {"p1": old, "p2": old, "p3": old, "root": old, "mine": old, "fresh": 10.0, "stray": old}
    assert unused_payloads(runs, plan, Payloads(ages, root="root"), own="mine") == ["p1", "p2", "stray"]
    assert unused_payloads(runs, plan_retention(runs, runs[-1].run_id, keep=4), Payloads(ages, "root"), "mine") \
        == ["stray"]
