"""The profile as the exported engine version will read it: the same flag translation `deploy up` does.

With that release's flag table in the local cache (any earlier preflight against it leaves one), the full
check runs (renames, unknown flags, bad choices); without it, the renames table alone translates.
"""

from __future__ import annotations

from deployer.engines.renames import load_renames
from deployer.errors import ProfileError
from deployer.preflight import flags as fl
from deployer.preflight.known import local_caches
from deployer.profile.model import Profile


def for_version(profile: Profile, version: str | None) -> tuple[Profile, list[str]]:
    """(translated profile, warnings); ProfileError when that release cannot take the profile's flags."""
    if version is None:
        return profile, ["engine version unknown (no --engine-version, no version in the image tag, no "
                         "engine.version): flags are exported as written, untranslated"]
    kind = profile.engine.kind
    renames = load_renames(profile.engine.definition.knowledge)
    # where `up`'s preflight caches first, then the user cache dir: the same places `validate` reads
    flagset = next((found for cache in local_caches()
                    if (found := fl.load_cached_flagset(cache, kind, version)) is not None), None)
    report = (fl.check_flags(profile, flagset, renames) if flagset is not None
              else fl.translate_offline(profile, kind, version, renames))
    if report.errors:
        more = f" (+{len(report.errors) - 1} more)" if len(report.errors) > 1 else ""
        raise ProfileError(f"{kind} {version}: {report.errors[0]}{more}")
    return report.profile, report.warnings
