"""`deploy export k8s`: golden manifests for the shipped profiles, offline validation (and that it can fail),
no secret value anywhere, and the same flags `deploy up` would run against the same engine version."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployer.engines import engine_for
from deployer.errors import ProfileError
from deployer.export import check as chk
from deployer.export import files
from deployer.export.k8s import ExportOptions, expectations, export_k8s, secret_values, version_from_image
from deployer.export.translate import for_version
from deployer.preflight.flags import Flag, FlagSet, check_flags
from deployer.engines.renames import load_renames
from deployer.profile.model import Profile
from deployer.profile.loader import load_profile
from deployer.render.bundle import EnvRef, engine_argv

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "k8s"
IMAGE = "lmsysorg/sglang:v0.5.23-cu129"
SECRETS = {"HF_TOKEN": "hf_goldenTOKENvalue42", "SGLANG_API_KEY": "sk-golden-api-key-77"}
SHIPPED = ["qwen36-mtp", "qwen3-8b-fleet", "llama-405b-2node"]


def load(name: str) -> Profile:
    return load_profile(REPO / "profiles" / f"{name}.yaml", environ=dict(SECRETS))


def exported(name: str, **opts: Any) -> tuple[Profile, list[tuple[str, str]]]:
    profile = load(name)
    translated, _ = for_version(profile, version_from_image(IMAGE))
    export = export_k8s(translated, ExportOptions(image=IMAGE, engine_version="0.5.23", **opts))
    return translated, files.texts(export, profile.name, "test")


def docs(texts: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [d for _, text in texts for d in yaml.safe_load_all(text) if d]


def engine_container(objects: list[dict[str, Any]], role: str = "leader") -> dict[str, Any]:
    for obj in objects:
        if obj["kind"] == "Deployment" and obj["metadata"]["labels"]["app.kubernetes.io/component"] == "engine":
            return dict(obj["spec"]["template"]["spec"]["containers"][0])
        if obj["kind"] == "LeaderWorkerSet":
            group = obj["spec"]["leaderWorkerTemplate"]
            return dict(group[f"{role}Template"]["spec"]["containers"][0])
    raise AssertionError("no engine workload")


@pytest.mark.parametrize("name", SHIPPED)
def test_golden_manifests(name: str) -> None:
    """The export of each shipped profile is exactly the reviewed file (UPDATE_GOLDEN=1 rewrites them)."""
    _, texts = exported(name)
    folder = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for filename, text in texts:
            (folder / filename).write_text(text)
    assert sorted(p.name for p in folder.iterdir()) == sorted(f for f, _ in texts)
    for filename, text in texts:
        assert text == (folder / filename).read_text(), f"{name}/{filename} differs from the golden file"


@pytest.mark.parametrize("name", SHIPPED)
def test_every_exported_file_validates(name: str) -> None:
    translated, texts = exported(name)
    assert chk.check(texts, expect=expectations(translated), secret_values=list(SECRETS.values())) == []


@pytest.mark.parametrize("name", SHIPPED)
def test_no_secret_value_anywhere(name: str) -> None:
    _, texts = exported(name)
    for filename, text in texts:
        for value in SECRETS.values():
            assert value not in text, f"{name}/{filename} contains a secret value"


def test_secrets_come_from_a_secret_by_reference() -> None:
    _, texts = exported("qwen3-8b-fleet")
    container = engine_container(docs(texts))
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "qwen3-8b-fleet-secrets", "key": "HF_TOKEN"}
    api_ref = env["DEPLOYER_SECRET_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert api_ref["name"] == "qwen3-8b-fleet-secrets" and "value" not in env["DEPLOYER_SECRET_API_KEY"]
    args = container["args"]
    assert args[args.index("--api-key") + 1] == "$(DEPLOYER_SECRET_API_KEY)"
    assert env["HF_HOME"] == {"name": "HF_HOME", "value": "/workspace/hf"}


def standin_flagset(version: str = "0.5.23") -> FlagSet:
    """The flag table generated from real SGLang 0.5.23's parser (tests/standin), as preflight would see it."""
    table = json.loads((REPO / "tests/standin/sglang/srt/flags_0_5_23.json").read_text())
    no_value = {"store_true", "store_false", "store_const", "deprecated_store_true", "deprecated_store_const",
                "boolean_optional"}
    flags = tuple(Flag(tuple(a["option_strings"]), a["dest"], nargs=a["nargs"],
                       choices=None if a["choices"] is None else tuple(str(c) for c in a["choices"]),
                       takes_value=a["kind"] not in no_value, deprecated=a["kind"].startswith("deprecated"))
                  for a in table["actions"])
    return FlagSet("sglang", version, flags)


@pytest.mark.parametrize("name", SHIPPED)
def test_flags_are_the_ones_up_would_run_on_that_version(name: str) -> None:
    """Offline translation (renames table) gives the argv that preflight's check against the real 0.5.23 flag
    table gives, rendered by `deploy render`; only the listen address differs (0.0.0.0 in a pod)."""
    profile = load(name)
    report = check_flags(profile, standin_flagset(), load_renames(engine_for("sglang").knowledge))
    assert report.ok, report.errors
    pod = report.profile.model_copy(update={"engine": report.profile.engine.model_copy(update={"host": "0.0.0.0"})})
    pod._secret_env, pod._secret_args = profile._secret_env, profile._secret_args
    want = [f"$({w.name})" if isinstance(w, EnvRef) else w for w in engine_argv(pod)][3:]
    container = engine_container(docs(exported(name)[1]))
    got = container["args"][:len(want)]
    assert got == want
    assert container["command"][1:] == ["-m", "sglang.launch_server"]


def test_renamed_flag_is_written_for_the_image_version() -> None:
    old = load("qwen36-mtp")
    new_args = engine_container(docs(exported("qwen36-mtp")[1]))["args"]
    assert "mamba_scheduler_strategy" in old.engine.args
    assert "--mamba-radix-cache-strategy" in new_args and "--mamba-scheduler-strategy" not in new_args
    seed, _ = for_version(old, "0.5.10")  # an image of the seed era keeps the old name
    assert "mamba_scheduler_strategy" in seed.engine.args


def test_probes_cover_startup_and_sit_on_the_leader_only() -> None:
    _, texts = exported("llama-405b-2node")
    objects = docs(texts)
    leader, worker = engine_container(objects, "leader"), engine_container(objects, "worker")
    startup = leader["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    assert startup["failureThreshold"] * startup["periodSeconds"] >= 3600
    assert leader["readinessProbe"]["httpGet"]["path"] == "/health" and "livenessProbe" in leader
    assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(worker)
    for c in (leader, worker):
        args = c["args"]
        assert args[args.index("--nnodes") + 1] == "2"
        assert args[args.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
        assert args[args.index("--dist-init-addr") + 1] == "$(LWS_LEADER_ADDRESS):20000"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    lws = next(o for o in objects if o["kind"] == "LeaderWorkerSet")
    assert lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    service = next(o for o in objects if o["kind"] == "Service")
    assert service["spec"]["selector"]["deployer.dev/role"] == "leader"


def test_router_discovers_the_engine_pods_with_rbac() -> None:
    _, texts = exported("qwen3-8b-fleet")
    objects = docs(texts)
    kinds = [o["kind"] for o in objects]
    assert kinds == ["Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "Deployment", "Service"]
    engine = objects[0]
    assert engine["spec"]["replicas"] == 2 and engine["spec"]["strategy"] == {"type": "Recreate"}
    router = objects[5]["spec"]["template"]["spec"]
    args = router["containers"][0]["args"]
    assert args[:1] == ["launch"] and "--service-discovery" in args
    labels = engine["spec"]["template"]["metadata"]["labels"]
    selector = args[args.index("--selector") + 1:args.index("--service-discovery-port")]
    assert all(labels[k] == v for k, v in (s.split("=", 1) for s in selector))
    assert args[args.index("--policy") + 1] == "cache_aware"
    assert router["serviceAccountName"] == objects[2]["metadata"]["name"]
    assert objects[3]["rules"][0]["verbs"] == ["get", "list", "watch"]


# --- the checks can fail ------------------------------------------------------------------------------


def _mutated(name: str, change: Any) -> list[str]:
    translated, texts = exported(name)
    objects = docs(texts)
    change(objects)
    text = yaml.safe_dump_all(copy.deepcopy(objects), sort_keys=False)
    return [p.message for p in chk.check([("x.yaml", text)], expect=expectations(translated),
                                         secret_values=list(SECRETS.values()))]


def test_check_rejects_an_unknown_field_in_a_builtin_kind() -> None:
    problems = _mutated("qwen36-mtp", lambda o: o[0]["spec"].__setitem__("replica", 2))
    assert any("Kubernetes 1.33 schema" in p and "replica" in p for p in problems), problems


def test_check_rejects_an_unknown_field_in_a_leaderworkerset() -> None:
    problems = _mutated("llama-405b-2node",
                        lambda o: o[0]["spec"]["leaderWorkerTemplate"].__setitem__("sizee", 2))
    assert any("LeaderWorkerSet schema" in p and "sizee" in p for p in problems), problems


def test_check_rejects_a_bad_restart_policy() -> None:
    problems = _mutated("llama-405b-2node", lambda o: o[0]["spec"]["leaderWorkerTemplate"].__setitem__(
        "restartPolicy", "Always"))
    assert any("restartPolicy" in p for p in problems), problems


def test_check_rejects_missing_probes_and_probes_on_workers() -> None:
    def change(objects: list[dict[str, Any]]) -> None:
        group = objects[0]["spec"]["leaderWorkerTemplate"]
        leader = group["leaderTemplate"]["spec"]["containers"][0]
        group["workerTemplate"]["spec"]["containers"][0]["readinessProbe"] = leader.pop("readinessProbe")
    problems = _mutated("llama-405b-2node", change)
    assert "serving container engine: no readinessProbe" in problems
    assert any("readinessProbe on a worker rank" in p for p in problems), problems


def test_check_rejects_a_short_startup_probe_and_wrong_gpus() -> None:
    def change(objects: list[dict[str, Any]]) -> None:
        c = objects[0]["spec"]["template"]["spec"]["containers"][0]
        c["startupProbe"]["failureThreshold"] = 3
        c["resources"]["limits"]["nvidia.com/gpu"] = 2
    problems = _mutated("qwen36-mtp", change)
    assert any("startupProbe covers 30s" in p for p in problems), problems
    assert any("nvidia.com/gpu limit is 2, the profile needs 1" in p for p in problems), problems


def test_check_rejects_secrets_inline_and_merge_markers() -> None:
    def change(objects: list[dict[str, Any]]) -> None:
        env = objects[0]["spec"]["template"]["spec"]["containers"][0]["env"]
        entry = next(e for e in env if e["name"] == "HF_TOKEN")
        entry.pop("valueFrom")
        entry["value"] = SECRETS["HF_TOKEN"]
    problems = _mutated("qwen36-mtp", change)
    assert "contains a secret value" in problems
    assert any("env HF_TOKEN is a secret written inline" in p for p in problems), problems
    _, texts = exported("qwen36-mtp")
    marked = [(f, "<<<<<<< HEAD\n" + t) for f, t in texts]
    assert any("merge conflict marker" in p.message for p in chk.check(marked))


# --- profiles and the CLI -----------------------------------------------------------------------------


def test_image_tag_gives_the_engine_version() -> None:
    assert version_from_image("lmsysorg/sglang:v0.5.23-cu129") == "0.5.23"
    assert version_from_image("registry:5000/sglang:0.5.14rc1") == "0.5.14rc1"
    assert version_from_image("lmsysorg/sglang:latest") is None


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


BASE = {"name": "p", "engine": {"model_path": "m"}}


@pytest.mark.parametrize("extra,message", [
    ({"target": {"host": "a"}, "replicas": [{"host": "b"}]}, "target: not allowed with replicas"),
    ({"replicas": [{"host": "a"}], "nodes": [{"host": "b"}, {"host": "c"}]}, "replicas and nodes exclude"),
    ({"target": {"host": "a"}, "router": {"port": 8000}}, "router needs replicas"),
    ({"replicas": [{"host": "a"}], "router": {"policy": "fastest"}}, "not one of random, round_robin"),
    ({"nodes": [{"host": "a"}]}, "nodes"),
])
def test_fleet_profile_errors_are_one_line(tmp_path: Path, extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfileError) as err:
        load_profile(_write(tmp_path, {**BASE, **extra}))
    assert message in str(err.value) and "\n" not in str(err.value)


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "deployer.cli", *argv], capture_output=True, text=True,
                          timeout=60, env=full, cwd=str(REPO))


def test_cli_writes_checks_and_prints_the_secret_command(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    run = _cli("export", "k8s", "profiles/qwen3-8b-fleet.yaml", "--image", IMAGE, "-o", str(out), "--check",
               env=SECRETS)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in out.iterdir()) == ["engine.yaml", "router.yaml"]
    assert "kubectl -n default create secret generic qwen3-8b-fleet-secrets" in run.stderr
    assert "checked 7 objects" in run.stderr
    for value in SECRETS.values():
        assert value not in run.stderr + run.stdout
        assert all(value not in p.read_text() for p in out.iterdir())


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    no_image = _cli("export", "k8s", "profiles/qwen36-mtp.yaml", env=SECRETS)
    assert no_image.returncode == 2 and no_image.stderr.count("\n") == 1 and "--image" in no_image.stderr
    bad_cache = _cli("export", "k8s", "profiles/qwen36-mtp.yaml", "--image", IMAGE, "--model-cache", "nfs:/x",
                     env=SECRETS)
    assert bad_cache.returncode == 2 and "--model-cache" in bad_cache.stderr
    assert "Traceback" not in no_image.stderr + bad_cache.stderr


def test_up_of_a_fleet_profile_whose_hosts_do_not_resolve_names_each_one(tmp_path: Path) -> None:
    run = _cli("up", "profiles/qwen3-8b-fleet.yaml", env={**SECRETS, "DEPLOYER_HOME": str(tmp_path)})
    assert run.returncode == 3, run.stderr                       # every host unreachable: the connection code
    assert "r0@gpu-a: " in run.stderr and "r1@gpu-b: " in run.stderr and "Traceback" not in run.stderr


def test_cli_needs_no_secret_value_in_the_local_environment(tmp_path: Path) -> None:
    """The manifests only reference the Secret (secretKeyRef): HF_TOKEN need not be exported to write them."""
    run = _cli("export", "k8s", "profiles/qwen36-mtp.yaml", "--image", IMAGE, "--check")
    assert run.returncode == 0, run.stderr
    env = {e["name"]: e for e in engine_container(docs([("engine.yaml", run.stdout)]))["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "HF_TOKEN"
    assert "${HF_TOKEN}" not in run.stdout and "create secret generic qwen36-mtp-secrets" in run.stderr


def test_cli_still_needs_a_variable_it_would_write_into_a_manifest(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"name": "p", "target": {"host": "gpu-box"},
                                       "engine": {"kind": "sglang", "model_path": "${MODEL_DIR}/qwen"}}))
    run = _cli("export", "k8s", str(profile), "--image", IMAGE)
    assert run.returncode == 2 and "${MODEL_DIR} is not set" in run.stderr and "Traceback" not in run.stderr


def test_export_reads_the_flag_table_where_ups_preflight_cached_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Without DEPLOYER_HOME, `up` caches the target's flag table under the user data dir's cache/; export finds
    it there (the full check, which refuses a flag that release does not have) as `validate` does, not only in
    the user cache dir."""
    from deployer.local.history import home
    from deployer.preflight.flags import save_flagset

    monkeypatch.delenv("DEPLOYER_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    profile = load("qwen36-mtp")
    odd = profile.model_copy(update={"engine": profile.engine.model_copy(
        update={"args": {**profile.engine.args, "zzq_totally_unknown": 7}})})
    odd._secret_env, odd._secret_args = profile._secret_env, profile._secret_args
    assert for_version(odd, "0.5.23")[0].engine.args["zzq_totally_unknown"] == 7  # no table: renames alone
    save_flagset(home() / "cache", standin_flagset())
    with pytest.raises(ProfileError, match="zzq"):
        for_version(odd, "0.5.23")
