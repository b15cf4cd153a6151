"""On-call reads of a deployment's record (history, diagnose, prune): options and output only; each resolves
its deployment (deployer.deployments) and calls one method of it."""

from __future__ import annotations

from pathlib import Path

import click

from deployer.cli import show
from deployer.cli.options import _target_options
from deployer.deployments.reports import DiagnosisReport, HistoryReport
from deployer.deployments.resolve import CHANGE, READ, resolve
from deployer.deployments.base import PruneOptions
from deployer.diagnose.diagnosis import diagnose as diagnose_text
from deployer.diagnose.diagnosis import read_window
from deployer.engines import detect
from deployer.engines import engine_for
from deployer.engines import kinds
from deployer.errors import ProfileError
from deployer.logtext import bounded_diagnosis
from deployer.operate.history import local_history


@click.command()
@click.argument("target", required=False)
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]")
@click.option("--workdir", default=None)
@_target_options
@click.option("--json", "as_json", is_flag=True)
@click.option("--local", is_flag=True,
              help="Read this machine's history cache instead of the target (without NAME: every deployment's).")
def history(target: str | None, host: str | None, workdir: str | None, trust_new_host: bool, as_json: bool,
            local: bool) -> None:
    """Every attempt of a deployment: when, content hash, outcome, diagnosis, change made."""
    if local:
        report = HistoryReport(local_history(target, host))
    elif target is None:
        raise click.UsageError("give NAME or PROFILE (or --local to list every deployment's attempts)")
    else:
        report = resolve(target, host, workdir, trust_new_host=trust_new_host, mode=READ).history()
    if as_json:
        show.emit_json(report.to_json())
    else:
        show.text(report)


@click.command()
@click.argument("target", required=False)
@click.option("--log", "log_file", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Diagnose a local log file (no target needed).")
@click.option("--engine-version", default=None, help="Engine version the log came from.")
@click.option("--engine", "engine_kind", type=click.Choice(kinds()), default=None,
              help="Engine the log file came from (default: told from the log itself; a deployment's own record "
                   "says it).")
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]")
@click.option("--workdir", default=None)
@_target_options
@click.option("--json", "as_json", is_flag=True)
def diagnose(target: str | None, log_file: str | None, engine_version: str | None, engine_kind: str | None,
             host: str | None, workdir: str | None, trust_new_host: bool, as_json: bool) -> None:
    """The first traceback and diagnosis of a log file, or of a deployment's latest failed attempt."""
    if log_file is None:
        report = _diagnose_target(target, host, workdir, trust_new_host, engine_version)
    else:
        report = _diagnose_log(log_file, engine_version, engine_kind)
    if as_json:
        show.emit_json(report.to_json())
    else:
        show.text(report)


def _diagnose_target(target: str | None, host: str | None, workdir: str | None, trust_new_host: bool,
                     engine_version: str | None) -> DiagnosisReport:
    try:
        return resolve(target, host, workdir, trust_new_host=trust_new_host, mode=READ).diagnose(engine_version)
    except ProfileError:
        # a log given where a profile goes reads as a profile of unknown keys: say what was meant instead
        if target is not None and Path(target).is_file() and Path(target).suffix not in (".yaml", ".yml"):
            raise click.UsageError(f"{target} is not a profile; to diagnose a log file: deploy diagnose --log "
                                   f"{target}") from None
        raise


def _diagnose_log(log_file: str, engine_version: str | None, engine_kind: str | None) -> DiagnosisReport:
    text = read_window(log_file)
    # Nothing defaults to an engine: the log names its engine, or only the engine-neutral signatures are used.
    engine, how = (engine_for(engine_kind), "given") if engine_kind else (detect(text), "detected from the log")
    diag = diagnose_text(text, engine_version=engine_version, engine=engine)
    data = bounded_diagnosis({**diag.to_json(), "hint": diag.hint})
    data["engine"] = {"kind": engine.kind, "how": how} if engine is not None else \
        {"kind": None, "how": "not told by the log: engine-neutral signatures only"}
    return DiagnosisReport(data)


@click.command()
@click.argument("target")
@click.option("--host", default=None, metavar="[USER@]HOST[:PORT]")
@click.option("--workdir", default=None)
@_target_options
@click.option("--keep", type=click.IntRange(1, 10000), default=None,
              help="Run dirs to keep (default: the profile's retention.keep_runs, 10).")
@click.option("--dry-run", is_flag=True, help="Say what would go; change nothing.")
@click.option("--json", "as_json", is_flag=True)
def prune(target: str, host: str | None, workdir: str | None, trust_new_host: bool, keep: int | None,
          dry_run: bool, as_json: bool) -> None:
    """Delete old run dirs beyond the newest N and the env files (secrets) of runs no restart or rollback needs.

    The current run and the newest run that reached ready (and rollback's target) are never deleted.
    """
    deployment = resolve(target, host, workdir, trust_new_host=trust_new_host, mode=CHANGE)
    report = deployment.prune(PruneOptions(keep=keep, dry_run=dry_run))
    if as_json:
        show.emit_json(report.to_json())
    else:
        show.text(report)
