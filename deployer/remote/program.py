"""The target-side programs as the remote seam ships them: the supervisor modules' sources loaded in memory.

`bootstrap(sources)` builds one Python program that holds (module name, source) pairs as the package PACKAGE (the
supervisor's modules import each other relatively; each runs when first imported) and runs one module's
`main(argv)`: sent over stdin (`python3 -B -S - ARGS`: a supervisor command, one helper request on a bare connection), stored on the target as one
file (the helper, conversation.py; it runs itself again for its program ops: the weights' fetch and push) or held
by a deployment (supervise.py and its entry files, push.py). Nothing here runs a command; it only builds bytes.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path

import deployer.supervisor

# Where the target keeps deployer's own files: the helper versions and the interpreter record below.
TARGET_CACHE = '"${XDG_CACHE_HOME:-$HOME/.cache}/deployer"'
# The target's python3 (stdlib only, >= 3.8); images that ship only `python` work too. -B -S: the payload's flags
# (supervisor/base.PYTHON_FLAGS: no bytecode written, no site-packages).
# The interpreter the helper last ran under is recorded (TARGET_CACHE/python, by the helper's loader) and used while
# it exists: `python3` on PATH is often a pyenv shim, a bash script that costs ~50 ms per start, every command.
# The record is believed only when it is the user's own file (-O): nobody else chooses the interpreter.
SUPERVISOR_PYTHON = ('"$({ [ -O ' + TARGET_CACHE + '/python ] && read -r p < ' + TARGET_CACHE + '/python && '
                     '[ -x "$p" ] && echo "$p"; } 2>/dev/null'
                     ' || command -v python3 || command -v python || echo python3)" -B -S')

# The name the payload's modules are loaded under on the target: one package, so that their relative imports
# (`from .base import ...`) find each other as they do in deployer.supervisor here.
PACKAGE = "deployer_supervisor"

# Each module is run when it is first imported (a meta path finder over SOURCES): a helper start runs the modules
# the helper imports, not the program ops' (fetch, push: urllib and http.client, a third of a start) until one runs.
# ENTRY: the module whose main runs, when a file runs this program for another module than its own (ENTRY_FILE).
# CODES (a dict of name -> code object) and SAVE_CODES are given by the helper's loader (remote/conversation.py),
# which keeps the compiled modules beside the cached helper (compiling them costs ~20 ms of every start), loaded only
# when their keyed hash checks out.
_BOOTSTRAP = """import sys, types
from importlib.machinery import ModuleSpec
CODES = globals().get("CODES") or {}
FRESH = {}
PACKAGE = %r
SOURCES = dict(%r)
MAIN = %r
ENTRY = globals().get("ENTRY") or %r
if ENTRY.startswith("supervise_"):  # an entry file an older deployer wrote names its module with the old prefix
    ENTRY = ENTRY[len("supervise_"):]
def _code(name):
    code = CODES.get(name)
    if code is None:
        code = FRESH[name] = compile(SOURCES[name], "<deployer " + name + ".py>", "exec")
    return code
class _Payload:
    def find_spec(self, fullname, path=None, target=None):
        name = fullname[len(PACKAGE) + 1:]
        return ModuleSpec(fullname, self) if fullname.startswith(PACKAGE + ".") and name in SOURCES else None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        exec(_code(module.__name__[len(PACKAGE) + 1:]), module.__dict__)
_package = sys.modules[PACKAGE] = types.ModuleType(PACKAGE)
_package.__path__ = []
sys.meta_path.insert(0, _Payload())
if globals().get("SAVE_CODES") and any(name not in CODES for name in SOURCES):
    for _name in SOURCES:
        _code(_name)
    SAVE_CODES(dict(CODES, **FRESH))
if MAIN is None:
    __import__(PACKAGE + "." + ENTRY)
    _main = sys.modules[PACKAGE + "." + ENTRY]
else:
    _main = sys.modules["deployer_main"] = types.ModuleType("deployer_main")
    exec(compile(MAIN, "<deployer deployer_main.py>", "exec"), _main.__dict__)
sys.exit(_main.main(sys.argv[1:]))
"""

# The programs sent to the target are named by their entry modules; which modules each loads, and in what order, is
# read from the modules' own relative imports (`from .base import ...`), so no list of modules is kept by
# hand: a module imported is a module shipped, after the ones it imports.
SUPERVISOR = "supervise"            # the supervisor's command line: `supervise.py start|stop|status ... RUN`
HELPER = "helper"                   # the helper: every op of its table (protocol.OPS) is shipped with it


def bootstrap(sources: list[tuple[str, str]], main: str | None = None, entry: str | None = None) -> bytes:
    """A program for `python3 -B -S -` that holds (module name, source) pairs as the modules of the package PACKAGE,
    each run when first imported (their relative imports find each other there), and runs the `main` of module `entry` (default: the last), or
    `main`'s: the source of a module outside the package (it imports the package's modules by their full name:
    `PACKAGE.base`)."""
    return (_BOOTSTRAP % (PACKAGE, sources, main, entry or sources[-1][0])).encode()


def supervisor_source(name: str) -> str:
    """The source of one supervisor module (`base`), as this deployer ships it."""
    return (Path(deployer.supervisor.__file__).parent / f"{name}.py").read_text(encoding="utf-8")


# What a deployment holds of the payload: one program, supervise.py (`python3 -B supervise.py start RUN`, every
# module a run dir needs inside it), and entry files that run it with another module's main: the guard that repairs
# a replace whose client was killed (`python3 -B supervise_guard.py arm ...`), in a run dir and at the deployment's
# root, and the lock's lease program at the root (push.py).
ENTRY_FILE = """import os
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervise.py")
with open(path, "rb") as f:
    code = compile(f.read(), path, "exec")
exec(code, {"__name__": "__main__", "ENTRY": %r})
"""
RUN_DIR_ENTRIES = ("guard",)
ROOT_ENTRIES = ("guard", "lease")


def entry_file(module: str) -> str:
    """The name of the file that runs supervise.py with `module`'s main (`guard` -> supervise_guard.py): the names
    deployments on targets have always had, which running guards, @reboot lines and older deployers use."""
    return f"supervise_{module}.py"


def payload_files(entries: tuple[str, ...]) -> dict[str, bytes]:
    """`{"supervise.py": program, "supervise_guard.py": entry}`: the payload's files with the entry files `entries`."""
    return {"supervise.py": program(run_dir_entries()),
            **{entry_file(name): (ENTRY_FILE % name).encode() for name in entries}}


@lru_cache(maxsize=None)
def program(entries: tuple[str, ...], main: str | None = None, entry: str | None = None) -> bytes:
    """The payload modules `entries` need (load_order) as one program (`python3 -B -`); `main`: the source of a last
    module whose `main` runs; else the `main` of module `entry` (default: the first of `entries`)."""
    return bootstrap([(name, supervisor_source(name)) for name in load_order(entries)], main, entry or entries[0])


@lru_cache(maxsize=1)
def helper_bundle() -> tuple[bytes, str]:
    """The helper program (one file) and its content hash: the name it is cached under on a target."""
    payload = program(helper_entries())
    return payload, hashlib.sha256(payload).hexdigest()


def helper_entries() -> tuple[str, ...]:
    """The helper and the modules its table of operations names (it imports those by name, for a program op)."""
    from deployer.supervisor.protocol import OPS

    return (HELPER, *sorted({op.module for op in OPS.values() if op.module}))


def run_dir_entries() -> tuple[str, ...]:
    """What a deployment's supervise.py runs: the supervisor, and the modules its entry files run (the guard, the
    lease)."""
    return (SUPERVISOR, *sorted(set(RUN_DIR_ENTRIES) | set(ROOT_ENTRIES)))


# A relative import of a sibling, at any indent (`from .base import X`, also inside a function). Read as text, not with
# ast: every command that pushes builds the run dir's program, and parsing the package costs ~50 ms of each start.
# (tests/unit/test_payload.py holds the order against every import ast finds, however written.)
_SIBLING = re.compile(r"^[ \t]*from \.(\w+) import ", re.MULTILINE)


@lru_cache(maxsize=None)
def siblings(name: str) -> tuple[str, ...]:
    """The payload modules `name` imports (its relative imports, read from its source), sorted."""
    return tuple(sorted(set(_SIBLING.findall(supervisor_source(name)))))


@lru_cache(maxsize=None)
def load_order(entries: tuple[str, ...]) -> tuple[str, ...]:
    """`entries` and every payload module they import, transitively, each after the ones it imports."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise ValueError(f"the supervisor modules import each other in a cycle through {name}")
        visiting.add(name)
        for sibling in siblings(name):
            visit(sibling)
        visiting.discard(name)
        order.append(name)

    for name in entries:
        visit(name)
    return tuple(order)
