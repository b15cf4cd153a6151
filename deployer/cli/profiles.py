"""Profile commands that reach no target: validate, render, schema."""

from __future__ import annotations

import click

from deployer.cli.load import _load
from deployer.cli.options import _emit_json, _profile_options
from deployer.deployments.resolve import for_profile
from deployer.errors import ProfileError, ProfileProblems
from deployer.local.history import home
from deployer.preflight.flags import check_offline, default_cache_dir
from deployer.profile.loader import engine_only
from deployer.profile.model import Profile


@click.command()
@click.argument("profile", type=click.Path(dir_okay=False))
@_profile_options
@click.option("--json", "as_json", is_flag=True, help="Print the validated profile as JSON (secrets masked).")
def validate(profile: str, overrides: tuple[str, ...], host: str | None, as_json: bool) -> None:
    """Check a profile; exit 0 when good, 2 listing every problem when not (secrets need not be set).

    engine.args are checked offline against the flag table cached for the engine version the profile pins
    (engine.version), else the newest one cached; a typo `up` would respell is an error here.
    """
    try:
        prof = _load(profile, overrides, host, allow_unset=True)
    except ProfileError as e:  # list the flag problems too, where the engine section can be read on its own
        raise _with_flag_problems(e, engine_only(profile, overrides=list(overrides), host=host)) from None
    said, errors = _flag_problems(prof)
    if errors:
        click.echo(said, err=True)
        raise errors[0] if len(errors) == 1 else ProfileProblems(errors, file=errors[0].file)
    if as_json:
        _emit_json(prof.public_dict())
    else:
        click.echo(f"{profile}: ok ({prof.name}: {prof.engine.kind} {prof.engine.model_path} -> "
                   f"{prof.target.host}:{prof.engine.port})")
        click.echo(f"  {said}")


def _flag_problems(prof: Profile) -> tuple[str, list[ProfileError]]:
    """engine.args against the cached flag table: which table (a line saying so) and every problem, in file order;
    warnings go to stderr as they are found."""
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
    return said, errors


def _with_flag_problems(schema: ProfileError, engine: Profile | None) -> ProfileError:
    """The schema's problems and, after them, the flag problems of the engine section (issue 36: one run shows
    every problem); the schema error as it was when the engine section cannot be read or its flags are fine."""
    if engine is None:
        return schema
    said, flags = _flag_problems(engine)
    if not flags:
        return schema
    click.echo(said, err=True)
    problems = schema.problems if isinstance(schema, ProfileProblems) else [schema]
    return ProfileProblems([*problems, *flags], file=schema.file)


@click.command()
@click.argument("profile", type=click.Path(dir_okay=False))
@_profile_options
@click.option("--json", "as_json", is_flag=True, help="Print the bundle (script, argv, masked env, hash).")
def render(profile: str, overrides: tuple[str, ...], host: str | None, as_json: bool) -> None:
    """Print the launch script a profile renders to (secrets never shown)."""
    prof = _load(profile, overrides, host, allow_unset=True)
    # a node group: every node's launch; stderr says which engine version the flags are for (or that none is known)
    text = for_profile(prof).render(as_json, note=lambda line: click.echo(f"note: {line}", err=True))
    click.echo(text, nl=False)


@click.command()
def schema() -> None:
    """Print the profile JSON Schema (for editors)."""
    _emit_json(Profile.model_json_schema())
