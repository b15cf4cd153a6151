"""`deploy dashboard` over real targets: the real sshd bed, the stand-in engine healed once (SGLang's Mamba + MTP
failure of the 0.5.10 era), read through the Deployment interface (deployer.dashboard.live) with one SSH
connection per host kept open, and the command itself (its first stdout line, the token, 127.0.0.1 only)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from deploy_helpers import REPO, crash_looping_deployment, deploy, healed_deployment, write_profile
from deployer.dashboard.live import LiveSource, watched
from deployer.dashboard.model import LogRequest
from deployer.deployments.resolve import Mode, resolve
from deployer.remote import connect as connect_module
from deployer.profile.loader import load_profile
from deployer.remote.connect import kept_open
from deployer.box.lock import DeploymentLock
from deployer.box.push import layout_for, prepare

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]



@pytest.fixture(scope="module")
def healed(tmp_path_factory: pytest.TempPathFactory, sshd: Any) -> Iterator[tuple[Path, Path]]:
    with healed_deployment(tmp_path_factory.mktemp("dash"), sshd, "dashdemo") as made:
        yield made


def test_rows_timeline_and_log_through_one_kept_connection(healed: tuple[Path, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    prof, home = healed
    monkeypatch.setenv("DEPLOYER_HOME", str(home))
    opened: list[Any] = []
    real_connect = connect_module.connect

    def counting(spec: Any) -> Any:
        opened.append(spec)
        return real_connect(spec)

    monkeypatch.setattr(connect_module, "connect", counting)
    source = LiveSource([watched(resolve(str(prof), mode=Mode(read_only=True, remembered=False)))])
    with kept_open():
        (row,) = source.overview()
        assert (row.name, row.status, row.serving, row.engine) == ("dashdemo", "ready", True, "sglang")
        detail = source.detail(row.key)
        assert detail is not None
        first, second = detail.attempts                 # oldest first
        assert (first.outcome, second.outcome) == ("crashed", "ready") and second.current
        assert first.healed and first.change is not None
        assert first.change.args == {"mamba_scheduler_strategy": "extra_buffer"}
        assert first.diagnosis is not None and first.diagnosis.signature == "mamba-spec-needs-extra-buffer"
        assert [p.phase for p in second.phases][-1] == "ready"      # the timeline up recorded for the attempt
        assert [p.elapsed for p in second.phases] == sorted(p.elapsed for p in second.phases)
        assert detail.memory == ()       # its plan has no estimate: the model's config.json is not on the target

        tail = source.log(row.key, LogRequest(None, 64 << 10))
        assert tail is not None and tail.lines and tail.run_id == second.run_id
        status = resolve(str(prof)).status().to_json()
        log = Path(status["run_dir"]) / "engine.log"
        with log.open("a") as f:                      # what the engine writes between two polls
            f.write("a new line <script>alert(1)</script>\n")
        more = source.log(row.key, LogRequest(tail.end, 64 << 10))
        # the status just above asked /health, which the engine logged too: that line, then ours, nothing before
        assert more is not None and more.lines[-1] == "a new line <script>alert(1)</script>"
        assert not set(more.lines) & set(tail.lines) and len(more.lines) <= 3, more.lines
        assert more.start == tail.end and more.end == log.stat().st_size
        source.overview()
    assert len(opened) == 1, opened                    # every read above went over one connection


def test_the_memory_picture_is_the_plan_of_the_profile(tmp_path: Path, sshd: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path / "home"))
    prof = write_profile(tmp_path, sshd, name="dashmem", model=str(REPO / "tests" / "fixtures" / "models" / "qwen3-8b"),
                         args={"enable_metrics": True})
    assert deploy("up", str(prof), "--skip-preflight", home=tmp_path / "home").returncode == 0
    try:
        source = LiveSource([watched(resolve(str(prof), mode=Mode(read_only=True, remembered=False)))])
        (row,) = source.overview()
        assert row.requests == 0 and row.kv_usage_pct is not None   # the engine's /metrics, as status reads it
        detail = source.detail(row.key)
        assert detail is not None
        (gpu,) = detail.memory                          # the stand-in nvidia-smi's one H200
        assert gpu.name == "NVIDIA H200" and gpu.total_mib == 143771
        assert 14_000 < gpu.weights_mib < 17_000 and gpu.kv_mib > 0 and gpu.headroom_mib >= 0, gpu
    finally:
        deploy("down", str(prof), home=tmp_path / "home")


def test_a_failed_replace_shows_the_version_brought_back(tmp_path: Path, sshd: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("DEPLOYER_HOME", str(home))
    good = write_profile(tmp_path, sshd, name="dashback")
    assert deploy("up", str(good), "--skip-preflight", home=home).returncode == 0
    port = resolve(str(good)).status().to_json()["port"]
    bad = write_profile(tmp_path, sshd, name="dashback", env={"STANDIN_MODE": "crash"}, file="bad.yaml", port=port)
    assert deploy("up", str(bad), "--skip-preflight", "--no-heal", home=home).returncode == 5
    try:
        source = LiveSource([watched(resolve(str(good), mode=Mode(read_only=True, remembered=False)))])
        (row,) = source.overview()
        detail = source.detail(row.key)
        assert detail is not None and row.status == "ready"
        first, *failed = detail.attempts
        assert first.current and failed and all(a.outcome != "ready" for a in failed)
        (back,) = detail.rollbacks
        assert back.run_id == first.run_id and back.status == "ready" and failed[-1].run_id in (back.reason or "")
    finally:
        deploy("down", str(good), home=home)


def test_an_unreachable_host_is_a_row_not_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOYER_HOME", str(tmp_path))
    source = LiveSource([watched(resolve("ghost", "nobody@127.0.0.1:1"))])
    with kept_open():
        (row,) = source.overview()
    assert row.status == "unreachable" and not row.serving


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read(), reply.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def test_the_command_prints_its_address_and_serves_only_with_the_token(healed: tuple[Path, Path]) -> None:
    prof, home = healed
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DEPLOYER_HOME": str(home),
           "HOME": os.environ.get("HOME", "/root")}
    proc = subprocess.Popen([sys.executable, "-m", "deployer.cli", "dashboard", str(prof), "--refresh", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        parts = urlsplit(url)
        assert parts.hostname == "127.0.0.1" and parts.fragment.startswith("ticket=") and not parts.query
        base = f"http://127.0.0.1:{parts.port}"
        assert _get(f"{base}/api/overview")[0] == 401
        assert _get(f"{base}/api/overview", {"Authorization": "Bearer wrong"})[0] == 403
        code, body, headers = _get(f"{base}/api/session", {"X-Deployer-Ticket": parts.fragment[len("ticket="):]})
        assert code == 200 and "Set-Cookie" not in headers
        bearer = {"Authorization": f"Bearer {json.loads(body)['token']}"}
        assert "another one: http://127.0.0.1:" in proc.stdout.readline()   # the next ticket, for another browser
        code, body, _ = _get(f"{base}/api/overview", bearer)
        assert code == 200
        (row,) = json.loads(body)["rows"]
        assert (row["name"], row["status"], row["serving"]) == ("dashdemo", "ready", True)
        code, body, _ = _get(f"{base}/api/deployment?key={row['key']}", bearer)
        assert code == 200 and [a["outcome"] for a in json.loads(body)["attempts"]] == ["crashed", "ready"]
        listening = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
        mine = [line for line in listening.splitlines() if f"pid={proc.pid}," in line]
        assert mine and all(f"127.0.0.1:{parts.port}" in line for line in mine), mine
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=30)
        finally:
            proc.kill()
    assert rc == 0, proc.stderr.read() if proc.stderr else ""


@pytest.mark.parametrize("argv, says", [
    ((), "name at least one deployment"),
    (("--workdir", "/x"), "--workdir belongs after"),
    (("demo", "--bogus"), "no such option: --bogus"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path: Path, argv: tuple[str, ...], says: str) -> None:
    started = time.monotonic()
    out = deploy("dashboard", *argv, home=tmp_path)
    assert out.returncode == 2 and says in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert time.monotonic() - started < 30


def test_every_deployment_on_a_host_opens_its_page(healed: tuple[Path, Path], sshd: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`deploy dashboard --host H --workdir W` (issue 36): each row's page (its attempts) and its log, not an
    AssertionError (`assert ref.name` in operate/history.py and logwindow.py: a host-wide deployment has no name)."""
    prof, home = healed
    monkeypatch.setenv("DEPLOYER_HOME", str(home))
    monkeypatch.setenv("DEPLOYER_SSH_CONFIG", str(sshd.ssh_config))
    host, workdir = "deployer-test", str(prof.parent / "work")
    read = Mode(read_only=True, remembered=False)
    source = LiveSource([watched(resolve(None, host, workdir, mode=read),
                                 named=lambda name: resolve(name, host, workdir, mode=read))])
    with kept_open():
        (row,) = [r for r in source.overview() if r.name == "dashdemo"]
        assert row.status == "ready" and row.serving
        detail = source.detail(row.key)
        assert detail is not None and [a.outcome for a in detail.attempts] == ["crashed", "ready"]
        tail = source.log(row.key, LogRequest(None, 64 << 10))
        assert tail is not None and tail.lines and tail.run_id == detail.attempts[-1].run_id


def test_the_command_with_only_a_host_serves_each_deployments_page(healed: tuple[Path, Path], sshd: Any) -> None:
    prof, home = healed
    argv = ("--host", "deployer-test", "--workdir", str(prof.parent / "work"))
    with signed_in_dashboard(argv, _env(home, sshd)) as (base, bearer, proc):
        code, body, _ = _get(f"{base}/api/overview", bearer)
        (row,) = [r for r in json.loads(body)["rows"] if r["name"] == "dashdemo"]
        code, body, _ = _get(f"{base}/api/deployment?key={row['key']}", bearer)
        assert code == 200 and [a["outcome"] for a in json.loads(body)["attempts"]] == ["crashed", "ready"], body
        code, body, _ = _get(f"{base}/api/log?key={row['key']}", bearer)
        assert code == 200 and json.loads(body)["lines"], body
    stderr = proc.stderr.read() if proc.stderr else ""
    assert proc.returncode == 0 and "Traceback" not in stderr and "AssertionError" not in stderr, stderr


@contextmanager
def signed_in_dashboard(argv: tuple[str, ...], env: dict[str, str]
                        ) -> Iterator[tuple[str, dict[str, str], subprocess.Popen[str]]]:
    """`deploy dashboard ARGV` running, signed in as a browser is (the printed URL's one-time ticket traded for the
    token): its base URL, the bearer header, the process (stopped with Ctrl-C when the block ends)."""
    proc = subprocess.Popen([sys.executable, "-m", "deployer.cli", "dashboard", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
    try:
        assert proc.stdout is not None
        parts = urlsplit(proc.stdout.readline().strip())
        base = f"http://127.0.0.1:{parts.port}"
        code, body, _ = _get(f"{base}/api/session", {"X-Deployer-Ticket": parts.fragment[len("ticket="):]})
        assert code == 200, body
        yield base, {"Authorization": f"Bearer {json.loads(body)['token']}"}, proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        finally:
            proc.kill()


# --- the dashboard shows what status shows (issue 36) ------------------------------------------------------------

# status's fields and the dashboard row's of the same name (the row spells the crash loop and the lock its own way)
SAME_FIELDS = ("name", "host", "status", "healthy", "serving", "engine", "engine_version", "model", "pid", "uptime_s",
               "restarts", "attempt", "content_hash", "run_dir", "port")
DIAGNOSIS_FIELDS = ("signature", "summary", "hint", "evidence", "traceback")


@pytest.fixture(scope="module")
def crash_looping(tmp_path_factory: pytest.TempPathFactory, sshd: Any) -> Iterator[tuple[Path, Path]]:
    with crash_looping_deployment(tmp_path_factory.mktemp("loop"), sshd, "dashloop") as made:
        yield made


def _env(home: Path, sshd: Any) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DEPLOYER_HOME": str(home),
            "HOME": os.environ.get("HOME", "/root"), "DEPLOYER_SSH_CONFIG": str(sshd.ssh_config)}


def _status_json(argv: tuple[str, ...], home: Path, sshd: Any) -> Any:
    out = deploy(*argv, "--json", home=home, env={"DEPLOYER_SSH_CONFIG": str(sshd.ssh_config)})
    assert out.stdout.strip() and "Traceback" not in out.stderr, out.stderr
    return json.loads(out.stdout)


def _dashboard_json(argv: tuple[str, ...], home: Path, sshd: Any, name: str) -> tuple[Any, Any]:
    """`deploy dashboard ARGV` as a browser reads it: the overview row of `name` and its page's row (the API's
    JSON, through the server's safe edge)."""
    with signed_in_dashboard(argv, _env(home, sshd)) as (base, bearer, _):
        code, body, _ = _get(f"{base}/api/overview", bearer)
        (row,) = [r for r in json.loads(body)["rows"] if r["name"] == name]
        code, body, _ = _get(f"{base}/api/deployment?key={row['key']}", bearer)
        assert code == 200, body
        return row, json.loads(body)["row"]


def _holder(lock: str | None) -> str | None:
    """Who holds the lock, as status says it, without the heartbeat's age (which moves between two reads)."""
    return None if lock is None else lock.split(" (heartbeat", 1)[0]


@contextmanager
def held_lock(sshd: Any, prof: Path) -> Iterator[None]:
    """The deployment's lock held by this test (as a running `up` would hold it) while status and the dashboard
    read it."""
    remote = connect_module.connect(sshd.spec())
    try:
        layout = layout_for(remote, load_profile(prof))
        prepare(remote, layout)
        with DeploymentLock(remote, layout, "the dashboard test"):
            yield
    finally:
        remote.close()


def assert_shows_what_status_shows(status: dict[str, Any], row: dict[str, Any]) -> None:
    """Every field `deploy status` shows of a deployment, in the dashboard's row, field by field."""
    for field in SAME_FIELDS:
        assert row[field] == status[field], (field, row[field], status[field])
    assert row["crash_loop"] == (status["status"] == "crashloop")
    crash = status["last_crash"]
    assert row["last_crash"] == (None if not crash else {k: crash.get(k) for k in ("at", "exit_code", "signal_name")})
    diagnosis = status["diagnosis"] or (crash or {}).get("diagnosis")
    assert (row["diagnosis"] is None) == (diagnosis is None), (row["diagnosis"], diagnosis)
    for field in DIAGNOSIS_FIELDS if diagnosis else ():
        assert row["diagnosis"][field] == diagnosis.get(field, [] if field == "evidence" else None), field
    assert _holder(row["lock"]) == _holder((status["lock"] or {}).get("text"))
    assert row["unhealthy"] == (None if status["unhealthy"] is None else status["unhealthy"].get("reason"))
    metrics = status["metrics"] or {}
    p99 = (metrics.get("e2e_latency") or {}).get("p99_s")
    assert (row["tokens_per_s"], row["p99_latency_ms"]) == \
        (metrics.get("generation_tokens_per_s"), None if p99 is None else round(p99 * 1000, 1))
    if not metrics:                                     # not serving: no numbers on either side
        assert (row["requests"], row["kv_usage_pct"]) == (None, None), row


@pytest.mark.parametrize("form", ["profile", "name", "host"])
def test_the_dashboard_shows_what_status_shows(crash_looping: tuple[Path, Path], sshd: Any, form: str) -> None:
    """For one crash-looping deployment, named by its profile, by name + --host, or among every deployment of a
    host: `deploy status --json` and the dashboard API's row and page, field by field (engine and version, the
    crash loop, the last crash's diagnosis included)."""
    prof, home = crash_looping
    where = ("--host", "deployer-test", "--workdir", str(prof.parent / "work"))
    args = {"profile": (str(prof),), "name": ("dashloop", *where), "host": where}[form]
    with held_lock(sshd, prof):
        status = _status_json(("status", *args), home, sshd)
        overview, page = _dashboard_json(args, home, sshd, "dashloop")
    if form == "host":
        (status,) = [s for s in status if s["name"] == "dashloop"]
    assert "the dashboard test" in status["lock"]["text"], status["lock"]
    assert (status["status"], status["engine"], status["engine_version"], status["model"]) == \
        ("crashloop", "sglang", "0.5.10", "Qwen/Qwen3-8B"), status
    assert (status["diagnosis"] or status["last_crash"]["diagnosis"])["signature"] not in (None, "unknown")
    assert_shows_what_status_shows(status, overview)
    assert_shows_what_status_shows(status, page)
    assert (overview["engine"], overview["engine_version"], overview["crash_loop"]) == ("sglang", "0.5.10", True)
