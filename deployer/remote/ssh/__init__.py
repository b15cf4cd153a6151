"""`SSHRemote`: the Remote protocol over one SSH connection per host (connection), its exec-channel plumbing
(channel) and what it needs before it dials (config: ~/.ssh/config, known_hosts).

May import remote.base and the leaves.

Importing this package defers `invoke` (see `_Deferred`): paramiko's config module imports it at once, but uses it
only to run a `Match exec` line of an ssh_config; loading it cost ~40 ms of every command that dials.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any


class _Deferred(types.ModuleType):
    """Stands in for the `invoke` package until something asks it for a name, then loads the real one (which
    replaces this in sys.modules) and answers from it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), name)


def _defer(name: str) -> None:
    if name in sys.modules or importlib.util.find_spec(name) is None:
        return  # loaded already, or not installed (paramiko then refuses `Match exec` in one line itself)
    sys.modules[name] = _Deferred(name)


_defer("invoke")
