"""`connect(spec)`: the one place that picks the Remote for a target (LocalRemote for `host: local`, else SSH)."""

from __future__ import annotations

from deployer.remote.base import LOCAL, Remote, TargetSpec
from deployer.remote.local import LocalRemote
from deployer.remote.ssh.connection import SSHRemote


def connect(spec: TargetSpec) -> Remote:
    """`host: local` -> LocalRemote; anything else -> SSHRemote, connected now (errors surface here)."""
    if spec.host == LOCAL:
        return LocalRemote()
    remote = SSHRemote(spec)
    remote.open()
    return remote
