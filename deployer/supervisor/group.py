"""Group fate for one engine across nodes, from the target side: the supervisor of each rank watches its peers
once its engine is ready, and calls the group broken when a peer is gone. Stdlib only, Python >= 3.8.

supervise.json `group` (written by deployer/deployments/nodes/plan.py):
  {"role": "leader", "followers": [{"rank", "addr", "port", "path"}], "every_s", "misses"}
      node 0: every follower's dummy health must answer 200; once one has answered, `misses` failed looks
      in a row mean that rank is gone (issue 14 cites an engine bug #3099: rank 0 kept serving after rank 1 died).
  {"role": "follower", "leader": {"addr", "port"}, "every_s", "misses"}
      rank >= 1: its engine holds a TCP connection to node 0's rendezvous port (torch's TCPStore client) for
      the life of the group; once seen, `misses` looks without it ESTABLISHED mean rank 0 is gone.
The daemon then stops its own engine and treats that as a crash, so the restart policy restarts every rank:
a restarted follower waits at the rendezvous for the restarted rank 0, and the group is always whole again.

Node 0's looks run in a thread of their own (one round over every follower at most every `every_s`): a follower
that does not answer costs its HTTP timeout there, never the daemon's loop, so the hang rule's clock and the
heartbeat go on while a frozen follower is looked at. A rank that stops progressing while the others wait (a
frozen follower holds rank 0 in its per-step collective) is the hang rule's to see on rank 0 (hang):
`silent()` then names the followers whose last look failed, for the hung record (the group restarts as a whole,
as after any end of a rank).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Set, Tuple

ESTABLISHED = "01"
HTTP_TIMEOUT = 2.0


class GroupWatch:
    """One rank's look at its peers; `lost()` says which peer is gone (None while the group is whole)."""

    def __init__(self, cfg: Dict[str, Any]) -> None:
        self.role = str(cfg.get("role"))
        self.every = max(float(cfg.get("every_s") or 2.0), 0.1)
        self.misses = max(int(cfg.get("misses") or 3), 1)
        self.followers: List[Dict[str, Any]] = list(cfg.get("followers") or [])
        self.leader: Dict[str, Any] = dict(cfg.get("leader") or {})
        self.next_look = 0.0
        self.seen: Set[str] = set()
        self.failed: Dict[str, int] = {}
        self.generation = 0                      # a new engine drops the round of looks of the one before
        self._round: Optional[threading.Thread] = None
        self._done: Optional[Tuple[int, List[Tuple[str, bool]]]] = None
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, cfg: Any) -> Optional["GroupWatch"]:
        if not isinstance(cfg, dict) or cfg.get("role") not in ("leader", "follower"):
            return None
        return cls(cfg)

    def reset(self) -> None:
        """A new engine (a restart): nothing seen yet."""
        with self._lock:
            self.generation += 1
            self._done = None
        self.seen.clear()
        self.failed.clear()
        self.next_look = 0.0

    def silent(self) -> List[str]:
        """The peers seen before whose last look failed (node 0: followers that do not answer now)."""
        return sorted(name for name, misses in self.failed.items() if misses > 0 and name in self.seen)

    def lost(self, pgid: Any) -> Optional[str]:
        """The description of a peer that is gone, else None. A follower looks at most every `every_s`; node 0
        judges the last finished round of its looks (run in a thread) and starts the next one when due."""
        now = time.monotonic()
        if self.role == "leader":
            looks = self._leader_round(now)
        elif now < self.next_look:
            return None
        else:
            self.next_look = now + self.every
            where = f"{self.leader.get('addr')}:{self.leader.get('port')}"
            looks = [(f"rank 0 at {where}", _connected(pgid, str(self.leader.get("addr")),
                                                         int(self.leader.get("port") or 0)))]
        for name, ok in looks or []:
            if ok:
                self.seen.add(name)
                self.failed[name] = 0
            elif name in self.seen:
                self.failed[name] = self.failed.get(name, 0) + 1
                if self.failed[name] >= self.misses:
                    how = "stopped answering its health check" if self.role == "leader" else \
                        "is gone (its rendezvous connection closed)"
                    return f"{name} {how}"
        return None

    def _leader_round(self, now: float) -> Optional[List[Tuple[str, bool]]]:
        """The looks of a round finished since the last call (None if none), and the next round started when due
        and none is in flight."""
        with self._lock:
            done, self._done = self._done, None
        if now >= self.next_look and (self._round is None or not self._round.is_alive()):
            self.next_look = now + self.every
            self._round = threading.Thread(target=self._look_all, args=(self.generation,), daemon=True)
            self._round.start()
        return done[1] if done is not None and done[0] == self.generation else None

    def _look_all(self, generation: int) -> None:
        looks = [(f"rank {f.get('rank')} at {f.get('addr')}:{f.get('port')}", _answers(f)) for f in self.followers]
        with self._lock:
            if generation == self.generation:
                self._done = (generation, looks)


def _answers(follower: Dict[str, Any]) -> bool:
    import http.client  # on first use (deployer.supervisor.probe.exchange says why)

    try:
        conn = http.client.HTTPConnection(str(follower.get("addr")), int(follower.get("port") or 0),
                                          timeout=HTTP_TIMEOUT)
        try:
            conn.request("GET", str(follower.get("path") or "/health"))
            return conn.getresponse().status == 200
        finally:
            conn.close()
    except (OSError, http.client.HTTPException, ValueError):
        return False


def _hex_addr(addr: str, port: int) -> Optional[str]:
    """/proc/net/tcp's spelling of an IPv4 address and port (the address as a host-order u32). An IPv6
    rendezvous is not looked for (/proc/net/tcp6): such a follower's watch stays blind, never wrong."""
    try:
        packed = socket.inet_aton(socket.gethostbyname(addr))
    except (OSError, UnicodeError):
        return None
    return "%08X:%04X" % (int.from_bytes(packed, sys.byteorder), port)


def _established_to(remote: str) -> Set[str]:
    inodes: Set[str] = set()
    try:
        with open("/proc/net/tcp", encoding="ascii", errors="replace") as f:
            next(f, None)
            for line in f:
                parts = line.split()
                if len(parts) > 9 and parts[2] == remote and parts[3] == ESTABLISHED:
                    inodes.add(parts[9])
    except OSError:
        pass
    return inodes


def _connected(pgid: Any, addr: str, port: int) -> bool:
    """Whether a process of the engine's group holds an ESTABLISHED connection to addr:port."""
    remote = _hex_addr(addr, port)
    if remote is None or not isinstance(pgid, int):
        return False
    inodes = _established_to(remote)
    if not inodes:
        return False
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in _group_pids(pgid):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return True
            except OSError:
                continue
    return False


def _group_pids(pgid: int) -> List[int]:
    out: List[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.getpgid(int(name)) == pgid:
                out.append(int(name))
        except OSError:
            continue
    return out
