"""Push: the deployment's directory layout on the target and the atomic upload of one attempt's run dir.

    <workdir>/<name>/lock, supervise.py, supervise_guard.py, supervise_lease.py, current -> runs/<id>
    <workdir>/<name>/payload/<sha256>.py   the supervisor payload, one file per version, named by its hash
    <workdir>/<name>/runs/<id>/launch.sh (0700), env (0600), profile.json, supervise.py, supervise_guard.py,
                               supervise.json, state.json, engine.log, outcome.json
(names and record keys: supervisor/protocol.py; the payload and the entry files that name its hash and run one
module's main from it: remote/program.py; which payloads stay: box/retention.py.)
Every file goes to a temporary name (in the helper's `install` request, or over SFTP when large) and is renamed
into place after its hash is checked. A push
checks the free space first and either completes (every file verified) or removes its half-written run dir.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deployer.engines.common import FATAL_GRACE_S, fatal_patterns
from deployer.errors import DeployError, DiskFull, LockLost, RemoteError, TargetError
from deployer.remote.base import Remote
from deployer.remote.base import HelperRefused
from deployer.remote.oneshot import UNSAFE_HINT
from deployer.remote.program import PAYLOAD_DIR, ROOT_ENTRIES, RUN_DIR_ENTRIES, payload_bundle, payload_files
from deployer.remote.program import payload_name
from deployer.secrets import mask_data
from deployer.supervisor.protocol import ENGINE_LOG, ENV_FILE, LAUNCH_SH, OUTCOME_JSON, PROFILE_JSON
from deployer.supervisor.protocol import STATE_JSON, SUPERVISE_JSON, ProfileRecord, SuperviseConfig
from deployer.box.supervised import FatalWatch, RecordFields, SupervisedSpec, process_record, supervise_config
from deployer.box.tokenprobe import probe_config

if TYPE_CHECKING:  # annotations only: the on-call commands read layouts without loading the profile model
    from deployer.profile.model import Profile
    from deployer.render.bundle import Bundle

# The deployment lock's lease program at the deployment's root (an entry file naming the payload), kept for older
# deployers: this one's helper holds the lease (deployer/box/lock.py).
LEASE_FILE = "supervise_lease.py"
# The supervisor's files in a run dir (remote/program.py: the entry files naming the payload's hash).
SUPERVISOR_FILES = tuple(payload_files(RUN_DIR_ENTRIES, in_run_dir=True))
# Free space a push needs beyond its files: state.json, outcome.json and the engine's first log lines.
SPACE_HEADROOM = 256 << 10
# ... and beyond the supervisor files at the deployment's root: the lock's lease record and its events.
SYNC_HEADROOM = 64 << 10


def _sync_supervisor(remote: Remote, folder: str) -> None:
    """Put the payload and the root's entry files that differ from this deployer's (none: one round trip)."""
    # the payload first: an entry is never in place before the file it names
    sources = {payload_name(): payload_bundle()[0], **payload_files(ROOT_ENTRIES, in_run_dir=False)}
    # The hashes and the free space in one request: a fresh target's full disk is named before any write.
    facts = remote.helper.disk(folder, [posixpath.join(folder, name) for name in sources])
    have = dict(zip(sources, facts.digests))
    stale = {name: data for name, data in sources.items() if have.get(name) != hashlib.sha256(data).hexdigest()}
    if not stale:
        return
    need_k = -(-(sum(len(data) for data in stale.values()) + SYNC_HEADROOM) // 1024)
    if facts.free is not None and facts.free // 1024 < need_k:
        raise _no_space(remote, folder, str(facts.free // 1024), need_k, "the supervisor and the lock")
    if payload_name() in stale:
        make_owned_dirs(remote, posixpath.join(folder, PAYLOAD_DIR), folder)
    remote.put_all([(data, posixpath.join(folder, name), 0o644) for name, data in stale.items()])


def _no_space(remote: Remote, folder: str, avail: str, need_k: int, what: str) -> TargetError:
    return TargetError(f"not enough free space on {remote.label} under {folder}: {avail} KiB free, {need_k} KiB "
                       f"needed for {what}; nothing was changed",
                       hint="free space there or set target.workdir to a larger disk")


FULL_BELOW_K = 1024  # a workdir with less than this free is full: its supervisor cannot write its state


def disk_full(remote: Remote, folder: str) -> DiskFull | None:
    """The error naming a full disk under `folder` on the target, or None when there is room (or df cannot say)."""
    try:
        free = remote.helper.disk(folder, []).free
    except DeployError:
        return None
    if free is None or free >= FULL_BELOW_K * 1024:
        return None
    return DiskFull(f"no space left on {remote.label} under {folder} ({free // 1024} KiB free): the engine and its "
                    "supervisor could not write there",
                    hint="free space there (`deploy prune`, or remove what filled it) or set target.workdir to a "
                         "larger disk, then run `deploy up` again")


@dataclass(frozen=True)
class RunDir:
    """One attempt's directory on the target."""

    path: str
    run_id: str

    def file(self, name: str) -> str:
        return posixpath.join(self.path, name)

    @property
    def log(self) -> str:
        return self.file(ENGINE_LOG)

    @property
    def state(self) -> str:
        return self.file(STATE_JSON)


@dataclass(frozen=True)
class Layout:
    """The deployment's directory on the target."""

    root: str

    @property
    def lock(self) -> str:
        return posixpath.join(self.root, "lock")

    @property
    def lease_program(self) -> str:
        return posixpath.join(self.root, LEASE_FILE)

    @property
    def lock_events(self) -> str:
        return self.lock + "-events.jsonl"

    @property
    def current(self) -> str:
        return posixpath.join(self.root, "current")

    @property
    def runs(self) -> str:
        return posixpath.join(self.root, "runs")

    @property
    def supervisor(self) -> str:
        return posixpath.join(self.root, "supervise.py")

    @property
    def payloads(self) -> str:
        return posixpath.join(self.root, PAYLOAD_DIR)

    def run(self, run_id: str) -> RunDir:
        return RunDir(posixpath.join(self.runs, run_id), run_id)


def expand_workdir(remote: Remote, workdir: str) -> str:
    """`~` in the workdir means the target user's home; SFTP and quoted shell words need it spelt out."""
    if not workdir.startswith("~"):
        return workdir
    home = remote.run('printf %s "$HOME"', timeout=15).stdout.strip()
    return home + workdir[1:]


def layout_for(remote: Remote, profile: Profile) -> Layout:
    return Layout(posixpath.join(expand_workdir(remote, profile.target.workdir), profile.name))


def prepare(remote: Remote, layout: Layout) -> None:
    """Create the deployment dir and install the supervisor there (needed for the lock before any run)."""
    make_owned_dirs(remote, layout.runs, layout.root)
    _sync_supervisor(remote, layout.root)


def make_owned_dirs(remote: Remote, path: str, owned_from: str) -> None:
    """`mkdir -p` on the target that refuses (TargetError, one line, nothing written) a directory chain another
    user controls: at or below `owned_from` ours alone, above it ours or root's and shared only with the sticky
    bit (base.make_dirs: the helper's `mkdirs` request)."""
    try:
        remote.helper.mkdirs(path, owned_from)   # a bare connection's raises its TargetError itself (oneshot)
    except HelperRefused as e:
        if e.kind == "unsafe":
            raise TargetError(f"unsafe workdir on {remote.label}: {e.said}; nothing was written",
                              hint=UNSAFE_HINT) from None
        raise TargetError(f"{e.said} on {remote.label}", hint="check target.workdir and its permissions") from None


def new_run_id(bundle: Bundle, attempt: int) -> str:
    now = time.time()  # microseconds keep ids of attempts made within one second in order
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
    return f"{stamp}-{bundle.content_hash[:8]}-a{attempt}"


def engine_spec(profile: Profile, written_hash: str | None = None) -> SupervisedSpec:
    """The profile's engine as a supervised process (written_hash: see profile_record)."""
    return SupervisedSpec(
        name=profile.name, ports=(profile.engine.port,), ready_pattern=profile.engine.definition.log.ready_line,
        grace_s=profile.restart.grace_s, restart=profile.restart,
        fatal=FatalWatch([p.pattern for p in fatal_patterns()], FATAL_GRACE_S), logs=profile.logs,
        probe=probe_config(profile), record=RecordFields(profile=profile.public_dict(), health_path=profile.health.path,
                            written_hash=written_hash, kind=profile.engine.kind,
                            secret_templates=profile.templates, helper=payload_bundle()[1]))


def supervisor_config(profile: Profile) -> SuperviseConfig:
    """supervise.json (its format: supervisor/protocol.py)."""
    return supervise_config(engine_spec(profile))


def profile_record(profile: Profile, bundle: Bundle, *, attempt: int, up_id: str,
                   written_hash: str | None = None) -> ProfileRecord:
    """profile.json (its format: supervisor/protocol.py): what the target keeps about this attempt
    (secrets masked): enough for status/history from any laptop.

    written_hash: the content hash of the profile as the user wrote it, before preflight translated or healed it
    (the next `up` of the same file can tell that this run is what preflight will make of it again); None: unknown."""
    return process_record(engine_spec(profile, written_hash), bundle, attempt=attempt, up_id=up_id)


def push(remote: Remote, layout: Layout, bundle: Bundle, record: Mapping[str, Any], config: Mapping[str, Any],
         run_id: str) -> RunDir:
    """Upload one attempt's run dir completely, or fail having left nothing of it (TargetError when full)."""
    run = layout.run(run_id)
    files = [(ENV_FILE, bundle.env.encode(), 0o600), (LAUNCH_SH, bundle.script.encode(), 0o700),
             (PROFILE_JSON, json.dumps(record, indent=1).encode(), 0o644),
             (SUPERVISE_JSON, json.dumps(config, indent=1).encode(), 0o644),
             *((name, data, 0o644) for name, data in payload_files(RUN_DIR_ENTRIES, in_run_dir=True).items())]
    _make_run_dir(remote, layout, run, sum(len(data) for _, data, _ in files) + SPACE_HEADROOM)
    try:
        remote.put_all([(data, run.file(name), mode) for name, data, mode in files])
    except DeployError as exc:
        remove_run_dir(remote, layout, run)
        if isinstance(exc, LockLost):
            raise  # not a fault of the push: the lock's own message says what happened and what to do
        exc.message = f"push of {run_id} failed, nothing of it kept: {exc.message}"
        exc.args = (exc.message,)
        raise
    return run


def _make_run_dir(remote: Remote, layout: Layout, run: RunDir, need: int) -> None:
    """Check the free space under the deployment dir and create the run dir, in one request."""
    need_k = -(-need // 1024)
    try:
        made = remote.helper.mkdir(run.path, layout.root, need_k * 1024)
    except HelperRefused as e:
        raise RemoteError(f"creating {run.path} failed: {e.said}", host=remote.label) from None
    if not made.made:
        raise _no_space(remote, layout.root, str((made.free or 0) // 1024), need_k, "the new run")


def remove_run_dir(remote: Remote, layout: Layout, run: RunDir) -> None:
    """Best effort: the run dir gone (a push that failed, an early run dir not used), never through a symlink."""
    try:
        remote.helper.remove([run.path], layout.root)
    except TargetError:
        pass


def set_current(remote: Remote, layout: Layout, run: RunDir) -> None:
    """Point `current` at the run atomically (a new symlink renamed over the old one, which is not followed)."""
    remote.helper.link(layout.current, posixpath.join("runs", run.run_id), layout.root)


def write_outcome(remote: Remote, run: RunDir, outcome: dict[str, Any]) -> None:
    remote.put(json.dumps(mask_data(outcome), indent=1, default=str).encode(), run.file(OUTCOME_JSON), 0o644)
