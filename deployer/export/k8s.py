"""Kubernetes manifests for a profile: one node -> Deployment + Service; `nodes:` -> LeaderWorkerSet + Service
on the leader; `router:` -> the `smg` model gateway with Kubernetes service discovery (and its RBAC).

The engine's argv is the one `deploy render` produces for the same profile, with two pod-specific changes that
a pod needs: the engine listens on 0.0.0.0 (probes and the Service reach the pod IP) and secret flag values are
read from the container's environment (`$(NAME)`, filled from a Secret), never written inline. GPU indices
(`engine.gpus`) become a count: in a cluster the device plugin picks the GPUs.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from deployer.errors import ProfileError
from deployer.export.check import Expectations
from deployer.profile.model import Profile
from deployer.render.bundle import EnvRef, engine_argv, engine_env, flag_tokens

MANAGED_BY = "deployer"
NAME_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
ROLE_LABEL = "deployer.dev/role"  # leader | worker, multi-node only
LWS_API = "leaderworkerset.x-k8s.io/v1"
STARTUP_PERIOD_S = 10
LIVENESS_PERIOD_S = 30
LIVENESS_FAILURES = 10  # loose: five minutes of a failing health check before the kubelet restarts the engine
MODEL_CACHE_DEFAULT_MOUNT = "/root/.cache/huggingface"
_TAG_VERSION = re.compile(r":v?(\d+\.\d+\.\d+(?:rc\d+|\.post\d+)?)")


@dataclass(frozen=True)
class ModelCache:
    """Where the pods keep downloaded weights: a PersistentVolumeClaim, a hostPath, or (throwaway) emptyDir."""

    kind: str  # pvc | hostpath | emptydir
    source: str = ""

    @classmethod
    def parse(cls, text: str, name: str) -> ModelCache:
        kind, _, source = text.partition(":")
        kind = kind.lower()
        if kind == "pvc" and (source or name):
            return cls("pvc", source or f"{name}-model-cache")
        if kind == "hostpath" and source.startswith("/"):
            return cls("hostpath", source)
        if kind == "emptydir" and not source:
            return cls("emptydir")
        raise ProfileError(f"--model-cache {text!r}: expected pvc[:NAME], hostpath:/ABSOLUTE/PATH or emptydir")

    def volume(self) -> dict[str, Any]:
        if self.kind == "pvc":
            return {"name": "model-cache", "persistentVolumeClaim": {"claimName": self.source}}
        if self.kind == "hostpath":
            return {"name": "model-cache", "hostPath": {"path": self.source, "type": "DirectoryOrCreate"}}
        return {"name": "model-cache", "emptyDir": {}}


@dataclass(frozen=True)
class ExportOptions:
    image: str | None = None
    namespace: str = "default"
    engine_version: str | None = None      # default: from the image tag, else engine.version
    model_cache: str = "pvc"
    router_image: str | None = None        # default: the engine image
    python: str = "python3"                # the interpreter inside the image
    shm_size: str | None = None            # sizeLimit of the /dev/shm emptyDir


@dataclass(frozen=True)
class Manifest:
    """One file of the export: a few objects that belong together."""

    filename: str
    objects: list[dict[str, Any]]


@dataclass
class Export:
    manifests: list[Manifest]
    secret_name: str
    secret_keys: list[str]
    namespace: str
    engine_version: str | None
    notes: list[str] = field(default_factory=list)

    @property
    def objects(self) -> list[dict[str, Any]]:
        return [obj for m in self.manifests for obj in m.objects]

    def secret_command(self) -> str | None:
        """The `kubectl create secret` line that makes the Secret the pods read (values from your shell)."""
        if not self.secret_keys:
            return None
        # shell-quoted from its parts; each value is the shell's `"$NAME"` (names are environment variable names:
        # the profile's schema refuses any other), so no value of the profile is ever pasted into the line
        literals = " ".join(shlex.quote(f"--from-literal={k}=") + f'"${{{k}}}"' for k in self.secret_keys)
        return shlex.join(["kubectl", "-n", self.namespace, "create", "secret", "generic", self.secret_name]) + \
            f" {literals}"


def version_from_image(image: str) -> str | None:
    """The release in an image's tag: `<repository>:v0.5.23-cu129` -> `0.5.23`."""
    match = _TAG_VERSION.search(image.rsplit("/", 1)[-1])
    return match.group(1) if match else None


def export_k8s(profile: Profile, opts: ExportOptions) -> Export:
    """Manifests for `profile` (already translated for the engine version and healed)."""
    if not opts.image:
        example = profile.engine.definition.docs.image_example
        raise ProfileError(f"--image: which container image runs the engine? (e.g. {example})")
    pod_profile = profile.model_copy(update={"engine": profile.engine.model_copy(update={"host": "0.0.0.0"})})
    _keep_private(pod_profile, profile)
    export = Export(manifests=[], secret_name=f"{profile.name}-secrets", secret_keys=_secret_keys(profile),
                    namespace=opts.namespace, engine_version=opts.engine_version)
    cache = ModelCache.parse(opts.model_cache, profile.name)
    if profile.nodes is not None:
        engine = _leader_worker_set(pod_profile, opts, cache, export)
    else:
        engine = _deployment(pod_profile, opts, cache, export)
    export.manifests.append(Manifest("engine.yaml", [engine, _engine_service(profile, opts)]))
    if profile.router is not None:
        export.manifests.append(Manifest("router.yaml", _router_objects(profile, opts)))
    if cache.kind == "emptydir":
        export.notes.append("model cache is an emptyDir: every new pod downloads the weights again")
    return export


def expectations(profile: Profile) -> Expectations:
    """What the manifests of `profile` must show (for `check`)."""
    size = len(profile.nodes) if profile.nodes else 1
    gpus = profile.nodes[0].gpus if profile.nodes else _replica_gpus(profile)
    return Expectations(health_path=profile.health.path, startup_timeout_s=profile.health.startup_deadline_s,
                        gpus_per_pod=_gpu_count(profile, gpus, nodes=size),
                        secret_env_names=frozenset(_secret_keys(profile)))


def secret_values(profile: Profile) -> list[str]:
    """The secret values this profile holds (from the local environment): none may appear in a manifest."""
    env = engine_env(profile)
    return [env[k] for k in _secret_keys(profile) if env.get(k) and env[k] != "***"]


def _keep_private(copy: Profile, original: Profile) -> None:
    copy._source = original._source
    copy._secret_env = original._secret_env
    copy._secret_args = original._secret_args


def _secret_keys(profile: Profile) -> list[str]:
    """Names the Secret must hold: secret env keys and the env names secret flags are passed through."""
    env = engine_env(profile)
    return sorted(k for k in env if _is_secret_env(profile, k))


def _is_secret_env(profile: Profile, key: str) -> bool:
    secret_flag_vars = {w.name for w in engine_argv(profile) if isinstance(w, EnvRef)}
    return key in profile.secret_env_keys() or key in secret_flag_vars


def _labels(profile: Profile, component: str) -> dict[str, str]:
    return {NAME_LABEL: profile.name, COMPONENT_LABEL: component, "app.kubernetes.io/managed-by": MANAGED_BY}


def _selector(profile: Profile, component: str) -> dict[str, str]:
    return {NAME_LABEL: profile.name, COMPONENT_LABEL: component}


def _meta(name: str, opts: ExportOptions, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": opts.namespace, "labels": labels}


# --- the engine container ------------------------------------------------------------------------------


def _engine_args(profile: Profile, extra: list[str]) -> tuple[list[str], list[str]]:
    """(command, args) of the engine container: `deploy render`'s argv, secret words as `$(NAME)`."""
    words = engine_argv(profile)
    module_at = words.index("-m") if "-m" in words else 0
    head = [str(w) for w in words[1:module_at + 2]]
    args = [f"$({w.name})" if isinstance(w, EnvRef) else w for w in words[module_at + 2:]]
    return head, args + extra


def _env(profile: Profile, secret_name: str) -> list[dict[str, Any]]:
    env = engine_env(profile)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the device plugin assigns GPUs; indices of a box mean nothing here
    out: list[dict[str, Any]] = []
    for key in sorted(env):
        if _is_secret_env(profile, key):
            out.append({"name": key, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": key}}})
        else:
            out.append({"name": key, "value": env[key]})
    return out


def _gpu_count(profile: Profile, gpus: list[int] | None, nodes: int = 1) -> int:
    if gpus:
        return len(gpus)
    per_engine = profile.engine.definition.launch.gpus_per_engine(profile.engine.args)
    return max(1, math.ceil(per_engine / nodes))


def _probes(profile: Profile) -> dict[str, Any]:
    health = profile.health
    get = {"httpGet": {"path": health.path, "port": "http"}}
    timeout = max(1, math.ceil(health.request_timeout_s))
    return {
        # failureThreshold x period covers startup_timeout_s: a first start may download for many minutes
        "startupProbe": {**get, "periodSeconds": STARTUP_PERIOD_S, "timeoutSeconds": timeout,
                         "failureThreshold": max(1, math.ceil(health.startup_deadline_s / STARTUP_PERIOD_S))},
        "readinessProbe": {**get, "periodSeconds": max(1, math.ceil(health.interval_s)), "timeoutSeconds": timeout,
                           "failureThreshold": 3},
        "livenessProbe": {**get, "periodSeconds": LIVENESS_PERIOD_S, "timeoutSeconds": max(timeout, 30),
                          "failureThreshold": LIVENESS_FAILURES},
    }


def _mount_path(profile: Profile) -> str:
    return profile.engine.env.get("HF_HOME") or MODEL_CACHE_DEFAULT_MOUNT


def _engine_container(profile: Profile, opts: ExportOptions, secret_name: str, gpus: int, *, probes: bool,
                      extra_args: list[str]) -> dict[str, Any]:
    head, args = _engine_args(profile, extra_args)
    container: dict[str, Any] = {
        "name": "engine",
        "image": opts.image,
        "command": [opts.python, *head],
        "args": args,
        "env": _env(profile, secret_name),
        "ports": [{"name": "http", "containerPort": profile.engine.port, "protocol": "TCP"}],
        "resources": {"limits": {"nvidia.com/gpu": gpus}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "model-cache", "mountPath": _mount_path(profile)}],
    }
    if probes:
        container.update(_probes(profile))
    return container


def _pod_spec(profile: Profile, opts: ExportOptions, cache: ModelCache, container: dict[str, Any]) -> dict[str, Any]:
    shm: dict[str, Any] = {"medium": "Memory"}
    if opts.shm_size:
        shm["sizeLimit"] = opts.shm_size
    return {
        "containers": [container],
        "terminationGracePeriodSeconds": max(1, math.ceil(profile.restart.grace_s)),
        "volumes": [{"name": "dshm", "emptyDir": shm}, cache.volume()],
    }


# --- one node: Deployment ---------------------------------------------------------------------------


def _replica_count(profile: Profile) -> int:
    if isinstance(profile.replicas, int):
        return profile.replicas
    return len(profile.replicas) if profile.replicas else 1


def _replica_gpus(profile: Profile) -> list[int] | None:
    """GPU indices of the biggest replica (a Deployment has one pod template for all)."""
    if isinstance(profile.replicas, list):
        return max((r.gpus for r in profile.replicas if r.gpus), key=len, default=profile.engine.gpus)
    return profile.engine.gpus


def _deployment(profile: Profile, opts: ExportOptions, cache: ModelCache, export: Export) -> dict[str, Any]:
    gpus = _replica_gpus(profile)
    if isinstance(profile.replicas, list):
        counts = {len(r.gpus) for r in profile.replicas if r.gpus}
        if len(counts) > 1:
            export.notes.append(f"replicas ask for different GPU counts {sorted(counts)}: every pod gets the most")
        if any(r.engine_port not in (None, profile.engine.port) for r in profile.replicas):
            export.notes.append("per-replica engine_port is dropped: every pod listens on engine.port")
    container = _engine_container(profile, opts, export.secret_name, _gpu_count(profile, gpus), probes=True,
                                  extra_args=[])
    labels = _labels(profile, "engine")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(profile.name, opts, labels),
        "spec": {
            "replicas": _replica_count(profile),
            "strategy": {"type": "Recreate"},  # two engines never share a GPU budget during a rollout
            "selector": {"matchLabels": _selector(profile, "engine")},
            "template": {"metadata": {"labels": labels}, "spec": _pod_spec(profile, opts, cache, container)},
        },
    }


# --- several nodes: LeaderWorkerSet --------------------------------------------------------------------


def _leader_worker_set(profile: Profile, opts: ExportOptions, cache: ModelCache, export: Export) -> dict[str, Any]:
    assert profile.nodes is not None
    multinode = profile.engine.definition.launch.multinode
    if multinode is None:
        raise ProfileError(f"nodes: {profile.engine.kind} has no multi-node launch flags known to deployer")
    size = len(profile.nodes)
    gpus = _gpu_count(profile, profile.nodes[0].gpus or profile.engine.gpus, nodes=size)
    extra = [multinode.nnodes, str(size), multinode.node_rank, "$(LWS_WORKER_INDEX)",
             multinode.dist_init_addr, f"$(LWS_LEADER_ADDRESS):{profile.engine.dist_init_port}"]
    if profile.engine.nic:
        export.notes.append(f"engine.nic {profile.engine.nic} names a host interface; pods without hostNetwork "
                            "use eth0, so NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME are not exported")
    templates = {}
    for role in ("leader", "worker"):
        labels = {**_labels(profile, "engine"), ROLE_LABEL: role}
        container = _engine_container(profile, opts, export.secret_name, gpus, probes=role == "leader",
                                      extra_args=extra)
        templates[role] = {"metadata": {"labels": labels}, "spec": _pod_spec(profile, opts, cache, container)}
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": _meta(profile.name, opts, _labels(profile, "engine")),
        "spec": {
            "replicas": profile.replicas if isinstance(profile.replicas, int) else 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": size,
                # NCCL cannot lose a rank: when any pod of the group restarts, the whole group is recreated
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": templates["leader"],
                "workerTemplate": templates["worker"],
            },
        },
    }


def _engine_service(profile: Profile, opts: ExportOptions) -> dict[str, Any]:
    selector = _selector(profile, "engine")
    if profile.nodes is not None:
        selector[ROLE_LABEL] = "leader"  # only rank 0 serves HTTP
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(profile.name, opts, _labels(profile, "engine")),
        "spec": {"selector": selector,
                 "ports": [{"name": "http", "port": profile.engine.port, "targetPort": "http", "protocol": "TCP"}]},
    }


# --- router ------------------------------------------------------------------------------------------


def _router_objects(profile: Profile, opts: ExportOptions) -> list[dict[str, Any]]:
    assert profile.router is not None
    router = profile.router
    name = f"{profile.name}-router"
    labels = _labels(profile, "router")
    selector = [f"{k}={v}" for k, v in _selector(profile, "engine").items()]
    if profile.nodes is not None:
        selector.append(f"{ROLE_LABEL}=leader")
    args = ["launch", "--host", "0.0.0.0", "--port", str(router.port), "--policy", router.policy,
            "--service-discovery", "--selector", *selector,
            "--service-discovery-port", str(profile.engine.port),
            "--service-discovery-namespace", opts.namespace]
    for key, value in router.args.items():
        args += [str(word) for word in flag_tokens(key, value)]
    container = {
        "name": "router",
        "image": opts.router_image or opts.image,
        "command": [opts.python, "-m", "smg"],
        "args": args,
        "ports": [{"name": "http", "containerPort": router.port, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/readiness", "port": "http"}, "periodSeconds": 5,
                           "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http"}, "periodSeconds": 30,
                          "failureThreshold": 5},
    }
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, opts, labels)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(name, opts, labels),
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(name, opts, labels),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": opts.namespace}]},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(name, opts, labels),
         "spec": {"replicas": 1, "selector": {"matchLabels": _selector(profile, "router")},
                  "template": {"metadata": {"labels": labels},
                               "spec": {"serviceAccountName": name, "containers": [container]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, opts, labels),
         "spec": {"selector": _selector(profile, "router"),
                  "ports": [{"name": "http", "port": router.port, "targetPort": "http", "protocol": "TCP"}]}},
    ]
