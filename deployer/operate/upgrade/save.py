"""`deploy upgrade --save FILE`: the user's profile file with the upgrade's changes (deployer.profile.fixed keeps
`extends:` and `${VAR}`s as written): the renamed flags under their new names with their values, the dropped ones
gone (the header and the command's output say so), `engine.version` pinned to the new release and where its python
comes from. Refused when a flag would be lost without a documented reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deployer.errors import ProfileError
from deployer.flag_names import key_option
from deployer.operate.upgrade.plan import UpgradePlan
from deployer.operate.upgrade.release import Release, upgraded_install
from deployer.profile.fixed import save_fixed
from deployer.profile.model import Profile


def save_upgraded(plan: UpgradePlan, original: Profile, dest: Path, python: str | None) -> None:
    """Write the upgraded profile to `dest`; ProfileError (nothing written) when a flag is refused."""
    refused = plan.comparison.refused
    if refused:
        raise ProfileError(f"not saved: {len(refused)} flag(s) the new release refuses and no table explains "
                           f"({', '.join(key_option(c.name) for c in refused)}); fix them first")
    if original.source is None:
        raise ProfileError("--save needs a profile file to start from")
    save_fixed(original.source, original, plan.profile, plan.comparison.reasons(), dest,
               by=f"deploy upgrade --engine {plan.comparison.kind}=={plan.comparison.new.version} --save",
               engine_fields=_fields(plan, original, python))


def _fields(plan: UpgradePlan, original: Profile, python: str | None) -> dict[str, Any]:
    fields: dict[str, Any] = {"version": plan.comparison.new.version}
    if python is not None:
        fields.update(python=python, install=None)
    else:
        release = Release(plan.comparison.kind, str(plan.comparison.new.version))
        fields.update(install=upgraded_install(original, release).model_dump(exclude_defaults=True), python=None)
    return fields
