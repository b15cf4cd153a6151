"""Command line: argv -> calls into the pipeline -> output and exit codes. No deployment logic lives here.

Imports of heavy modules (fabric, rich, pydantic) happen inside the commands so `deploy --help` stays fast.
Exit codes: 0 ok, 1 other error, 2 bad profile or usage, 3 connection/SSH, 4 target unfit (locked, port busy,
preflight), 5 launch failed, 6 unhealthy, 7 not found, 130 interrupted.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, Callable, TypeVar

import click

if TYPE_CHECKING:
    from deployer.profile import Profile

F = TypeVar("F", bound=Callable[..., Any])


def _profile_options(func: F) -> F:
    func = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                        help="Override a profile field, e.g. engine.args.tp_size=2 (repeatable).")(func)
    func = click.option("--host", default=None, metavar="[USER@]HOST[:PORT]",
                        help="Deploy to this host instead of the profile's target.host.")(func)
    return func


def _target_options(func: F) -> F:
    func = click.option("--trust-new-host", is_flag=True,
                        help="Record the key of a host not yet in known_hosts (never a changed key).")(func)
    return func


def _load(path: str, overrides: tuple[str, ...], host: str | None, allow_unset: bool = False) -> Profile:
    """allow_unset (validate, render): an unset `${VAR}` is a warning on stderr; secret values are never needed."""
    from deployer.profile import load_profile

    prof = load_profile(path, overrides=list(overrides), host=host, allow_unset=allow_unset)
    for unset in prof.unset:
        click.echo(f"warning: {unset.warning()}", err=True)
    return prof


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="deployer", prog_name="deploy")
def cli() -> None:
    """Deploy LLM inference servers (SGLang) onto GPU boxes over SSH and keep them healthy.

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
    """Check a profile; exit 0 when good, 2 with one clear line when not (secrets need not be set)."""
    prof = _load(profile, overrides, host, allow_unset=True)
    if as_json:
        _emit_json(prof.public_dict())
    else:
        click.echo(f"{profile}: ok ({prof.name}: {prof.engine.kind} {prof.engine.model_path} -> "
                   f"{prof.target.host}:{prof.engine.port})")


@cli.command()
@click.argument("profile", type=click.Path(dir_okay=False))
@_profile_options
@click.option("--json", "as_json", is_flag=True, help="Print the bundle (script, argv, masked env, hash).")
def render(profile: str, overrides: tuple[str, ...], host: str | None, as_json: bool) -> None:
    """Print the launch script a profile renders to (secrets never shown)."""
    from deployer.render import render as render_bundle

    prof = _load(profile, overrides, host, allow_unset=True)
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
    from deployer.profile import Profile

    _emit_json(Profile.model_json_schema())


def _register_more() -> None:
    """Commands that talk to targets live in cli_ops to keep this module small."""
    from deployer import cli_ops, cli_smoke

    cli_ops.register(cli)
    cli_smoke.register(cli)


def main(argv: list[str] | None = None) -> None:
    from deployer.errors import DeployError
    from deployer.secrets import guard_std_streams

    guard_std_streams()  # whatever deployer prints passes the secret masking first
    _register_more()
    try:
        rc = cli.main(args=argv, prog_name="deploy", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except DeployError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted: anything already started keeps running on the target (the supervisor outlives "
                   "us); see `deploy status`, or stop it with `deploy down`", err=True)
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
