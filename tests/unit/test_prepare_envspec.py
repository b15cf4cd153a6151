"""deployer.prepare.envspec: the managed environment's identity, its place on the target, its record, retention."""

from __future__ import annotations

import pytest

from deployer.prepare.envspec import (ENV_FORMAT, EnvPaths, EnvRecord, EnvSpec, ResolvedDist, canonical_name,
                                      engine_python, env_digest_of_python, envs_in_use, normalise_requirement,
                                      prunable)
from deployer.profile.model import Engine, EngineInstall


def spec(**kw: object) -> EnvSpec:
    data: dict[str, object] = {"packages": ["vllm==0.11.0"]}
    data.update(kw)
    return EnvSpec.from_install(EngineInstall.model_validate(data))


@pytest.mark.parametrize("a,b", [("Torch>=2.8,<3", "torch <3 , >= 2.8"), ("Jinja2", "jinja2"),
                                 ("sglang[All,Router]==0.5.10", "SGLang [router, all] == 0.5.10"),
                                 ("typing_extensions", "typing-extensions"),
                                 ("numpy; python_version<'3.12'", "numpy ;  python_version<'3.12'")])
def test_spellings_of_one_requirement_normalise_alike(a: str, b: str) -> None:
    assert normalise_requirement(a) == normalise_requirement(b)


def test_normalised_forms() -> None:
    assert normalise_requirement("Torch >= 2.8, <3") == "torch<3,>=2.8"
    assert normalise_requirement("My_Pkg @ file:///opt/w/m.whl") == "my-pkg @ file:///opt/w/m.whl"
    assert canonical_name("Foo.Bar__baz") == "foo-bar-baz"
    assert normalise_requirement("vllm==0.11.0") != normalise_requirement("vllm==0.11.1")


def test_digest_is_stable_and_follows_the_content() -> None:
    base = spec(packages=["vllm==0.11.0", "Torch==2.8.0"])
    assert base.digest == spec(packages=["torch == 2.8.0", "vllm==0.11.0"]).digest   # order and spelling
    assert len(base.digest) == 16 and base.format == ENV_FORMAT
    changed = [spec(packages=["vllm==0.11.1", "torch==2.8.0"]), spec(packages=["vllm==0.11.0", "torch==2.8.0"],
                                                                      index_url="https://mirror/simple"),
               spec(packages=["vllm==0.11.0", "torch==2.8.0"], find_links=["/opt/wheels"]),
               spec(packages=["vllm==0.11.0", "torch==2.8.0"], python="python3.12"),
               spec(packages=["vllm==0.11.0", "torch==2.8.0"], extra_index_urls=["https://a", "https://b"])]
    digests = {s.digest for s in changed} | {base.digest}
    assert len(digests) == len(changed) + 1
    two = spec(extra_index_urls=["https://a", "https://b"]).digest
    assert two != spec(extra_index_urls=["https://b", "https://a"]).digest   # index order matters to pip


def test_format_version_changes_the_digest() -> None:
    one = spec()
    assert EnvSpec(**{**one.__dict__, "format": ENV_FORMAT + 1}).digest != one.digest


def test_paths_on_the_target() -> None:
    s = spec()
    paths = EnvPaths.of("/srv/deployer/", s)
    assert paths.dir == f"/srv/deployer/.deployer/envs/{s.digest}"
    assert paths.python == f"/srv/deployer/.deployer/envs/{s.digest}/bin/python"
    assert paths.build_dir("a1") == f"/srv/deployer/.deployer/envs/{s.digest}.build-a1"
    assert paths.link_tmp("a1") == f"/srv/deployer/.deployer/envs/{s.digest}.link-a1"
    assert paths.lock == f"/srv/deployer/.deployer/envs/{s.digest}.lock"
    with pytest.raises(ValueError):
        paths.build_dir("../x")


def test_record_round_trip_and_intact() -> None:
    s = spec(find_links=["/opt/wheels"])
    rec = EnvRecord(spec=s, built_at="2026-12-01T23:50:00Z", tool="uv 0.13.9", python_version="3.11.7",
                    resolved=(ResolvedDist("torch", "2.13.0+cpu", "file:///opt/wheels/t.whl", 191794682),),
                    pip_config=(("find-links", "/opt/wheels"),))
    back = EnvRecord.from_json(rec.to_json())
    assert back.spec == s and back.intact and back.digest == s.digest
    assert back.versions() == {"torch": "2.13.0+cpu"} and back.resolved[0].size == 191794682
    tampered = rec.to_json().replace(s.digest, "0" * 16)
    assert not EnvRecord.from_json(tampered).intact
    with pytest.raises(ValueError):
        EnvRecord.from_json('{"spec": {}}')


def test_envs_in_use_from_run_pythons() -> None:
    a, b = spec().digest, spec(python="python3.12").digest
    pythons = [f"/w/.deployer/envs/{a}/bin/python", "/usr/bin/python3", f"/w/.deployer/envs/{b}/bin/python",
               f"/other/.deployer/envs/{a}/bin/python", "/w/.deployer/envs/notahash/bin/python"]
    assert envs_in_use(pythons, "/w") == {a, b}
    assert env_digest_of_python("/w/.deployer/envs/x/bin/python", "/w") is None


def test_prunable_keeps_what_runs_use_and_builds_in_progress() -> None:
    used, old, building = "a" * 16, "b" * 16, "c" * 16
    entries = [used, f"{used}.build-1", f"{used}.build-0", f"{used}.lock", old, f"{old}.build-7",
               f"{building}.build-9", f"{building}.lock", f"{used}.link-3", "README", "deadbeef.build-1"]
    links = {used: f"{used}.build-1", old: f"{old}.build-7"}
    out = prunable(entries, links, {used}, building=[building])
    assert out == sorted([f"{used}.build-0", f"{used}.link-3", old, f"{old}.build-7"])
    assert f"{used}.build-1" not in out and f"{building}.build-9" not in out and "README" not in out


def test_engine_python_is_the_managed_envs_with_install() -> None:
    managed = Engine.model_validate({"model_path": "/m", "install": {"packages": ["vllm==0.11.0"]}})
    assert managed.install is not None
    digest = EnvSpec.from_install(managed.install).digest
    assert engine_python(managed, "/w") == f"/w/.deployer/envs/{digest}/bin/python"
    assert engine_python(Engine.model_validate({"model_path": "/m", "python": "/v/bin/python"}), "/w") == "/v/bin/python"
