"""Command line: argv -> one Deployment call (deployer.deployments) -> output and exit codes. No deployment logic
lives here, and no choice between kinds of deployment.

The group is lazy: a command's module is imported only when that command runs, so `deploy --help` stays fast
while every command module imports at its top. `COMMANDS` names each command's module and its one-line help
(tests/unit/test_cli_lazy.py keeps those lines equal to the commands' own docstrings).
Exit codes: 0 ok, 1 other error, 2 bad profile or usage, 3 connection/SSH, 4 target unfit (locked, port busy,
preflight), 5 launch failed, 6 unhealthy, 7 not found, 8 stopped (status), 9 a fleet partly failed, 130 interrupted. With `--json`, a failure also ends stdout
with one `{"event": "error", "code": N, "message": ...}` line.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading

import click

from deployer.cli.options import fill_help, with_examples
from deployer.cli.sections import SectionedGroup
from deployer import interrupts
from deployer.errors import DeployError
from deployer.output.edge import guard_printable
from deployer.secrets import guard_std_streams

# command -> (module under deployer.cli, the first paragraph of its help)
COMMANDS: dict[str, tuple[str, str]] = {
    "dashboard": ("dashboard", "A local web page of every deployment, fleet member and node named: state, serving, "
                               "attempts, log."),
    "diagnose": ("oncall", "The first traceback and diagnosis of a log file, or of a deployment's latest failed "
                            "attempt."),
    "config": ("local", "The effective default host, workdir and engine python, and where each came from."),
    "down": ("targets", "Stop a deployment gracefully (idempotent: 'not running' is success)."),
    "export": ("export", "Write a profile for another platform (Kubernetes) or monitoring system (Prometheus)."),
    "history": ("oncall", "Every attempt of a deployment: when, content hash, outcome, diagnosis, change made."),
    "ls": ("local", "The deployments this machine knows (its local history), across hosts: host, workdir, last "
                    "version, state."),
    "logs": ("targets", "Print the engine log of the current (or previous) attempt (a fleet: of --replica N, "
                        "--host H or --router; a multi-node profile: of --node N)."),
    "plan": ("runs", "Preflight without launching: GPUs, engine version, flags, effective args, memory plan."),
    "prepare": ("prepare", "Get every host ready without launching: compatibility checks, then the engine's "
                           "environment (engine.install) built or reused."),
    "prune": ("oncall", "Delete old run dirs beyond the newest N and the env files (secrets) of runs no restart "
                        "or rollback needs."),
    "render": ("profiles", "Print the launch script a profile renders to (secrets never shown)."),
    "restart": ("runs", "Graceful stop and start of the last good version, with the same watch and healing as "
                          "`up`."),
    "rollback": ("runs", "Back to the newest other version that reached ready (read from the target's history; "
                           "a multi-node profile: the newest other version every node ran and that reached ready)."),
    "schema": ("profiles", "Print the profile JSON Schema (for editors)."),
    "smoke": ("smoke", "Deploy, send one real chat completion through the tunnel, stop: a CI check of a whole "
                       "deployment."),
    "status": ("status", "State, pid, uptime, health, attempt, content hash and run dir; every deployment with "
                          "only --host."),
    "top": ("top", "A live view of deployments, like htop: per replica or node its state, requests, tokens/s, KV "
                   "cache, p99 latency and restarts (q or Ctrl-C quits); --once --json for scripts."),
    "up": ("runs", "Render, push, start and watch a deployment; heal known failures and retry."),
    "upgrade": ("upgrade", "Move a profile to another release of its engine: flags renamed or dropped, values it "
                           "resolves differently, new follow-on checks and the memory plan on both, each with its "
                           "source; nothing stops."),
    "validate": ("profiles", "Check a profile; exit 0 when good, 2 listing every problem when not (secrets need "
                             "not be set)."),
}
# command (a group's: "export k8s") -> example lines its --help ends with
EXAMPLES: dict[str, list[str]] = {
    "config": ["deploy config", "deploy config profiles/qwen36-mtp.yaml --json"],
    "ls": ["deploy ls", "deploy ls --live --json"],
    "dashboard": ["deploy dashboard profiles/qwen36-mtp.yaml",
                  "deploy dashboard qwen36-mtp --host root@gpu-box chat --host root@gpu-2 --port 8765",
                  "deploy dashboard --host root@gpu-box"],
    "prepare": ["deploy prepare profiles/qwen36-mtp.yaml --host root@gpu-box",
                "deploy prepare profiles/qwen3-8b-fleet.yaml --json"],
    "top": ["deploy top profiles/qwen3-8b-fleet.yaml", "deploy top qwen36-mtp --host root@gpu-box --once --json"],
    "diagnose": ["deploy diagnose qwen36-mtp --host root@gpu-box",
                 "deploy diagnose --log engine.log --engine-version 0.5.23 --json"],
    "down": ["deploy down qwen36-mtp --host root@gpu-box", "deploy down profiles/qwen36-mtp.yaml --grace 60"],
    "export": ["deploy export k8s profiles/qwen36-mtp.yaml --image REGISTRY/IMAGE:TAG -o k8s/ --check",
               "deploy export prometheus profiles/qwen3-8b-fleet.yaml -o targets.json"],
    "export k8s": ["deploy export k8s profiles/qwen36-mtp.yaml --image REGISTRY/IMAGE:TAG -o k8s/ "
                   "--check", "deploy export k8s --from-run qwen36-mtp --host root@gpu-box --image IMAGE"],
    "export prometheus": ["deploy export prometheus profiles/qwen3-8b-fleet.yaml -o targets.json"],
    "history": ["deploy history qwen36-mtp --host root@gpu-box", "deploy history qwen36-mtp --local --json"],
    "logs": ["deploy logs qwen36-mtp --host root@gpu-box -n 200", "deploy logs qwen36-mtp --previous"],
    "plan": ["deploy plan profiles/qwen36-mtp.yaml --host root@gpu-box",
             "deploy plan profiles/qwen36-mtp.yaml --set engine.args.tp_size=2 --json"],
    "prune": ["deploy prune qwen36-mtp --host root@gpu-box --keep 5 --dry-run"],
    "render": ["deploy render profiles/qwen36-mtp.yaml", "deploy render profiles/qwen36-mtp.yaml --set "
               "engine.version=0.5.23 --json"],
    "restart": ["deploy restart qwen36-mtp --host root@gpu-box"],
    "rollback": ["deploy rollback qwen36-mtp --host root@gpu-box"],
    "schema": ["deploy schema > profile.schema.json"],
    "smoke": ["deploy smoke profiles/starter.yaml --host root@gpu-box --junit smoke.xml"],
    "status": ["deploy status qwen36-mtp --host root@gpu-box", "deploy status --host root@gpu-box --json"],
    "up": ["deploy up profiles/qwen36-mtp.yaml --host root@gpu-box",
           "deploy up profiles/qwen36-mtp.yaml --save-fixed fixed.yaml --json > events.ndjson"],
    "upgrade": ["deploy upgrade profiles/qwen36-mtp.yaml --engine KIND==VERSION --save upgraded.yaml",
                "deploy upgrade profiles/qwen36-mtp.yaml --engine KIND==VERSION --apply"],
    "validate": ["deploy validate profiles/qwen36-mtp.yaml", "deploy validate profiles/qwen36-mtp.yaml --set engine.version=0.5.23 --json"],
}
ATTRIBUTE = {"export": "export_group"}   # a command whose function is not named after it


class LazyGroup(SectionedGroup):
    """A click group whose commands are imported on first use (click's documented lazy-loading pattern); `--help`
    lists them by section (deployer.cli.sections) without importing anything."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module = importlib.import_module(f"deployer.cli.{COMMANDS[cmd_name][0]}")
        command = getattr(module, ATTRIBUTE.get(cmd_name, cmd_name))
        assert isinstance(command, click.Command)
        _document(command, cmd_name)
        self.add_command(command, cmd_name)
        return command


def _document(command: click.Command, name: str) -> None:
    """Standard help for shared options and the examples, on the command and (a group) its subcommands."""
    fill_help(command, name)
    with_examples(command, EXAMPLES.get(name, []))
    for sub_name, sub in getattr(command, "commands", {}).items():
        _document(sub, f"{name} {sub_name}")


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="deployer", prog_name="deploy")
def cli() -> None:
    """Deploy LLM inference servers onto GPU boxes over SSH and keep them healthy.

    \b
    Typical use:
      deploy validate profiles/qwen36-mtp.yaml
      deploy plan profiles/qwen36-mtp.yaml --host root@gpu-box
      deploy up profiles/qwen36-mtp.yaml --host root@gpu-box
      deploy status qwen36-mtp --host root@gpu-box
    """



def wants_json(argv: list[str]) -> bool:
    """Whether the command line asked for `--json` (options end at a bare `--`)."""
    return "--json" in (argv[:argv.index("--")] if "--" in argv else argv)


def _fail(code: int, message: str, as_json: bool) -> None:
    """The end of a failed run: one line on stderr, and for `--json` one error event on stdout; then the exit code."""
    click.echo(message, err=True)
    if as_json:
        sys.stdout.write(json.dumps({"event": "error", "code": code, "message": message}) + "\n")
        sys.stdout.flush()
    sys.exit(code)


INTERRUPT_GRACE_S = interrupts.GRACE_S
_watching: list[threading.Event] = []


def _interrupted(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM: unwind as usual (the lock is released, a stopped version brought back, the report
    printed), but never for longer than the clean-up's bound (deployer/interrupts.py: INTERRUPT_GRACE_S, or what a
    step that must not be left half done asked for). An interrupt that lands inside paramiko can leave a channel's
    lock held, and the clean-up's next send on that channel then waits forever (seen in CI: `up` hung after Ctrl-C
    during the watch)."""
    done = threading.Event()

    def give_up() -> None:
        while not done.is_set():
            left = interrupts.left()
            if left is None or left <= 0:
                break
            done.wait(min(left, 0.2))
        if done.is_set():
            return
        sys.stderr.write("interrupted: the clean-up did not finish in time; leaving now "
                         "(the deployment lock's lease expires on its own; what was started keeps running: see "
                         "`deploy status`)\n")
        sys.stderr.flush()
        os._exit(130)

    interrupts.begin(INTERRUPT_GRACE_S)
    threading.Thread(target=give_up, name="deployer-interrupt-bound", daemon=True).start()
    _watching.append(done)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C interrupts the clean-up itself
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends us at once
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    before = signal.signal(signal.SIGINT, _interrupted)
    before_term = signal.signal(signal.SIGTERM, _interrupted)  # SIGTERM (systemd, a CI runner) cleans up as Ctrl-C
    try:
        _main(argv)
    finally:  # called in-process (tests, a library user): leave the caller's signals as they were
        signal.signal(signal.SIGINT, before)
        signal.signal(signal.SIGTERM, before_term)
        while _watching:
            _watching.pop().set()
        interrupts.end()


def _main(argv: list[str] | None) -> None:
    guard_std_streams()  # whatever deployer prints passes the secret masking first
    guard_printable()    # ... and loses its control sequences (a hostile log line, claim note or error message)
    as_json = wants_json(list(sys.argv[1:] if argv is None else argv))
    try:
        rc = cli.main(args=argv, prog_name="deploy", standalone_mode=False)
    except click.exceptions.Abort:
        _fail(130, "interrupted", as_json)
    except click.ClickException as exc:
        if not as_json:
            exc.show()
            sys.exit(exc.exit_code)
        _fail(exc.exit_code, f"error: {exc.format_message()}", as_json)
    except DeployError as exc:
        _fail(exc.exit_code, f"error: {exc}", as_json)
    except KeyboardInterrupt:
        _fail(130, "interrupted: anything already started keeps running on the target (the supervisor outlives "
                   "us); see `deploy status`, or stop it with `deploy down`", as_json)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
