"""Local history: deployments, attempts and events in SQLite under the user data dir (`DEPLOYER_HOME` overrides).

The target stays the source of truth (each run dir holds its profile, state and outcome); this is a cache that
makes `deploy history` fast and keeps what happened on the deployer's side (events, changes made).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployer.secrets import mask_data

SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment TEXT NOT NULL,
    host TEXT NOT NULL,
    up_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    content_hash TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    outcome TEXT,
    diagnosis TEXT,
    change TEXT,
    profile TEXT
);
CREATE INDEX IF NOT EXISTS attempts_by_name ON attempts (deployment, host, started_at);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    attempt_id INTEGER,
    deployment TEXT NOT NULL,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL
);
"""


def home() -> Path:
    env = os.environ.get("DEPLOYER_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("deployer", appauthor=False))


@dataclass(frozen=True)
class AttemptRow:
    deployment: str
    host: str
    up_id: str
    attempt: int
    run_id: str
    content_hash: str
    started_at: float
    ended_at: float | None
    outcome: str | None
    diagnosis: dict[str, Any] | None
    change: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class History:
    """A small SQLite store; every method opens no long transactions, so concurrent CLIs are fine."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or home() / "history.sqlite3"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), timeout=10)
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    def begin_attempt(self, *, deployment: str, host: str, up_id: str, attempt: int, run_id: str,
                      content_hash: str, profile: dict[str, Any]) -> int:
        cur = self._db.execute(
            "INSERT INTO attempts (deployment, host, up_id, attempt, run_id, content_hash, started_at, profile)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (deployment, host, up_id, attempt, run_id, content_hash, time.time(), json.dumps(profile)))
        self._db.commit()
        return int(cur.lastrowid or 0)

    def end_attempt(self, attempt_id: int, *, outcome: str, diagnosis: dict[str, Any] | None,
                    change: dict[str, Any] | None) -> None:
        self._db.execute("UPDATE attempts SET ended_at = ?, outcome = ?, diagnosis = ?, change = ? WHERE id = ?",
                         (time.time(), outcome, _dump(diagnosis), _dump(change), attempt_id))
        self._db.commit()

    def event(self, deployment: str, kind: str, data: dict[str, Any], attempt_id: int | None = None) -> None:
        self._db.execute("INSERT INTO events (attempt_id, deployment, at, kind, data) VALUES (?, ?, ?, ?, ?)",
                         (attempt_id, deployment, time.time(), kind, json.dumps(mask_data(data), default=str)))
        self._db.commit()

    def attempts(self, deployment: str | None, host: str | None = None, limit: int = 200) -> list[AttemptRow]:
        """The attempts of one deployment (None: of every deployment), newest first."""
        query = ("SELECT deployment, host, up_id, attempt, run_id, content_hash, started_at, ended_at, outcome,"
                 " diagnosis, change FROM attempts WHERE (? IS NULL OR deployment = ?)")
        params: list[Any] = [deployment, deployment]
        if host:
            query += " AND host = ?"
            params.append(host)
        query += " ORDER BY started_at DESC, id DESC LIMIT ?"
        params.append(limit)
        rows = self._db.execute(query, params).fetchall()
        return [AttemptRow(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8], _load(row[9]),
                           _load(row[10])) for row in rows]

    def latest(self, deployment: str | None = None, limit: int = 2000) -> list[LatestRow]:
        """The newest attempt of each deployment on each host (`deploy ls`, a NAME without --host), newest first,
        with the target part of the profile it ran (how to reach the host, the workdir)."""
        rows = self._db.execute(
            "SELECT deployment, host, run_id, content_hash, started_at, ended_at, outcome, profile FROM attempts"
            " WHERE (? IS NULL OR deployment = ?) ORDER BY started_at DESC, id DESC LIMIT ?",
            (deployment, deployment, limit)).fetchall()
        out: dict[tuple[str, str, str], LatestRow] = {}
        for row in rows:
            target = (_load(row[7]) or {}).get("target")
            target = dict(target) if isinstance(target, dict) else {}
            key = (row[0], row[1], str(target.get("workdir") or ""))
            if key not in out:
                out[key] = LatestRow(row[0], row[1], row[2], row[3], row[4], row[5], row[6], target)
        return list(out.values())


@dataclass(frozen=True)
class LatestRow:
    """The newest attempt this machine ran of a deployment on a host and workdir."""

    deployment: str
    host: str               # the host as the connection named it (user@host:port)
    run_id: str
    content_hash: str
    started_at: float
    ended_at: float | None
    outcome: str | None
    target: dict[str, Any]  # the profile's target: host as written, user, port, identity_file, known_hosts, workdir


def _dump(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(mask_data(value), default=str)


def _load(text: str | None) -> dict[str, Any] | None:
    return None if text is None else dict(json.loads(text))
