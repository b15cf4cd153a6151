"""Command line: argv -> calls into the pipeline -> output and exit codes. No deployment logic lives here.

Imports of heavy modules (fabric, rich, pydantic) happen inside the commands so `deploy --help` stays fast:
that is the only reason for function-level imports anywhere in `deployer.cli`.
Exit codes: 0 ok, 1 other error, 2 bad profile or usage, 3 connection/SSH, 4 target unfit (locked, port busy,
preflight), 5 launch failed, 6 unhealthy, 7 not found, 8 stopped (status), 9 a fleet partly failed, 130 interrupted. With `--json`, a failure also ends stdout
with one `{"event": "error", "code": N, "message": ...}` line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import click

from deployer.cli import export, oncall, smoke, targets
from deployer.cli.options import _emit_json, _load, _profile_options
from deployer.errors import DeployError



@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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


@cli.command()
@click.argument("profile", type=click.Path(dir_okay=False))
@_profile_options
@click.option("--json", "as_json", is_flag=True, help="Print the validated profile as JSON (secrets masked).")
def validate(profile: str, overrides: tuple[str, ...], host: str | None, as_json: bool) -> None:
    """Check a profile; exit 0 when good, 2 listing every problem when not (secrets need not be set).

    engine.args are checked offline against the flag table cached for the engine version the profile pins
    (engine.version), else the newest one cached; a typo `up` would respell is an error here.
    """
    from deployer.errors import ProfileError, ProfileProblems
    from deployer.local_history import home
    from deployer.preflight.flags import check_offline, default_cache_dir

    prof = _load(profile, overrides, host, allow_unset=True)
    check = check_offline(prof, [default_cache_dir(), home() / "cache"])
    said = (f"engine.args checked against the cached flag table of {prof.engine.kind} {check.version} "
            f"({check.basis})") if check.version else f"engine.args not checked: {check.basis}"
    errors = [ProfileError(line, file=prof.where(f"engine.args.{key}")[0], line=prof.where(f"engine.args.{key}")[1],
                           field=f"engine.args.{key}" if key else "engine.args")
              for key, line in check.strict_problems()]
    errors.sort(key=lambda e: (e.file or "", e.line or 0))
    keyed = check.report.keyed if check.report else {}
    for warning in check.report.warnings if check.report else []:
        if warning not in keyed:  # a respelt typo is an error here, not a warning
            click.echo(f"warning: {warning}", err=True)
    if errors:
        click.echo(said, err=True)
        raise errors[0] if len(errors) == 1 else ProfileProblems(errors, file=errors[0].file)
    if as_json:
        _emit_json(prof.public_dict())
    else:
        click.echo(f"{profile}: ok ({prof.name}: {prof.engine.kind} {prof.engine.model_path} -> "
                   f"{prof.target.host}:{prof.engine.port})")
        click.echo(f"  {said}")


@cli.command()
@click.argument("profile", type=click.Path(dir_okay=False))
@_profile_options
@click.option("--json", "as_json", is_flag=True, help="Print the bundle (script, argv, masked env, hash).")
def render(profile: str, overrides: tuple[str, ...], host: str | None, as_json: bool) -> None:
    """Print the launch script a profile renders to (secrets never shown)."""
    from deployer.render.bundle import render as render_bundle

    prof = _load(profile, overrides, host, allow_unset=True)
    if prof.nodes:  # one engine across nodes: every node's launch (issue 14)
        from deployer.fleet.nodes_render import render_nodes

        click.echo(render_nodes(prof, as_json), nl=False)
        return
    bundle = render_bundle(prof)
    if as_json:  # secret_sources: where each secret value will come from (field -> ${VAR} text)
        _emit_json({"script": bundle.script, "argv": bundle.argv, "env": bundle.masked_env,
                    "content_hash": bundle.content_hash, "secret_sources": prof.templates,
                    "unset": sorted({u.name for u in prof.unset})})
    else:
        click.echo(bundle.script, nl=False)


@cli.command()
def schema() -> None:
    """Print the profile JSON Schema (for editors)."""
    from deployer.profile.model import Profile

    _emit_json(Profile.model_json_schema())


def _register_more() -> None:
    """Commands that talk to targets, on-call commands and `smoke` live in their own modules."""
    targets.register(cli)
    oncall.register(cli)
    smoke.register(cli)
    export.register(cli)


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


INTERRUPT_GRACE_S = 20.0
_armed: list[threading.Timer] = []


def _interrupted(signum: int, frame: object) -> None:
    """Ctrl-C: unwind as usual (the lock is released, the report printed), but never for longer than
    INTERRUPT_GRACE_S. An interrupt that lands inside paramiko can leave a channel's lock held, and the clean-up's
    next send on that channel then waits forever (seen in CI: `up` hung after Ctrl-C during the watch)."""
    def give_up() -> None:
        sys.stderr.write(f"interrupted: the clean-up did not finish within {INTERRUPT_GRACE_S:g}s; leaving now (the "
                         "deployment lock's lease expires on its own; what was started keeps running: see `deploy "
                         "status`)\n")
        sys.stderr.flush()
        os._exit(130)

    timer = threading.Timer(INTERRUPT_GRACE_S, give_up)
    timer.daemon = True
    timer.start()
    _armed.append(timer)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C interrupts the clean-up itself
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    if threading.current_thread() is not threading.main_thread():
        return _main(argv)
    before = signal.signal(signal.SIGINT, _interrupted)
    try:
        _main(argv)
    finally:  # called in-process (tests, a library user): leave the caller's Ctrl-C as it was
        signal.signal(signal.SIGINT, before)
        while _armed:
            _armed.pop().cancel()


def _main(argv: list[str] | None) -> None:
    from deployer.errors import DeployError
    from deployer.secrets import guard_std_streams

    guard_std_streams()  # whatever deployer prints passes the secret masking first
    _register_more()
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
