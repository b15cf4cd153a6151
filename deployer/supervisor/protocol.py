"""The target's record formats, defined once: the files of a run dir and the keys of its JSON records.

    <workdir>/<deployment>/runs/<id>/supervise.json  SuperviseConfig  written by deployer (push), read here
                                    /profile.json    ProfileRecord    written by deployer (push), read by status
                                    /state.json      State            written by the supervisor, atomically
                                    /outcome.json    Outcome          written by deployer after each attempt
                                    /engine.log      the engine's stdout+stderr

Both sides import it: the supervisor (stdlib only, Python >= 3.8, shipped in the helper payload and in every run
dir) and deployer (push, box/records.py). The formats are the previous release's: keys are only ever added, and
every reader tolerates a key that is missing (`total=False`), since a run dir may have been written by either.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Tuple, TypedDict

# -- file names ----------------------------------------------------------------------------------------------
SUPERVISE_JSON = "supervise.json"
PROFILE_JSON = "profile.json"
STATE_JSON = "state.json"
OUTCOME_JSON = "outcome.json"
ENGINE_LOG = "engine.log"
LAUNCH_SH = "launch.sh"
ENV_FILE = "env"
STOP_REQUEST_JSON = "stop-request.json"
RUN_LOCK = "supervise.lock"
INTENT = "replace-intent.json"          # a replace's guard (guard.py `arm`), in the deployment dir
ROUTER_INTENT = "router-intent.json"    # a rolling restart's guard, in the router's deployment dir (`arm-router`)
REPLICAS_FILE = "replicas.json"         # {"urls": [...]}: the replicas the last `up` put in the router (replicas.py)

# how the line that ends a rotated engine.log's startup part begins (deployer's log follower goes on after it)
ROTATION_MARK = "==== deployer supervisor: engine.log rotated at "

# -- statuses the supervisor writes into state.json (sets the deployer side reads too) ----------------------
LIVE: Tuple[str, ...] = ("starting", "running", "ready", "restarting", "stopping")
UP: Tuple[str, ...] = tuple(s for s in LIVE if s != "stopping")   # live and not on its way down
CRASHED: Tuple[str, ...] = ("exited", "crashloop", "lost")        # ended without being asked to
ENDED: Tuple[str, ...] = CRASHED + ("stopped",)
ABSENT = "absent"                                                  # no state.json (status_of's answer)
POLICIES: Tuple[str, ...] = ("no", "on-failure", "always")


# -- the helper's wire protocol (line-delimited JSON: remote/conversation.py <-> helper.py) ----------
# Requests are {"id": N, "op": OP, ...}; replies {"id": N, "ok": true, ...} or {"id": N, "ok": false, "error": TEXT,
# "kind": KIND}. A new deployer ships its own helper (content-addressed), so ops are only ever added.
class Op(NamedTuple):
    """One helper operation. `changes`: it changes the target (a start, a write, a removal), so the helper fences it
    (refused, kind `fenced`, once a lease it holds is no longer ours). `module`: the supervisor module whose function
    of the op's name answers it (`FUNC(req) -> reply`; an exception with a `kind` is the error of that kind); None:
    helper.Helper's method of that name (the ops that need the helper's own state). `program`: the
    module's `main` runs as a process of its own, the helper's child (the helper's payload run again, `OP` its
    argument), for as long as it takes: the reply `{pid}` comes at once, its stdout+stderr lines follow as
    `{"stream": N, "line": TEXT}` (N: the request's id) and its end as `{"stream": N, "end": EXIT_CODE}`; `feed
    {stream, data_b64?, eof?}` writes to its stdin or closes it (what closing an exec channel did: it ends, as it
    would have). The helper's own end closes every child's stdin as well."""

    changes: bool
    module: Optional[str] = None
    program: bool = False


# The one table of operations: the helper dispatches from it, the clients (remote/) send only its names. Adding an
# op: its function in a supervisor module, its row here, its typed call in remote/ (remote/base.py's Helper for a
# file op; a plain `helper.call(OP, ...)` where the caller reads the reply itself).
OPS: Dict[str, Op] = {
    "run": Op(True),                    # {cmd, stdin_b64?, timeout} -> {exit_code, stdout, stderr, timed_out}
    "verify": Op(False),                # {paths} -> {digests}: fsync + sha256 of uploaded files
    "lease_take": Op(False),            # the deployment lock's lease (lease.py's rules): {word, data}
    "lease_beat": Op(False),            # {token, release} -> {word: OK|LOST|RELEASED, data}
    "supervise": Op(False),             # {argv}: a read-only supervisor command (IN_HELPER), answered in process
    "snapshot": Op(False),              # {argv} -> {data}: snapshot.py's snapshot of a deployment dir
    "install": Op(True),                # {files: [{path, mode, sha256, data_b64}]} -> {digests}
    "read": Op(False),                  # {path, offset, limit} -> {data_b64}
    "size": Op(False),                  # {path} -> {size}
    "http": Op(False),                  # {method, address, port, path, headers, body_b64?, timeout} -> {status, ...}
    "mkdirs": Op(True),                 # {path, owned_from}: mkdir -p that refuses a chain another user controls
    # files.py's: inside the deployment dir only, never through a symlink
    "link": Op(True, "files"),
    "readlink": Op(False, "files"),
    "remove": Op(True, "files"),
    "disk": Op(False, "files"),
    "mkdir": Op(True, "files"),
    "listdir": Op(False, "files"),
    "find_bytes": Op(False, "files"),
    "kernel_log": Op(False, "files"),
    "lease_show": Op(False, "files"),
    "runs": Op(False, "files"),
    # install.py's managed environments (env_build runs its steps with the helper's lease tokens)
    "env_build": Op(True),
    "env_prune": Op(True, "install"),
    # push.py's retention of pushed model directories
    "models_prune": Op(True, "push"),
    # programs of their own, for minutes: not fenced, as when they were exec channels (the client's lock guards them)
    "listen": Op(False, "reach"),       # a node group's dist-init port held open a moment (reach.py)
    "reach": Op(False, "reach"),        # ... and connected to from a follower
    "fetch": Op(False, "fetch", program=True),  # weights from the hub (fetch.py's lines)
    "push": Op(False, "push", program=True),    # a model directory received (push.py's lines)
    "feed": Op(False),                          # {stream, data_b64?, eof?}: a program's stdin
}
HELPER_OPS: Tuple[str, ...] = tuple(OPS)
# Supervisor commands the helper answers in its own process (quick, read-only); start and stop stay processes.
IN_HELPER: Tuple[str, ...] = ("status", "ports", "listener")


class RestartConfig(TypedDict, total=False):
    policy: str                 # one of POLICIES
    max: int
    backoff_s: List[float]      # [first, cap]
    window_s: float
    stable_s: float             # ready this long with no crash: the run is marked stable (a good version)
    drain_s: float              # a stop lets the engine finish what is in flight this long before the grace


class LogsConfig(TypedDict, total=False):
    max_bytes: int              # engine.log is rotated once bigger than this
    head_bytes: int             # its first bytes (the startup lines) stay in engine.log
    keep: int                   # rotated tails kept: engine.log.1 (newest) .. engine.log.<keep>


class ProbeConfig(TypedDict, total=False):
    """The one-token probe after ready (probe.TokenWatch); absent in older files: no probe."""

    path: str                   # the engine's completion endpoint (/v1/completions)
    model: str                  # the model name the engine serves
    address: str                # where the target reaches the engine
    port: int
    health_path: str            # failures while this fails too wait exit_grace_s for the engine's own exit
    interval_s: float           # 0: off
    failures: int               # failed probes in a row, while idle, that make a crash
    timeout_s: float            # one probe's wait for its token
    exit_grace_s: float         # health.probe_exit_grace_s (absent: probe.EXIT_GRACE_S)
    running_metrics: List[str]  # the engine's gauges of requests running / waiting (its metrics.yaml)
    waiting_metrics: List[str]
    api_key_env: str            # the env file variable holding the API key (--api-key), if one is set
    progress_metrics: List[str]  # the engine's counters that advance on every step (the hang rule, hang)
    hang_s: float               # health.hang_s; absent: derived from the steps seen
    hang_poll_s: float          # seconds between two readings of /metrics by the hang rule (default 1)
    engine_labels: List[str]    # the labels that tell data-parallel engines apart (the hang rule judges each)


class ReplicaWatchConfig(TypedDict, total=False):
    """A fleet router's watch of its replicas (replicas): the hang rule on each, a hung one pulled."""

    address: str                # where the supervisor reaches the router's API (smg, on its own host)
    port: int
    control_key_env: str        # the env file variable holding the router's control key (its worker API)
    api_key_env: str            # the env file variable holding the replicas' API key, if one is set
    running_metrics: List[str]  # the replicas' engine's gauges and progress counters (its metrics.yaml)
    waiting_metrics: List[str]
    progress_metrics: List[str]
    engine_labels: List[str]
    hang_s: float               # the fleet's health.hang_s; absent: derived from the steps seen
    poll_s: float               # seconds between two cycles of the watch (default 1)
    path: str                   # the engine's completion endpoint: the one-token completion before an add-back
    model: str
    health_path: str


class SuperviseConfig(TypedDict, total=False):
    """supervise.json: how the supervisor runs the engine (box/supervised.supervise_config writes it)."""

    launch: str                 # the script, relative to the run dir (LAUNCH_SH)
    env_file: str               # ENV_FILE
    log: str                    # ENGINE_LOG
    grace_s: float
    port: int
    name: str                   # the deployment
    ready_pattern: str
    fatal_patterns: List[str]
    fatal_grace_s: float
    restart: RestartConfig
    logs: LogsConfig
    on_boot: bool               # an @reboot crontab entry starts this run again after a reboot (removed by down)
    group: Dict[str, Any]       # one engine across nodes: the peers to watch (fleet/nodes)
    probe: ProbeConfig          # the one-token probe after ready
    replica_watch: ReplicaWatchConfig  # a fleet's router: the hang rule on its replicas (replicas)


class ProfileRecord(TypedDict, total=False):
    """profile.json: what the target keeps about an attempt (secrets masked), for status/history from anywhere."""

    name: str
    role: str                   # a fleet's router (deployments/fleet/router.py); absent for an engine
    fleet: str                  # the router's fleet
    content_hash: str
    settings_hash: str          # the router's settings without its worker set
    attempt: int
    up_id: str
    written_hash: Optional[str]
    argv: List[str]
    env: Dict[str, str]         # masked
    port: int
    health_path: str
    kind: str
    workers: List[str]          # the router's worker URLs at its start
    profile: Dict[str, Any]     # Profile.public_dict()
    secret_templates: Dict[str, Any]
    pushed_at: float
    helper: str                 # the content hash of the helper that wrote the run dir


class Crash(TypedDict, total=False):
    at: float
    exit_code: Optional[int]
    signal: Optional[int]
    signal_name: Optional[str]
    log_offset: int
    traceback_offset: Optional[int]
    probe_dead: Optional[Dict[str, Any]]  # ended by the one-token probe: {at, reason, failures}
    hung: Optional[Dict[str, Any]]  # ended by the hang rule (State.hung's record)


class State(TypedDict, total=False):
    """state.json as the supervisor writes it; `alive`/`supervisor_alive`/`supervisor`/`heartbeat_age_s` are added by
    `status`."""

    status: str                 # LIVE + ENDED, or ABSENT
    supervisor_pid: Optional[int]
    pid: Optional[int]
    pgid: Optional[int]
    started_at: Optional[float]
    ready_at: Optional[float]
    ended_at: Optional[float]
    updated_at: float
    heartbeat_at: Optional[float]  # rewritten at least every HEARTBEAT_EVERY s while the daemon runs (base)
    exit_code: Optional[int]
    signal: Optional[int]
    signal_name: Optional[str]
    restarts: int
    last_crash: Optional[Crash]
    log_offset: int
    traceback_offset: Optional[int]
    peer_lost: Optional[str]
    stable_at: Optional[float]  # when the engine had been ready for restart.stable_s with no crash (a good run)
    crashloop_after_ready: bool  # it crash-looped after it had been ready (a version not to go back to)
    stopped_from: Optional[str]  # `down` of an ended run: the status it had (exited, crashloop, lost)
    unhealthy: Optional[Dict[str, Any]]  # the last probe failed while ready: {since, reason, running, waiting, failures}
    hung: Optional[Dict[str, Any]]  # the hang rule ended it: {at, reason, running, waiting, progress, stalled_s,
                                    # hang_s, derived, longest_step_s, stacks: {file, method, processes}}
    pulled: Optional[Dict[str, Dict[str, Any]]]  # a fleet's router: replica URL -> why its watch pulled it
                                # {at, why: hung, reason, stalled_s, hang_s, posted_at?, not_back?}
    rotated: int                # bytes of engine.log moved out to engine.log.1 so far (offsets shift by it)
    alive: bool
    supervisor_alive: bool
    supervisor: Optional[str]   # added by `status`: ok | dead | frozen (base.supervision); None: ended
    heartbeat_age_s: Optional[float]


class Outcome(TypedDict, total=False):
    """outcome.json: how an attempt ended (pipeline's AttemptReport.to_json, or a not-started note)."""

    attempt: int
    run_id: str
    content_hash: str
    outcome: str                # ready | crashed | hung | timeout | not-started | ...
    detail: str
    diagnosis: Optional[Dict[str, Any]]
    change: Optional[Dict[str, Any]]
    drift: List[str]
