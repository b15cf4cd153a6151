"""A window of a deployment's current engine log by byte offset: what the dashboard's log view follows.

`deploy logs` hands on lines; a page that polls needs offsets it can come back with (`start`, `size`), and the
raw bytes so that a line cut by the window is not shown twice. The secrets of the run are learnt here (its env
file and record), so the caller masks each line it shows with `secrets.mask_text`.
"""

from __future__ import annotations

from deployer.errors import NotFound
from deployer.operate.deployment import Ref, connected, layout_of
from deployer.operate.secret_restore import learn_env_text
from deployer.box import snapshot
from deployer.box.snapshot import LogWindow


def log_window(ref: Ref, offset: int | None, max_bytes: int) -> LogWindow | None:
    """Up to `max_bytes` of the current run's log from `offset` (None: its last `max_bytes`); None when the
    deployment has no current run or no log yet."""
    assert ref.name
    with connected(ref) as remote:
        tail = max_bytes if offset is None else None
        snap = snapshot.take(remote, layout_of(ref.workdir, ref.name).root, log_tail=tail)
        view = snap.current_view()
        if view is None:
            return None
        learn_env_text(snap.env.get(view.run.run_id), view.record, view.run.file("env"))
        if offset is None:
            window = snap.log
            if window is None or window.run_id != view.run.run_id:
                return None
            return window
        size = remote.size(view.run.log)
        if size is None:
            return None
        start = min(max(0, offset), size)
        try:
            data = remote.read(view.run.log, start, max_bytes) if start < size else b""
        except NotFound:
            return None
        return LogWindow(run_id=view.run.run_id, size=size, start=start, data=data)
