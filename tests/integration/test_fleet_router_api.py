"""The fleet router's worker API against the real router (smg) over real sshd hosts (issue 34 finding 2: another
local user registered a server of its own as a worker and got one prompt in three; with a key set, it read the key
from the router's command line).

Another process without the router's control key is refused (HTTP 401, also with the clients' key), and no prompt
reaches its server; the key is in no launch.sh nor argv. A worker planted by a holder of the key (simulated here
with the key read from the router's env file) is named by `deploy status`, which exits 6, until `up` removes it."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_helpers import fleet_deploy, fleet_profile, get_json, router_key
from hostbed import HostBed, host_bed
from sshbed import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
CLIENT_KEY = "sk-router-api-7171"


@pytest.fixture()
def bed(tmp_path: Path) -> Iterator[HostBed]:
    with host_bed(tmp_path / "hosts", 2) as hosts:
        yield hosts


class ForeignWorker(BaseHTTPRequestHandler):
    """Stand-in for another user's server posing as an engine: answers what smg asks at registration, and records
    every request it is sent."""

    seen: list[str] = []

    def log_message(self, *_args: Any) -> None:
        pass

    def _answer(self, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.seen.append(f"GET {self.path}")
        if self.path.startswith("/v1/models"):
            self._answer({"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model"}]})
        else:
            self._answer({})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.seen.append(f"POST {self.path}")
        self._answer({"id": "stolen", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "stolen"}, "finish_reason": "stop"}]})


@pytest.fixture()
def foreign(bed: HostBed) -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    handler = type("Recorder", (ForeignWorker,), {"seen": seen})
    addr = bed.hosts[0].addr
    server = ThreadingHTTPServer((addr, free_port(addr)), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{addr}:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def call(url: str, method: str = "GET", body: Any = None, key: str | None = None) -> tuple[int, Any]:
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers, method=method),
                                    timeout=10) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None


def chat(front: str) -> int:
    body = {"model": "Qwen/Qwen3-8B", "max_tokens": 4, "messages": [{"role": "user", "content": "secret prompt"}]}
    return call(f"{front}/v1/chat/completions", "POST", body, key=CLIENT_KEY)[0]


@pytest.mark.slow("a fleet (two replicas and the real router) up twice, requests through it, four statuses and a down")
def test_the_router_refuses_a_foreign_worker_and_status_names_a_planted_one(
        tmp_path: Path, bed: HostBed, foreign: tuple[str, list[str]]) -> None:
    home = tmp_path / "home"
    prof, data = fleet_profile(tmp_path, bed, name="api")
    data["engine"]["args"] = {"api_key": "${FLEET_TEST_KEY}"}   # the clients' key (smg's --api-key)
    prof.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {"FLEET_TEST_KEY": CLIENT_KEY}
    up = fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home, env=env)
    assert up.returncode == 0, up.stderr[-3000:]
    front = f"http://{bed.hosts[0].addr}:{data['router']['port']}"
    foreign_url, seen = foreign
    run = bed.hosts[0].workdir / "api-router" / "current"
    key = router_key(bed.hosts[0].workdir, "api-router")
    # the keys: in the 0600 env file only; launch.sh names none of them, not even by reference
    assert stat.S_IMODE(os.stat(run / "env").st_mode) == 0o600 and key in (run / "env").read_text()
    script = (run / "launch.sh").read_text()
    assert key not in script and CLIENT_KEY not in script and "DEPLOYER_SECRET" not in script

    # another process without the control key: refused, with no key and with the clients' key alike
    for who in (None, CLIENT_KEY):
        assert call(f"{front}/workers", "POST", {"url": foreign_url}, key=who)[0] == 401
        assert call(f"{front}/workers", key=who)[0] == 401
    replicas = {str(w["url"]): str(w["id"]) for w in get_json(f"{front}/workers", key=key)[1]["workers"]}
    assert len(replicas) == 2 and foreign_url not in replicas
    # the replicas `up` put in the router: the only workers its supervisor's watch judges (replicas)
    assert json.loads((run.parent / "replicas.json").read_text())["urls"] == sorted(replicas)
    assert call(f"{front}/workers/{next(iter(replicas.values()))}", "DELETE", key=CLIENT_KEY)[0] == 401
    assert [chat(front) for _ in range(6)] == [200] * 6
    assert not seen, seen                                  # no prompt (nothing at all) reached it
    ok = fleet_deploy(bed, "status", str(prof), "--json", home=home, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr

    # planted by a holder of the key: the router lists it; status names it and exits 6
    assert call(f"{front}/workers", "POST", {"url": foreign_url}, key=key)[0] in (200, 201, 202)
    end = time.monotonic() + 30
    while foreign_url not in {str(w["url"]) for w in get_json(f"{front}/workers", key=key)[1]["workers"]}:
        assert time.monotonic() < end, "the router never listed the planted worker"
        time.sleep(0.5)
    st = fleet_deploy(bed, "status", str(prof), "--json", home=home, env=env)
    assert st.returncode == 6, st.stdout + st.stderr
    row = json.loads(st.stdout)
    assert row["router"]["foreign_workers"] == [foreign_url]
    assert [r["router_health"] for r in row["replicas"]] == ["healthy", "healthy"]
    text = fleet_deploy(bed, "status", str(prof), home=home, env=env)
    assert text.returncode == 6 and f"ALARM: the router routes to {foreign_url}" in text.stdout, text.stdout
    # `up` brings the router to exactly the fleet's replicas again
    again = fleet_deploy(bed, "up", str(prof), "--skip-preflight", home=home, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert set(str(w["url"]) for w in get_json(f"{front}/workers", key=key)[1]["workers"]) == set(replicas)
    assert fleet_deploy(bed, "status", str(prof), home=home, env=env).returncode == 0
    down = fleet_deploy(bed, "down", str(prof), home=home, env=env)
    assert down.returncode == 0, down.stderr
