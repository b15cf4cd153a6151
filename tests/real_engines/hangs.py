"""The hang and drain phases of the real-engine tier (issue 37), run on a deployment a test already has (a real
engine start costs 30-120 s on CI, so no phase deploys its own):

- `assert_hung_under_load`: the engine's stepping process (vLLM's EngineCore, SGLang's scheduler:
  tests/engine_cores.py) frozen with SIGSTOP while requests run -> the supervisor's hang rule says hung within
  the profile's health.hang_s (+ its poll), the stacks of the group are kept in the run dir and named by
  `status`, `history` says hung, the engine is restarted and serves again.
- `assert_saturated_is_never_hung`: every core busy with requests for twice health.hang_s -> the steps advance,
  no hung record, no restart (issue 37: no false restarts under saturation).
- `assert_frozen_while_idle_is_restarted`: the stepping process frozen with no request at all -> the gauges say
  idle for good (the hang rule has nothing to judge), the one-token probe fails and so does SGLang's /health (it
  generates a token itself); the engine never exits, so once that has gone on for health.probe_exit_grace_s the
  probes make the crash: restarted, serving again (a .ci/run on 2026-12-05 froze it so by chance).
- `restart_drains`: `deploy restart` with requests in flight under restart.drain_s -> every request that was
  running when the engine got SIGTERM finishes with all its tokens (none lost), then the new engine serves.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from deploy_helpers import deploy
from deployer.remote.connect import connect
from engine_cores import CORE_TITLE, titled_in_group
from lifecycle import DEPLOY_S, chat, report_of, status_row, wait_status


def signal_titled(host: Any, pgid: int, title: str, signal: str) -> list[int]:
    """Send `signal` to the processes of the engine's group whose title starts with `title`, on the target (its
    own PID namespace: the pids are the target's)."""
    remote = connect(host.spec())
    try:
        found = [int(p) for p in remote.run(titled_in_group(title, pgid), timeout=30).stdout.split()]
        for pid in found:
            remote.run(f"kill -{signal} {pid}", timeout=30)
    finally:
        remote.close()
    return found


class Clients:
    """`n` threads, each sending completions of `tokens` tokens (ignore_eos) until stopped, or `once`; each
    answer kept as (started, ended, completion tokens or the error); as a context, stopped at its end."""

    def __init__(self, port: int, model: str, tokens: int, n: int, once: bool = False, timeout: float = 240,
                 halt: threading.Event | None = None, stagger_s: float = 0.0, most: int = 50) -> None:
        """`halt`: no new request once it is set; `stagger_s`: client i sends its first request i x stagger_s late
        (so that at any moment their requests are at different points of their run); `most`: requests a client
        sends at most."""
        self.port, self.model, self.tokens, self.once, self.timeout = port, model, tokens, once, timeout
        self.most = most
        self.stop = threading.Event()
        self.halt = halt or self.stop
        self.done: list[tuple[float, float, int | str]] = []
        self.threads = [threading.Thread(target=self._client, args=(i * stagger_s,), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _client(self, delay: float) -> None:
        body = json.dumps({"model": self.model, "prompt": "hello", "max_tokens": self.tokens, "ignore_eos": True,
                           "temperature": 0}).encode()
        self.stop.wait(delay)
        for _ in range(1 if self.once else self.most):   # bounded: `most` requests of at most `timeout` s each
            if self.stop.is_set() or self.halt.is_set():
                return
            started = time.time()
            request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                    got: int | str = int(json.loads(resp.read())["usage"]["completion_tokens"])
            except (OSError, urllib.error.URLError, ValueError, KeyError) as e:
                got = f"{type(e).__name__}: {e}"
                self.stop.wait(0.5)   # a refused request: not a busy loop
            self.done.append((started, time.time(), got))

    def __enter__(self) -> Clients:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(deadline - time.monotonic(), 0.1))

    def end(self) -> None:
        self.stop.set()
        self.join(60)


def _running(row: dict[str, Any]) -> bool:
    return ((row.get("metrics") or {}).get("requests_running") or 0) > 0


def _state(row: dict[str, Any]) -> dict[str, Any]:
    """The supervisor's own record of the row's run (the test host is this machine)."""
    data: dict[str, Any] = json.loads((Path(row["run_dir"]) / "state.json").read_text())
    return data


def assert_hung_under_load(prof: Path, home: Path, host: Any, port: int, model: str, kind: str,
                           tokens: int = 300) -> dict[str, Any]:
    """Freeze the engine's stepping process with 4 requests in flight: hung within health.hang_s (+ the rule's
    poll and a loaded machine's slack), its stacks in the run dir and in `status`, `history` says hung, one
    restart, serving again. Returns the row after."""
    hang_s = float(_profile_health(prof)["hang_s"])
    _, before = status_row(prof, home)
    # staggered: four requests started together end together, and in that gap the scheduler goes idle and SGLang
    # republishes its running gauge as 0; frozen right then, /metrics says idle forever (a CI run, 2026-12-05)
    clients = Clients(port, model, tokens, 4, stagger_s=0.7)
    try:
        busy = wait_status(prof, home, lambda r: _running(r) and len(clients.done) >= 2, 120,
                           "requests running, staggered")
        cores = signal_titled(host, busy["pid"], CORE_TITLE[kind], "STOP")
        frozen_at = time.time()
        assert len(cores) == 1, (cores, busy)
        # ready as well as healthy: a restarted engine's /health may answer before its ready line (SGLang's
        # warmup), and status says `running` until that line (red once on CI under load)
        after = wait_status(prof, home, lambda r: r.get("restarts", 0) > before["restarts"] and r.get("healthy")
                            and r.get("status") == "ready", hang_s + 300, "the frozen engine hung, restarted, ready")
    finally:
        clients.end()
    crash = _state(after)["last_crash"]
    hung = crash.get("hung")
    assert hung, crash   # the hang rule ended it, not the probe nor an exit
    detected = hung["at"] - frozen_at
    assert hung["hang_s"] == hang_s and not hung["derived"], hung
    assert hang_s - 3 <= detected <= hang_s + 15, (detected, hung)   # the rule's clock, polled every second
    assert hung["running"] + hung["waiting"] >= 1 and hung["stalled_s"] >= hang_s, hung
    stacks = hung["stacks"]
    assert (Path(after["run_dir"]) / stacks["file"]).is_file() and stacks["processes"], stacks
    status = deploy("status", str(prof), home=home, timeout=60).stdout
    assert "last crash: hung: " in status and f"in the run dir: {stacks['file']}" in status, status
    history = deploy("history", str(prof), home=home, timeout=60).stdout
    assert "    hung: " in history and "no engine step for" in history, history
    assert after["status"] == "ready" and after["pid"] != before["pid"], after
    assert chat(port, model)["usage"]["completion_tokens"] >= 1
    return after


def assert_frozen_while_idle_is_restarted(prof: Path, home: Path, host: Any, port: int, model: str,
                                         kind: str) -> dict[str, Any]:
    """Freeze the engine's stepping process while nothing runs: restarted by the one-token probe (not the hang
    rule), with what /health said in the record and the diagnosis. Returns the row after."""
    health = _profile_health(prof)
    _, before = status_row(prof, home)
    assert before["status"] == "ready" and not _running(before), before
    cores = signal_titled(host, before["pid"], CORE_TITLE[kind], "STOP")
    frozen_at = time.time()
    assert len(cores) == 1, (cores, before)
    # a probe takes up to probe_timeout_s and /health's 5 s; probe_failures of them, over probe_exit_grace_s
    bound = health["probe_exit_grace_s"] + (health["probe_failures"] + 2) * (health["probe_interval_s"] +
                                                                           health["probe_timeout_s"] + 10) + 300
    after = wait_status(prof, home, lambda r: r.get("restarts", 0) > before["restarts"] and r.get("healthy")
                        and r.get("status") == "ready", bound, "the engine frozen while idle restarted, ready")
    crash = _state(after)["last_crash"]
    dead = crash.get("probe_dead")
    assert dead and not crash.get("hung"), crash    # the probes ended it: the gauges never said busy
    assert dead["failures"] >= health["probe_failures"] and dead["health"] != 200, dead
    assert dead["at"] - frozen_at >= health["probe_exit_grace_s"], (dead, frozen_at)
    diagnosis = after["last_crash"]["diagnosis"]
    assert diagnosis["signature"] == "no-token" and any("never exited" in e for e in diagnosis["evidence"]), diagnosis
    assert after["pid"] != before["pid"] and chat(port, model)["usage"]["completion_tokens"] >= 1
    return after


def assert_saturated_is_never_hung(prof: Path, home: Path, port: int, model: str, clients_n: int = 8,
                                   tokens: int = 256) -> dict[str, Any]:
    """`clients_n` clients of `tokens`-token completions back to back for twice the profile's health.hang_s: every
    core of this machine busy, each engine step slow, requests running the whole time. The hang rule must see the
    steps advance: no hung record, no restart, the same pid, every request answered with all its tokens. Returns
    the row after."""
    hang_s = float(_profile_health(prof)["hang_s"])
    _, before = status_row(prof, home)
    seen_running, looks = 0, 0
    with Clients(port, model, tokens, clients_n, timeout=2 * hang_s + 120) as clients:
        wait_status(prof, home, _running, 120, "requests running")
        until = time.monotonic() + 2 * hang_s
        while time.monotonic() < until and looks < 200:   # bounded: a look is one `deploy status`
            _, row = status_row(prof, home)
            looks += 1
            seen_running += _running(row)
            assert row.get("restarts") == before["restarts"] and row.get("pid") == before["pid"], row
        clients.halt.set()   # no new request; those in flight end
        clients.join(120)
    after = wait_status(prof, home, lambda r: not _running(r), 120, "the load drained")
    assert after["restarts"] == before["restarts"] and after["pid"] == before["pid"], after
    assert after["status"] == "ready" and not (_state(after).get("last_crash") or {}).get("hung"), after
    answered = [got for _, _, got in clients.done]
    assert answered and all(got == tokens for got in answered), answered   # none failed, none cut short
    assert seen_running >= looks // 2, (seen_running, looks)   # it was loaded while the rule watched
    return after


def _profile_health(prof: Path) -> dict[str, Any]:
    import yaml

    health: dict[str, Any] = yaml.safe_load(prof.read_text())["health"]
    return health


def restart_drains(prof: Path, home: Path, port: int, model: str, drain_s: float, most: int) -> dict[str, Any]:
    """`deploy restart` under steady load, the profile's restart.drain_s `drain_s`: 3 clients send requests back to
    back (each ~REQUEST_S, at most `most` tokens; staggered) until they see the old run stopping. Every request
    that started before the engine got SIGTERM ended with all its tokens (none lost, none cut short), at least one
    of them was still running half a second after the stop was seen (so the drain, not luck, kept it), none took
    drain_s, and
    a request answered after the stop began got all its tokens too. Returns the restart's report."""
    _, before = status_row(prof, home)
    old_run = Path(before["run_dir"])
    tokens = tokens_for(port, model, REQUEST_S, most)
    stopping = StopWatch(old_run / "state.json")
    # until the stop (a restart on a loaded machine took 3 minutes to reach it once: 50 requests each ran out first)
    clients = Clients(port, model, tokens, 3, timeout=drain_s + 60, halt=stopping.seen, stagger_s=REQUEST_S / 3,
                      most=int((DEPLOY_S + drain_s) / REQUEST_S) + 50)
    try:
        try:
            wait_status(prof, home, lambda r: _running(r) and len(clients.done) >= 1, 120,
                        "requests running, one of them done")
        except AssertionError as e:   # say what the clients got (seen once with vLLM: no request ever running)
            raise AssertionError(f"{e}; {tokens} tokens a request; answers {clients.done}") from None
        began = time.monotonic()
        restart = deploy("restart", str(prof), "--json", home=home, timeout=DEPLOY_S + drain_s)
        took = time.monotonic() - began
        clients.join(drain_s + 60)
    finally:
        stopping.end()
        clients.end()
    assert restart.returncode == 0, restart.stdout[-3000:] + restart.stderr
    assert stopping.last_ready is not None and stopping.seen_at is not None, "the old run never said stopping"
    _stop_noted_at(old_run)   # the stop was the supervisor's SIGTERM (its line), not an exit
    answers = sorted(clients.done)
    before_stop = [a for a in answers if a[0] < stopping.last_ready]   # surely started before the SIGTERM
    assert before_stop and all(got == tokens for _, _, got in before_stop), (before_stop, tokens)  # none lost
    # in flight at the SIGTERM, which follows the saved `stopping` by the time the supervisor takes to look at
    # /dev/shm (milliseconds): a request that ended half a second after that look saw it
    assert any(ended > stopping.seen_at + 0.5 for _, ended, _ in before_stop), (answers, stopping.seen_at)
    assert all(ended - started < drain_s for started, ended, _ in before_stop), (answers, drain_s)
    answered = [got for _, _, got in answers if isinstance(got, int)]
    assert all(got == tokens for got in answered), (answers, tokens)   # an answer is never cut short
    report = report_of(restart.stdout)
    assert report["status"] == "ready" and took < DEPLOY_S + drain_s, report
    return report


class StopWatch:
    """Polls a run's state.json every 50 ms (bounded) until it leaves `ready`: the supervisor saves `stopping`
    just before it sends the engine SIGTERM (daemon.stop). `last_ready`: when the last look that still
    read `ready` began (the SIGTERM came after it); `seen_at`: when the first look that did not ended, and `seen`
    is set then (the clients' halt)."""

    def __init__(self, state: Path, limit_s: float = DEPLOY_S + 300) -> None:
        self.state, self.limit_s = state, limit_s
        self.seen, self.done = threading.Event(), threading.Event()
        self.last_ready: float | None = None
        self.seen_at: float | None = None
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + self.limit_s
        while not self.done.is_set() and time.monotonic() < deadline:
            looked = time.time()
            try:
                status = json.loads(self.state.read_text()).get("status")
            except (OSError, ValueError):
                status = None   # replaced atomically: a failed read is only a missed look
            if status == "ready":
                self.last_ready = looked
            elif status is not None and self.last_ready is not None:
                self.seen_at = time.time()
                self.seen.set()
                return
            self.done.wait(0.05)

    def end(self) -> None:
        self.done.set()
        self.thread.join(5)


# How long each request at the restart should take alone (3 together take longer, well under drain_s): long, so
# that at the SIGTERM the three have seconds apart left to run (at 6 s all three ended within 1.3 s of it once)
REQUEST_S = 12.0


def tokens_for(port: int, model: str, seconds: float, most: int) -> int:
    """The tokens one request generates in about `seconds` on this machine now (from one 32-token request),
    within 64..`most`."""
    began = time.monotonic()
    with Clients(port, model, 32, 1, once=True) as one:
        one.join(120)
    took = time.monotonic() - began
    assert one.done and one.done[0][2] == 32, one.done
    return max(64, min(most, int(seconds * 32 / max(took, 0.01))))


def _stop_noted_at(run: Path) -> float:
    """When the supervisor of `run` sent the engine SIGTERM for the stop (its supervisor.log line, to the second)."""
    for line in (run / "supervisor.log").read_text().splitlines():
        if " stop requested: SIGTERM" in line:
            return time.mktime(time.strptime(line.split(" ", 1)[0], "%Y-%m-%dT%H:%M:%S"))
    raise AssertionError(f"no stop in {run / 'supervisor.log'}")
