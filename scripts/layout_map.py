"""The module moves of the layout restructures (issues 12, 23 and 38): old dotted module -> new dotted module.

`python scripts/layout_map.py FILE...` rewrites imports of the old flat modules in place (for branches that
were started before the move); `--markdown` prints the table of docs/layout-map.md.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

MOVES: dict[str, str] = {
    "deployer.cli": "deployer.cli.main",
    "deployer.cli_ops": "deployer.cli.targets",
    "deployer.cli_more": "deployer.cli.oncall",
    "deployer.cli_smoke": "deployer.cli.smoke",
    "deployer.output": "deployer.output.console",
    "deployer.junit": "deployer.output.junit",
    "deployer.oncall": "deployer.operate.rollback",
    "deployer.ops": "deployer.operate.deployment",
    "deployer.ops_more": "deployer.operate.history",
    "deployer.pipeline": "deployer.runner.up",
    "deployer.prelaunch": "deployer.runner.before_launch",
    "deployer.fixed": "deployer.profile.fixed",
    "deployer.profile": "deployer.profile.model",
    "deployer.profile_loader": "deployer.profile.loader",
    "deployer.render": "deployer.render.bundle",
    "deployer.preflight": "deployer.preflight.checks",
    "deployer.facts": "deployer.preflight.facts",
    "deployer.flags": "deployer.preflight.flags",
    "deployer.memory": "deployer.engines.sglang.memory",
    "deployer.targetview": "deployer.box.records",
    "deployer.watch": "deployer.watch.watcher",
    "deployer.diagnose": "deployer.diagnose.diagnosis",
    "deployer.drift": "deployer.diagnose.drift",
    "deployer.signatures": "deployer.diagnose.signatures",
    "deployer.state": "deployer.local_history",
    "deployer.remote": "deployer.remote.base",
    "deployer.remote_local": "deployer.remote.local",
    "deployer.remote_ssh": "deployer.remote.ssh.connection",
    "deployer.remote_sshchan": "deployer.remote.ssh.channel",
    "deployer.remote_sshconfig": "deployer.remote.ssh.config",
    "deployer.supervise": "deployer.supervisor.supervise",
    "deployer.supervise_base": "deployer.supervisor.base",
    "deployer.supervise_daemon": "deployer.supervisor.daemon",
    "deployer.supervise_lease": "deployer.supervisor.lease",
    "deployer.engines.sglang": "deployer.engines.sglang.spec",
    "deployer.engines.sglang_probe": "deployer.engines.sglang.probe",
}
# Issue 23: the node group as a package, pipeline/ folded into runner/, the target's steps under target/, remedies
# as a package.
MOVES.update({
    "deployer.fleet.fanout": "deployer.runner.fanout",
    **{f"deployer.fleet.nodes_{x}": f"deployer.nodes.{x}"
       for x in ("checks", "diagnose", "dryrun", "net", "ops", "plan", "render", "up", "watch")},
    "deployer.pipeline.up": "deployer.runner.up",
    "deployer.pipeline.before_launch": "deployer.runner.before_launch",
    "deployer.pipeline.early_push": "deployer.runner.early_push",
    "deployer.push": "deployer.box.push",
    "deployer.start": "deployer.box.process",
    "deployer.lock": "deployer.box.lock",
    "deployer.remedy": "deployer.remedy.propose",
    "deployer.effective": "deployer.remedy.effective",
})
# Issue 38: the supervisor's modules without their `supervise_` prefix (a deployment's entry files keep their names on
# the target: supervise_guard.py, supervise_lease.py), target/ (what deployer does on one GPU box) named box/, and
# oncall/ (it named a person) operate/. (The flat `deployer.oncall` of before issue 12 is rollback's, above.)
_SUPERVISOR = ("base", "daemon", "fetch", "files", "group", "guard", "hang", "helper", "install", "lease", "ports", "probe",
               "protocol", "push", "replicas", "snapshot", "stacks")
MOVES.update({f"deployer.supervisor.supervise_{x}": f"deployer.supervisor.{x}" for x in _SUPERVISOR})
MOVES.update({f"deployer.target.{x}": f"deployer.box.{x}"
              for x in ("lock", "process", "push", "pushweights", "records", "retention", "session", "snapshot",
                        "supervised", "switch", "tokenprobe", "weights")})
MOVES.update({f"deployer.oncall.{x}": f"deployer.operate.{x}"
              for x in ("deployment", "history", "known", "logwindow", "remembered", "rollback", "rows",
                        "secret_restore", "serving", "upgrade")})
# Issue 38: each kind of deployment in its own package under deployments/ (its Deployment class in `deployment`).
_FLEET = ("canary", "canary_batch", "canary_judge", "canary_metrics", "canary_record", "links", "members", "oncall",
          "record", "report", "rolling", "router", "router_env", "router_key", "router_pending", "router_replace",
          "smoke", "up", "upgrade", "weights")
_NODES = ("checks", "diagnose", "dryrun", "net", "ops", "plan", "render", "up", "watch")
MOVES.update({f"deployer.fleet.{x}": f"deployer.deployments.fleet.{x}" for x in _FLEET})
MOVES.update({f"deployer.nodes.{x}": f"deployer.deployments.nodes.{x}" for x in _NODES})
MOVES.update({f"deployer.deployments.{x}": f"deployer.deployments.{x}.deployment" for x in ("single", "fleet", "nodes")})
# Issue 38: what this machine knows in one package (deployer.local), and the host names and TargetSpec in a leaf
# (deployer.host) that the profile, deployer.local and the remote seam all sit above.
MOVES.update({
    "deployer.local_history": "deployer.local.history",
    "deployer.settings": "deployer.local.settings",
    "deployer.operate.remembered": "deployer.local.remembered",
    "deployer.operate.known": "deployer.local.lookup",
    "deployer.profile.host": "deployer.host",
})
# Names that later commits moved to another module: (module after the pure moves, name) -> new module.
SYMBOLS: dict[tuple[str, str], str] = {
    ("deployer.profile.model", "load_profile"): "deployer.profile.loader",
    ("deployer.remote.base", "parse_host"): "deployer.host",
    ("deployer.remote.base", "connect"): "deployer.remote.connect",
    ("deployer.preflight.flags", "load_renames"): "deployer.engines.renames",
    ("deployer.preflight.flags", "Rename"): "deployer.engines.renames",
    ("deployer.preflight.flags", "option_key"): "deployer.flag_names",
    ("deployer.preflight.flags", "key_option"): "deployer.flag_names",
    ("deployer.preflight.flags", "at_least"): "deployer.versions",
    ("deployer.diagnose.signatures", "version_in"): "deployer.versions",
    ("deployer.diagnose.diagnosis", "version_in"): "deployer.versions",
    ("deployer.operate.rollback", "MASK"): "deployer.profile.model",
    ("deployer.box.records", "LIVE"): "deployer.supervisor.base",
    ("deployer.cli.main", "_load"): "deployer.cli.options",
    ("deployer.cli.main", "_emit_json"): "deployer.cli.options",
    ("deployer.cli.main", "_profile_options"): "deployer.cli.options",
    ("deployer.cli.main", "_target_options"): "deployer.cli.options",
    ("deployer.box.process", "DeploymentLock"): "deployer.box.lock",
    ("deployer.deployments.nodes.plan", "host_port"): "deployer.host",
    ("deployer.export.prometheus", "fleet_targets"): "deployer.deployments.fleet.scrape",
    ("deployer.export.prometheus", "node_targets"): "deployer.deployments.nodes.scrape",
    ("deployer.remote.base", "TargetSpec"): "deployer.host",
    ("deployer.remote.base", "LOCAL"): "deployer.host",
    # issue 38: the read commands' reports render themselves (lines()); their text moved beside them
    ("deployer.output.text", "describe_crash"): "deployer.deployments.status_text",
    ("deployer.output.text", "unhealthy_text"): "deployer.deployments.status_text",
    ("deployer.output.text", "timeline_text"): "deployer.deployments.history_text",
    ("deployer.output.text", "run_lines"): "deployer.deployments.history_text",
    ("deployer.output.text", "change_lines"): "deployer.deployments.history_text",
    ("deployer.output.serving", "serving_lines"): "deployer.deployments.status_text",
}
FILES: dict[str, str] = {
    "templates/sglang.sh.j2": "deployer/engines/sglang/launch.sh.j2",
    "deployer/render/templates/sglang.sh.j2": "deployer/engines/sglang/launch.sh.j2",
    "deployer/render/templates/vllm.sh.j2": "deployer/engines/vllm/launch.sh.j2",
    "deployer/engines/sglang_renames.yaml": "deployer/engines/sglang/renames.yaml",
    "deployer/engines/sglang_signatures.yaml": "deployer/engines/sglang/signatures.yaml",
}

_FROM_DOTTED = re.compile(r"^(\s*from\s+)(deployer(?:\.\w+)+)(\s+import\s+\(?\s*(\w+))", re.MULTILINE)
_IMPORT_DOTTED = re.compile(r"^(\s*import\s+)(deployer(?:\.\w+)+)\b", re.MULTILINE)
_FROM_PACKAGE = re.compile(r"^(\s*)from deployer(\.engines)? import ([\w, ]+)$", re.MULTILINE)


ROOT = Path(__file__).resolve().parent.parent


def _new(old: str) -> str:
    """Where a module is now: the moves followed one after another (a module moved by issue 23, then by 38)."""
    for _ in range(len(MOVES)):
        if old not in MOVES:
            break
        old = MOVES[old]
    return old


def _is_module(dotted: str) -> bool:
    """A module or package of this tree now (`deployer.deployments.fleet` was a module, is now a package)."""
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _from_package(found: re.Match[str]) -> str:
    indent, sub = found.group(1), found.group(2) or ""
    lines = []
    for item in (part.strip() for part in found.group(3).split(",")):
        name, _, alias = item.partition(" as ")
        old = f"deployer{sub}.{name.strip()}"
        local = alias.strip() or name.strip()
        if old not in MOVES:
            lines.append(f"{indent}from deployer{sub} import {item}")
            continue
        parent, _, leaf = _new(old).rpartition(".")
        lines.append(f"{indent}from {parent} import {leaf}" + ("" if leaf == local else f" as {local}"))
    return "\n".join(lines)


_NEW_MODULES = set(MOVES.values())


def _from_dotted(found: re.Match[str]) -> str:
    module, first = found.group(2), found.group(4)
    if f"{module}.{first}" in _NEW_MODULES:  # already the new form: `from deployer.output import junit`
        return found.group(0)
    if f"{module}.{first}" in MOVES:  # a moved module imported from its package: `from deployer.oncall import rows`
        parent, _, leaf = _new(f"{module}.{first}").rpartition(".")
        aliased = found.string[found.end():].lstrip(" ").startswith("as ")
        return f"{found.group(1)}{parent} import {leaf}" + ("" if leaf == first or aliased else f" as {first}")
    if _is_module(f"{module}.{first}"):  # a module of a package that was a module before: `fleet import scrape`
        return found.group(0)
    return found.group(1) + _new(module) + found.group(3)


_ONE_LINE_FROM = re.compile(r"^(\s*)from\s+(deployer(?:\.\w+)+)\s+import\s+([\w, ]+)$", re.MULTILINE)


def _split_moved(found: re.Match[str]) -> str:
    """`from M import a, b` where b moved to N -> `from M import a` + `from N import b` (one-line imports)."""
    indent, module = found.group(1), found.group(2)
    names = [n.strip() for n in found.group(3).split(",") if n.strip()]
    by_module: dict[str, list[str]] = {}
    for item in names:
        target = SYMBOLS.get((module, item.split(" as ")[0].strip()), module)
        by_module.setdefault(target, []).append(item)
    if list(by_module) == [module]:
        return found.group(0)
    return "\n".join(f"{indent}from {m} import {', '.join(items)}" for m, items in by_module.items())


def rewrite(text: str) -> str:
    text = _FROM_DOTTED.sub(_from_dotted, text)
    text = _ONE_LINE_FROM.sub(_split_moved, text)
    text = _IMPORT_DOTTED.sub(lambda m: m.group(1) + _new(m.group(2)), text)
    return _FROM_PACKAGE.sub(_from_package, text)


def markdown() -> str:
    rows = [f"| `{old}` | `{new}` |" for old, new in MOVES.items()]
    rows += [f"| `{old}` | `{new}` |" for old, new in FILES.items()]
    rows += [f"| `{old}.{name}` | `{new}.{name}` |" for (old, name), new in SYMBOLS.items()]
    return "| old | new |\n|---|---|\n" + "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--markdown"]:
        sys.stdout.write(markdown())
        return 0
    for name in argv:
        path = Path(name)
        text = path.read_text(encoding="utf-8")
        new = rewrite(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"rewrote {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
