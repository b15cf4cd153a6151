"""Early push (deployer/runner/early_push.py): when attempt 1 may take the run dir pushed during preflight, and
when `up` does not push early at all. The pushing itself is tested over the real sshd (test_early_push.py)."""

from __future__ import annotations

import time
from typing import Any

from deployer.runner.early_push import Planned
from deployer.runner.up import UpOptions, _early_plan
from deployer.profile.model import Profile
from deployer.box.push import RunDir
from deployer.box.records import RunView


def profile(**args: Any) -> Profile:
    return Profile.model_validate({"name": "p", "target": {"host": "h"},
                                   "engine": {"kind": "sglang", "model_path": "m", "args": args}})


def plan(p: Profile) -> Planned:
    bundle_hash = Planned.of(p, up_id="u1", written_hash=None).bundle.content_hash
    return Planned.of(p, up_id="u1", written_hash=bundle_hash)


def running(record: dict[str, Any]) -> RunView:
    return RunView(RunDir("/w/p/runs/r1", "r1"), record, {"alive": True, "supervisor_alive": True}, None)


def test_the_same_files_are_claimed_whenever_they_were_pushed() -> None:
    early = plan(profile(tp_size=1))
    time.sleep(0.01)
    later = Planned.of(profile(tp_size=1), up_id="u1", written_hash=early.bundle.content_hash)
    assert later.record["pushed_at"] != early.record["pushed_at"] and early.same_files(later)


def test_anything_preflight_changed_is_not_claimed() -> None:
    early = plan(profile(mem_fraction_statc=0.8))
    healed = Planned.of(profile(mem_fraction_static=0.8), up_id="u1", written_hash=early.bundle.content_hash)
    assert not early.same_files(healed)
    # a dropped flag that renders to nothing still changes the record the run dir keeps
    as_written = plan(profile(enable_metrics=False))
    dropped = Planned.of(profile(), up_id="u1", written_hash=as_written.bundle.content_hash)
    assert dropped.bundle.content_hash == as_written.bundle.content_hash and not as_written.same_files(dropped)


def test_no_early_push_when_it_cannot_pay() -> None:
    written = plan(profile(tp_size=1))
    digest = written.bundle.content_hash
    assert _early_plan(written, None, UpOptions()) is written
    assert _early_plan(written, None, UpOptions(skip_preflight=True)) is None   # no preflight to overlap
    assert _early_plan(None, None, UpOptions()) is None                          # it does not even render
    same = running({"content_hash": digest})
    assert _early_plan(written, same, UpOptions()) is None                       # likely already running
    assert _early_plan(written, same, UpOptions(force=True)) is written
    healed_before = running({"content_hash": "h2", "written_hash": digest, "attempt": 1})
    assert _early_plan(written, healed_before, UpOptions()) is None              # preflight will heal it the same
    healed_at_launch = running({"content_hash": "h2", "written_hash": digest, "attempt": 2})
    assert _early_plan(written, healed_at_launch, UpOptions()) is written
    other = running({"content_hash": "h2", "written_hash": "h3", "attempt": 1})
    assert _early_plan(written, other, UpOptions()) is written
