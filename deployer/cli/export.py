"""`deploy export k8s`: the profile (or the run that last reached ready) as Kubernetes manifests; `deploy export
prometheus`: the scrape targets of its engines and routers. Options and output only, the work is in
deployer.export."""

from __future__ import annotations

from pathlib import Path

import click

from deployer import __version__
from deployer.cli.load import _load
from deployer.cli.options import _profile_options, _target_options
from deployer.deployments.resolve import CHANGE, for_profile, resolve
from deployer.engines import engines
from deployer.errors import DeployError, ProfileError
from deployer.export import check as chk
from deployer.export import files
from deployer.export import k8s as k8s_export
from deployer.export.prometheus import written_address
from deployer.export.translate import for_version
from deployer.profile.loader import load_profile
from deployer.remote.connect import ssh_address


# where a `${VAR}` makes a value secret (Profile.secret_env_keys, secret_arg_keys): the manifests reference it
SECRET_FIELDS = ("engine.env.", "engine.args.")


@click.group("export")
def export_group() -> None:
    """Write a profile for another platform (Kubernetes) or monitoring system (Prometheus)."""


@export_group.command("k8s")
@click.argument("profile", required=False, type=click.Path(dir_okay=False))
@_profile_options
@_target_options
@click.option("-o", "--output-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write one YAML file per component here (default: print to stdout).")
@click.option("--image", default=None, help="Engine container image, e.g. "
              + ", ".join(engine.docs.image_example for engine in engines()) + ".")
@click.option("--router-image", default=None, help="Router image (default: the engine image).")
@click.option("--namespace", default="default", show_default=True, help="Kubernetes namespace of every object.")
@click.option("--engine-version", default=None,
              help="Engine release in the image (default: from the image tag, else engine.version).")
@click.option("--model-cache", default="pvc", show_default=True,
              help="Weights volume: pvc[:NAME] (default NAME: <name>-model-cache), hostpath:/PATH or emptydir.")
@click.option("--shm-size", default=None, help="sizeLimit of the /dev/shm memory volume, e.g. 32Gi.")
@click.option("--python", "python", default="python3", show_default=True, help="Interpreter inside the image.")
@click.option("--kubernetes-version", default=None, help="Validate against this release (with --check).")
@click.option("--check", is_flag=True, help="Validate the manifests offline; exit 1 on any problem.")
@click.option("--from-run", "from_run", default=None, metavar="NAME",
              help="Export the run of NAME on --host that last reached ready (the healed profile).")
@click.option("--workdir", default=None, help="Target workdir for --from-run (default /workspace/deployer).")
def k8s(profile: str | None, overrides: tuple[str, ...], host: str | None, trust_new_host: bool,
        output_dir: Path | None, image: str | None, router_image: str | None, namespace: str,
        engine_version: str | None, model_cache: str, shm_size: str | None, python: str,
        kubernetes_version: str | None, check: bool, from_run: str | None, workdir: str | None) -> None:
    """Kubernetes manifests for PROFILE: Deployment or LeaderWorkerSet, Services, the router with its RBAC."""
    if from_run:
        if profile:
            raise ProfileError("give PROFILE or --from-run NAME, not both")
        source = resolve(from_run, host, workdir, trust_new_host=trust_new_host, mode=CHANGE).export_source()
        click.echo(f"exporting run {source.run_id} of {from_run} (the last that reached ready)", err=True)
    elif profile:
        # the engine's `${VAR}`s are secrets the pods read from the Secret (secretKeyRef): their values are not
        # needed here; one anywhere else would be written into a manifest, so it must be set
        prof_loaded = load_profile(profile, overrides=list(overrides), allow_unset=SECRET_FIELDS)
        source = for_profile(prof_loaded).export_source()
    else:
        raise ProfileError("give a PROFILE file, or --from-run NAME --host HOST")
    prof = source.profile
    version = engine_version or (k8s_export.version_from_image(image) if image else None) or prof.engine.version
    translated, notes = for_version(prof, version)
    opts = k8s_export.ExportOptions(image=image, namespace=namespace, engine_version=version,
                                    model_cache=model_cache, router_image=router_image, python=python,
                                    shm_size=shm_size)
    export = k8s_export.export_k8s(translated, opts)
    texts = files.texts(export, prof.name, __version__)
    for note in notes + export.notes:
        click.echo(f"note: {note}", err=True)
    if output_dir is not None:
        for path in files.write(output_dir, texts):
            click.echo(f"wrote {path}", err=True)
    else:
        click.echo("---\n".join(text for _, text in texts), nl=False)
    command = export.secret_command()
    if command:
        click.echo(f"create the Secret first (values from your shell): {command}", err=True)
    if check:
        problems = chk.check(texts, expect=k8s_export.expectations(translated),
                             secret_values=k8s_export.secret_values(prof),
                             kubernetes_version=kubernetes_version or chk.KUBERNETES_VERSION)
        for problem in problems:
            click.echo(f"problem: {problem}", err=True)
        if problems:
            raise DeployError(f"{len(problems)} problem(s) in the exported manifests")
        click.echo(f"checked {len(export.objects)} objects: valid for Kubernetes "
                   f"{kubernetes_version or chk.KUBERNETES_VERSION} (strict) and LeaderWorkerSet v1; probes, "
                   "GPU limits and secrets as the profile says", err=True)


@export_group.command("prometheus")
@click.argument("profile", type=click.Path(dir_okay=False))
@_profile_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the file_sd JSON here (default: stdout).")
@click.option("--resolve-hosts", is_flag=True,
              help="Write each host's ssh_config HostName instead of the alias the profile uses.")
def prometheus(profile: str, overrides: tuple[str, ...], host: str | None, output: Path | None,
               resolve_hosts: bool) -> None:
    """Prometheus scrape targets (file_sd JSON) for every engine and router of PROFILE (single host, fleet, nodes).

    \b
    Example:
      deploy export prometheus profiles/qwen3-8b-fleet.yaml -o /etc/prometheus/targets/deployer.json
    A warning (stderr) names what keeps Prometheus from reading a target (metrics off, a loopback bind).
    """
    export = for_profile(_load(profile, overrides, host, allow_unset=True)).scrape_targets(
        ssh_address if resolve_hosts else written_address)
    for warning in export.warnings:
        click.echo(f"warning: {warning}", err=True)
    if output is not None:
        output.write_text(export.text(), encoding="utf-8")
        click.echo(f"wrote {output} ({len(export.targets)} targets)", err=True)
    else:
        click.echo(export.text(), nl=False)
