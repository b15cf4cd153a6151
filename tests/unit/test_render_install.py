"""A profile with `engine.install` renders the launch from its managed environment's python (what `up` launches;
`deploy render` shows the same)."""

from __future__ import annotations

from deployer.prepare.envspec import EnvSpec
from deployer.profile.model import Profile
from deployer.render.bundle import render


def test_render_launches_from_the_managed_environment() -> None:
    prof = Profile.model_validate({"name": "p", "target": {"host": "gpu-box", "workdir": "/srv/deploy"},
                                   "engine": {"install": {"packages": ["sglang==0.5.23"]}, "model_path": "m"}})
    assert prof.engine.install is not None
    digest = EnvSpec.from_install(prof.engine.install).digest
    bundle = render(prof)
    assert bundle.argv[0] == f"/srv/deploy/.deployer/envs/{digest}/bin/python"
    assert f"/srv/deploy/.deployer/envs/{digest}/bin/python" in bundle.script
