"""The fleet's record on its router's host: `<workdir>/<fleet name>/fleet.json`, the fleet profile (secrets masked).

It lets on-call commands find a whole fleet from its name and one host (`deploy status NAME --host H`), the way a
single deployment is found, from a laptop that never had the profile. Only what reading needs is kept: members,
targets, ports, addresses; never a secret value (a masked profile cannot start anything).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from deployer.errors import DeployError, NotFound, ProfileError
from deployer.box.push import expand_workdir, make_owned_dirs
from deployer.remote.base import Remote
from deployer.host import TargetSpec
from deployer.remote.connect import conversing

if TYPE_CHECKING:
    from deployer.profile.model import Profile

RECORD = "fleet.json"


def record_path(workdir: str, name: str) -> str:
    return f"{workdir.rstrip('/')}/{name}/{RECORD}"


def write_record(remote: Remote, workdir: str, profile: Profile) -> None:
    data = profile.public_dict()
    data.pop("target", None)        # derived from the first replica; `target:` is not allowed beside replicas
    for section in (data.get("engine"), data.get("router")):
        if section and section.get("install") is not None:
            section.pop("python", None)   # the default beside `install` would not read back (they exclude each other)
    if data.get("router"):
        data["router"]["args"] = {k: ("***" if _secret_path(profile, f"router.args.{k}") else v)
                                  for k, v in (data["router"].get("args") or {}).items()}
    path = record_path(expand_workdir(remote, workdir), profile.name)
    folder = path.rsplit('/', 1)[0]
    make_owned_dirs(remote, folder, folder)
    remote.put(json.dumps({"kind": "replicas", "profile": data}, indent=1).encode(), path, 0o644)


def _secret_path(profile: Profile, path: str) -> bool:
    return any(p == path or p.startswith(path + ".") for p in profile.templates) or \
        path.rsplit(".", 1)[-1] in ("api_key", "control_plane_api_keys", "jwt_secret")


def read_record(remote: Remote, workdir: str, name: str) -> Profile | None:
    """The fleet named `name` under `workdir` on this host, or None when there is no such fleet record."""
    try:
        raw = remote.read(record_path(expand_workdir(remote, workdir), name), 0, 1 << 20)
    except NotFound:
        return None
    from deployer.profile.model import Profile   # here: `status NAME` asks every absent name (~0.1 s of its start)

    try:
        data: Any = json.loads(raw)
        return Profile.model_validate(data["profile"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ProfileError(f"the fleet record {record_path(workdir, name)} on {remote.label} is damaged: "
                           f"{str(exc).splitlines()[0][:200]}") from None


def try_write_record(remote: Remote, workdir: str, profile: Profile) -> str | None:
    """write_record, a failure turned into a warning text (the record must never fail the deployment)."""
    try:
        write_record(remote, workdir, profile)
    except DeployError as exc:
        return f"the fleet record was not written: {exc.message}"
    return None


def find_fleet(spec: TargetSpec, workdir: str, name: str) -> Profile | None:
    """The fleet record of `name` on the host `spec` (one connection), or None."""
    with conversing(spec) as remote:
        return read_record(remote, workdir, name)
