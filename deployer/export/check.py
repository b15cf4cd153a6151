"""Offline checks of Kubernetes manifests: would `kubectl apply` accept them, and are they what we promise?

- Built-in kinds: the Kubernetes OpenAPI schemas of a pinned release, strict (unknown fields are errors), through
  kubernetes-validate (an optional dependency: `pip install 'deployer[k8s]'`).
- LeaderWorkerSet: the openAPIV3Schema of its CRD, vendored in `schemas/` (see schemas/README.md for the source
  and version), made strict the way the API server prunes: an object with declared properties takes no others.
- Our own rules: the serving container has startup, readiness and liveness probes on the health path; worker
  pods of a multi-node group have none (only rank 0 serves HTTP); GPU limits match the profile; every env var
  with a secret name comes from a Secret; no secret value and no merge marker appears anywhere in the text.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from deployer.errors import DeployError

KUBERNETES_VERSION = "1.33"
LWS_SCHEMA_FILE = "leaderworkerset-v1.schema.json.gz"
MERGE_MARKERS = ("<<<<<<< ", "\n=======\n", ">>>>>>> ")
WORKLOAD_KINDS = ("Deployment", "LeaderWorkerSet")


@dataclass(frozen=True)
class Problem:
    where: str    # file: kind/name
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass(frozen=True)
class Expectations:
    """What the profile promises about the manifests (None: not checked)."""

    health_path: str | None = None
    startup_timeout_s: float | None = None
    gpus_per_pod: int | None = None
    secret_env_names: frozenset[str] = frozenset()


def check(files: list[tuple[str, str]], *, expect: Expectations = Expectations(),
          secret_values: Iterable[str] = (), kubernetes_version: str = KUBERNETES_VERSION) -> list[Problem]:
    """Every problem in these (filename, YAML text) files; empty when all is well."""
    import yaml

    problems: list[Problem] = []
    secrets = [v for v in secret_values if v and len(v) >= 4]
    for filename, text in files:
        problems += _text_problems(filename, text, secrets)
        try:
            docs = [d for d in yaml.safe_load_all(text) if d]
        except yaml.YAMLError as exc:
            problems.append(Problem(filename, f"not YAML: {exc}".splitlines()[0]))
            continue
        for doc in docs:
            where = f"{filename}: {doc.get('kind', '?')}/{(doc.get('metadata') or {}).get('name', '?')}"
            problems += [Problem(where, m) for m in _schema_problems(doc, kubernetes_version)]
            problems += [Problem(where, m) for m in _rule_problems(doc, expect)]
    return problems


def _text_problems(filename: str, text: str, secrets: list[str]) -> list[Problem]:
    out = [Problem(filename, "contains a secret value") for value in secrets if value in text]
    if any(marker in text for marker in MERGE_MARKERS):
        out.append(Problem(filename, "contains a merge conflict marker"))
    return out


# --- schemas -------------------------------------------------------------------------------------------


def _schema_problems(doc: dict[str, Any], kubernetes_version: str) -> list[str]:
    if doc.get("kind") == "LeaderWorkerSet":
        return _lws_problems(doc)
    try:
        import kubernetes_validate
    except ImportError:
        raise DeployError("checking manifests needs kubernetes-validate: pip install 'deployer[k8s]'") from None
    try:
        kubernetes_validate.validate(doc, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        return [f"Kubernetes {kubernetes_version} schema: {path}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [exc.message]
    return []


def _lws_problems(doc: dict[str, Any]) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(_lws_schema())
    return [f"LeaderWorkerSet schema: {'.'.join(str(p) for p in err.path)}: {err.message}"
            for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.path))[:10]]


@lru_cache(maxsize=1)
def _lws_schema() -> dict[str, Any]:
    raw = resources.files("deployer.export").joinpath("schemas").joinpath(LWS_SCHEMA_FILE).read_bytes()
    schema: dict[str, Any] = _strict(json.loads(gzip.decompress(raw)))
    return schema


def _strict(node: Any) -> Any:
    """Objects with declared properties accept no others (what the API server's pruning would drop silently)."""
    if isinstance(node, dict):
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        for value in node.values():
            _strict(value)
    elif isinstance(node, list):
        for value in node:
            _strict(value)
    return node


# --- our own rules -------------------------------------------------------------------------------------


def _pod_templates(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(role, pod template) of a workload: `serving` for pods that answer HTTP, `worker` for ranks >= 1."""
    spec = doc.get("spec") or {}
    if doc.get("kind") == "Deployment":
        return [("serving", spec.get("template") or {})]
    if doc.get("kind") == "LeaderWorkerSet":
        group = spec.get("leaderWorkerTemplate") or {}
        return [("serving", group.get("leaderTemplate") or group.get("workerTemplate") or {}),
                ("worker", group.get("workerTemplate") or {})]
    return []


def _rule_problems(doc: dict[str, Any], expect: Expectations) -> list[str]:
    out: list[str] = []
    for role, template in _pod_templates(doc):
        for container in (template.get("spec") or {}).get("containers") or []:
            name = container.get("name", "?")
            out += [f"container {name}: {m}" for m in _env_problems(container, expect)]
            if name != "engine":
                continue
            out += [f"{role} container engine: {m}" for m in _probe_problems(container, role, expect)]
            out += [f"{role} container engine: {m}" for m in _gpu_problems(container, expect)]
    return out


def _probe_problems(container: dict[str, Any], role: str, expect: Expectations) -> list[str]:
    probes = ("startupProbe", "readinessProbe", "livenessProbe")
    if role == "worker":
        return [f"{p} on a worker rank (only rank 0 serves HTTP)" for p in probes if p in container]
    out = [f"no {p}" for p in probes if "httpGet" not in (container.get(p) or {})]
    for probe in probes[:2]:
        path = ((container.get(probe) or {}).get("httpGet") or {}).get("path")
        if path is not None and expect.health_path is not None and path != expect.health_path:
            out.append(f"{probe} checks {path}, not the health path {expect.health_path}")
    startup = container.get("startupProbe") or {}
    if expect.startup_timeout_s is not None and startup:
        covered = int(startup.get("failureThreshold", 3)) * int(startup.get("periodSeconds", 10))
        if covered < expect.startup_timeout_s:
            out.append(f"startupProbe covers {covered}s, less than startup_timeout_s {expect.startup_timeout_s:g}")
    return out


def _gpu_problems(container: dict[str, Any], expect: Expectations) -> list[str]:
    if expect.gpus_per_pod is None:
        return []
    limits = (container.get("resources") or {}).get("limits") or {}
    found = limits.get("nvidia.com/gpu")
    if found != expect.gpus_per_pod:
        return [f"nvidia.com/gpu limit is {found}, the profile needs {expect.gpus_per_pod}"]
    return []


def _env_problems(container: dict[str, Any], expect: Expectations) -> list[str]:
    out = []
    for entry in container.get("env") or []:
        name = entry.get("name", "")
        if name in expect.secret_env_names and "value" in entry:
            out.append(f"env {name} is a secret written inline (use valueFrom.secretKeyRef)")
    return out
