"""One `up`'s rows in deployer's local history (`deploy history`): one per target and attempt. With the local
history off (the Python API's default) nothing is opened or written."""

from __future__ import annotations

from deployer.local.history import History
from deployer.profile.model import Profile
from deployer.runner.report import AttemptOutcome, AttemptReport
from deployer.runner.shape import HeldHost


class AttemptRows:
    def __init__(self, enabled: bool) -> None:
        self.history = History() if enabled else None
        self.open: list[int] = []

    def begin(self, targets: list[HeldHost], profiles: list[Profile], *, up_id: str, attempt: int,
              content_hash: str) -> None:
        if self.history is None:
            return
        self.open = [self.history.begin_attempt(deployment=p.name, host=t.remote.label, up_id=up_id, attempt=attempt,
                                                run_id=t.run.run_id if t.run else "", content_hash=content_hash,
                                                profile=p.public_dict())
                     for t, p in zip(targets, profiles)]

    def end(self, item: AttemptReport) -> None:
        """The open rows end as this attempt did."""
        if self.history is not None:
            for row in self.open:
                self.history.end_attempt(row, outcome=item.outcome, diagnosis=item.diagnosis_json(),
                                         change=item.change_json())
        self.open = []

    def end_open(self, outcome: AttemptOutcome) -> None:
        """Rows still open (a failure before the attempt's outcome was known) end with `outcome`."""
        if self.history is not None:
            for row in self.open:
                self.history.end_attempt(row, outcome=outcome, diagnosis=None, change=None)
        self.open = []

    def close(self) -> None:
        if self.history is not None:
            self.history.close()
