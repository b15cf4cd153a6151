"""The one payload the remote seam ships to a target: every supervisor module's source in one program, named by its
sha256 (`payload_bundle()`).

`bootstrap(sources)` builds one Python program that holds (module name, source) pairs as the package PACKAGE (the
supervisor's modules import each other relatively; each runs when first imported) and runs one module's
`main(argv)`: the helper's unless its runner names another (ENTRY). The same bytes are cached by the helper's loader
(`helper-<sha256>.py`, conversation.py; the helper runs itself again for its program ops: the weights' fetch and
push), held once by each deployment (`payload/<sha256>.py`, run by the entry files that name its hash: supervise.py,
supervise_guard.py, supervise_lease.py) and sent over stdin on a bare connection (`python3 -B -S - supervise ARGS`,
`- request JSON`: oneshot.py). Nothing here runs a command; it only builds bytes.
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
# ENTRY: the module whose main runs, when a file runs this program for another module than its default (ENTRY_FILE).
# CODES (a dict of name -> code object) and SAVE_CODES are given by the helper's loader (remote/conversation.py),
# which keeps the compiled modules beside the cached helper (compiling them costs ~20 ms of every start), loaded only
# when their keyed hash checks out.
_BOOTSTRAP = """import sys, types
from importlib.machinery import ModuleSpec
CODES = globals().get("CODES") or {}
FRESH = {}
PACKAGE = %r
SOURCES = dict(%r)
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
__import__(PACKAGE + "." + ENTRY)
sys.exit(sys.modules[PACKAGE + "." + ENTRY].main(sys.argv[1:]))
"""

# The programs sent to the target are named by their entry modules; which modules each loads, and in what order, is
# read from the modules' own relative imports (`from .base import ...`), so no list of modules is kept by
# hand: a module imported is a module shipped, after the ones it imports.
SUPERVISOR = "supervise"            # the supervisor's command line: `supervise.py start|stop|status ... RUN`
HELPER = "helper"                   # the helper: every op of its table (protocol.OPS) is shipped with it


def bootstrap(sources: list[tuple[str, str]], entry: str | None = None) -> bytes:
    """A program for `python3 -B -S -` that holds (module name, source) pairs as the modules of the package PACKAGE,
    each run when first imported (their relative imports find each other there), and runs the `main` of module
    `entry` (default: the last) unless its runner gives ENTRY."""
    return (_BOOTSTRAP % (PACKAGE, sources, entry or sources[-1][0])).encode()


def supervisor_source(name: str) -> str:
    """The source of one supervisor module (`base`), as this deployer ships it."""
    return (Path(deployer.supervisor.__file__).parent / f"{name}.py").read_text(encoding="utf-8")


# What a deployment holds of the payload (deployer/box/push.py): the payload itself once, named by its hash
# (`<deployment>/payload/<sha256>.py`), and small entry files that name that hash and run one module's main from it:
# supervise.py (`python3 -B supervise.py start RUN`), the guard that repairs a replace whose client was killed
# (`supervise_guard.py arm ...`), in a run dir and at the deployment's root, and the lock's lease at the root. An entry
# opens the payload without following a link, reads it only when it is a regular file of this user's own, not
# writable by others and of the size it names (at most that much), runs it only when its sha256 is the one it
# names; else it says so in one line and runs nothing. It finds the deployment from its own
# real path (a run dir is two levels below it); an ENTRY given by whoever runs it (an older deployer's entry file)
# wins. Retention (box/retention.py) keeps every payload a kept run dir or the root names.
PAYLOAD_DIR = "payload"
ENTRY_FILE = '''"""deployer: runs the supervisor payload this file names by its sha256, after checking it."""
import os, sys
try:  # the builtin sha256: hashlib would load OpenSSL, ~4 MB of every supervisor's memory for one hash
    from _sha256 import sha256
except ImportError:
    try:
        from _sha2 import sha256
    except ImportError:
        from hashlib import sha256
PAYLOAD, SIZE = %r, %d
ENTRY = globals().get("ENTRY") or %r
here = os.path.dirname(os.path.realpath(globals().get("__file__") or sys.argv[0]))
path = os.path.join(%s, "payload", PAYLOAD + ".py")
try:
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
        st = os.fstat(f.fileno())
        ours = st.st_mode & 0o170000 == 0o100000 and st.st_uid == os.geteuid() and not st.st_mode & 0o022
        src = f.read(SIZE + 1) if ours and st.st_size == SIZE else b""
except OSError as e:
    sys.exit("deployer: cannot read the supervisor payload %%s: %%s" %% (path, e.strerror or e))
if sha256(src).hexdigest() != PAYLOAD:
    sys.exit("deployer: %%s is not this user's own or not the payload named here: nothing run" %% path)
exec(compile(src, path, "exec"), {"__name__": "__main__", "ENTRY": ENTRY})
'''
RUN_DIR_ENTRIES = (SUPERVISOR, "guard")
ROOT_ENTRIES = (SUPERVISOR, "guard", "lease")


def entry_file(module: str) -> str:
    """The name of the file that runs `module`'s main (`guard` -> supervise_guard.py, `supervise` -> supervise.py):
    the names deployments on targets have always had, which running guards, @reboot lines and older deployers use."""
    return "supervise.py" if module == SUPERVISOR else f"supervise_{module}.py"


def payload_files(entries: tuple[str, ...], in_run_dir: bool) -> dict[str, bytes]:
    """`{"supervise.py": entry, "supervise_guard.py": entry}`: the entry files `entries`, each naming this deployer's
    payload; `in_run_dir`: they live in a run dir (the payload is two levels up), else at the deployment's root."""
    data, digest = payload_bundle()
    root = "os.path.dirname(os.path.dirname(here))" if in_run_dir else "here"
    return {entry_file(name): (ENTRY_FILE % (digest, len(data), name, root)).encode() for name in entries}


def payload_name() -> str:
    """The payload's path below a deployment's root: `payload/<sha256>.py`."""
    return f"{PAYLOAD_DIR}/{payload_bundle()[1]}.py"


@lru_cache(maxsize=1)
def payload_bundle() -> tuple[bytes, str]:
    """The one payload (every supervisor module; the helper's main unless an entry names another) and its sha256:
    what the helper's loader caches and runs, what a deployment holds under payload/, what a bare connection sends."""
    data = program(payload_entries())
    return data, hashlib.sha256(data).hexdigest()


def payload_entries() -> tuple[str, ...]:
    """The helper (the payload's default main), the modules the entry files run, and the modules the helper's table
    of operations names (it imports those by name, for a program op)."""
    from deployer.supervisor.protocol import OPS

    ops = sorted({op.module for op in OPS.values() if op.module} - set(ROOT_ENTRIES) - {HELPER})
    return (HELPER, *ROOT_ENTRIES, *ops)


@lru_cache(maxsize=None)
def program(entries: tuple[str, ...]) -> bytes:
    """The payload modules `entries` need (load_order) as one program (`python3 -B -S -`) that runs the `main` of
    the first of `entries` unless its runner names another (ENTRY)."""
    return bootstrap([(name, supervisor_source(name)) for name in load_order(entries)], entries[0])


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
