"""The fleet router's control key, and smg's secrets handed to it from its environment, never from its argv.

smg (1.13.0, checked against the real binary) guards its worker API (`GET/POST /workers`, `GET/PUT/PATCH/DELETE
/workers/{id}`) and its admin routes (`/flush_cache`, `/v1/tokenizers`, `/wasm`, ...) with `--control-plane-api-keys
id:name:role:key` when one is given: then only an `admin` key opens them (HTTP 401 without it, also for the
clients' `--api-key`); `/readiness`, `/health` and the serving routes are not guarded by it. Without control-plane
keys the worker API takes the shared `--api-key` (the one every client holds, and that smg sends to the workers),
and without that it is open to anyone who reaches the port: another local user could register a server of its own
as a worker and receive prompts.

So every router deployer starts has a control key of its own: 32 random bytes, created when the router is first
started (or replaced from a release that had none), kept in the router run's 0600 env file and read back from there
(`keyed`) by `up`, `restart`, `rollback` and `status`; a running router keeps its key (its settings hash covers it).

smg reads its credentials only from its argv, which every local user can read (`/proc/PID/cmdline`, until smg
renames its process). launch.sh therefore starts smg through `SHIM`, a few lines of Python given to `python -c`:
they append the secret flags to smg's own argument list in memory, from the process's environment (readable only by
its user), and call smg's `main`; the process's argv holds no secret.
"""

from __future__ import annotations

import json
import posixpath
import secrets
from dataclasses import replace

from deployer.deployments.fleet.members import Fleet, RouterMember
from deployer.operate.secret_restore import read_env_file
from deployer.remote.base import Remote
from deployer.secrets import secret_var
from deployer.supervisor.protocol import ENV_FILE
from deployer.box.push import Layout, expand_workdir
from deployer.box.records import RunView, current_view

CONTROL_KEY_VAR = secret_var("router_control_key")
SECRET_ARGS_VAR = "DEPLOYER_SMG_SECRET_ARGS"   # JSON: [[flag, env var, is a list], ...]; names only, no value
KEY_ID = "deployer"                            # the id and name of deployer's entry in smg's key list
# The program `python -c` runs in launch.sh (no secret in it): smg's argv plus the secret flags from the env.
SHIM = ("import json, os, sys; from smg.cli import main; argv = sys.argv[1:]; "
        "[argv.extend([flag, *json.loads(os.environ[var])] if many else [flag + \"=\" + os.environ[var]]) "
        f"for flag, var, many in json.loads(os.environ.get(\"{SECRET_ARGS_VAR}\") or \"[]\")]; main(argv)")


def new_control_key() -> str:
    return secrets.token_hex(32)


def control_entry(key: str) -> str:
    """deployer's entry in `--control-plane-api-keys`: an admin key (smg: `id:name:role:key`)."""
    return f"{KEY_ID}:{KEY_ID}:admin:{key}"


def router_layout(remote: Remote, member: RouterMember) -> Layout:
    return Layout(posixpath.join(expand_workdir(remote, member.target.workdir), member.name))


def running_key(remote: Remote, layout: Layout) -> str | None:
    """The control key of the router's current run (its env file); None without a run or a key (a router an earlier
    release started, which has none)."""
    view = current_view(remote, layout)
    return None if view is None else key_of(remote, view)


def key_of(remote: Remote, view: RunView) -> str | None:
    """The control key in the env file of the router run `view`; None when it has none."""
    env = read_env_file(remote, view.run.file(ENV_FILE))
    return (env or {}).get(CONTROL_KEY_VAR) or None


def with_key(member: RouterMember, key: str | None) -> RouterMember:
    return member if key is None else replace(member, control_key=key)


def keyed(remote: Remote, member: RouterMember) -> RouterMember:
    """The router member with the control key its running router holds (unchanged when it has none)."""
    return with_key(member, running_key(remote, router_layout(remote, member)))


def keyed_fleet(fleet: Fleet, remote: Remote | None) -> Fleet:
    """The fleet whose router member carries its running router's control key (`remote`: the router's host)."""
    if fleet.router is None or remote is None:
        return fleet
    return replace(fleet, router=keyed(remote, fleet.router))


def with_new_key(member: RouterMember) -> RouterMember:
    """The member as a router is started: its running key kept, else a new one."""
    return member if member.control_key else replace(member, control_key=new_control_key())


def secret_args(flags: list[tuple[str, str, bool]]) -> dict[str, str]:
    """The env entry that tells SHIM which flags to take from which variables."""
    return {SECRET_ARGS_VAR: json.dumps([list(f) for f in flags])} if flags else {}
