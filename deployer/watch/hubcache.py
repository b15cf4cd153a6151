"""The Hugging Face cache on the target as a sign of download progress when the engine's log says nothing.

huggingface_hub draws its per-file bars with tqdm's `disable=None`, which turns them off when stderr is not a
terminal; under the supervisor the engine's stderr is its log file, so a real weight download may print nothing
for many minutes. Its bytes still land in the cache: `<hub cache>/models--ORG--NAME/blobs/<etag>.incomplete`
until each file is complete (with hf_transfer too). When the log has been quiet for a while, the watch asks for
the size of that folder: bytes that grew are progress, shown as a download.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from deployer.remote.base import Remote

REPO_ID_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
DEFAULT_HUB = '"${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}"'


@dataclass(frozen=True)
class HubCache:
    """One model's folder in the target's hub cache."""

    repo_id: str
    hub: str                  # a shell word for the hub cache directory

    @property
    def folder_name(self) -> str:
        return "models--" + self.repo_id.replace("/", "--")

    def command(self) -> str:
        blobs = f"{self.hub}/{shlex.quote(self.folder_name)}/blobs"
        return f"find {blobs} -type f -printf '%s\\n' 2>/dev/null | awk '{{s+=$1}} END {{printf \"%.0f\\n\", s}}'"

    def size(self, remote: Remote) -> int | None:
        """Bytes in the model's blobs (complete and .incomplete); None when the target could not say."""
        result = remote.run(self.command(), timeout=20, check=False)
        text = result.stdout.strip()
        return int(text) if result.ok and text.isdigit() else None


def hub_cache(model_path: str, env: Mapping[str, str]) -> HubCache | None:
    """The cache folder a model id downloads into (None for a local path); HF_HUB_CACHE / HF_HOME from the
    profile's env when set there, else as the target's environment has them."""
    if not REPO_ID_RE.match(model_path):
        return None
    if env.get("HF_HUB_CACHE") and "$" not in env["HF_HUB_CACHE"]:
        hub = _path_word(env["HF_HUB_CACHE"])
    elif env.get("HF_HOME") and "$" not in env["HF_HOME"]:
        hub = _path_word(env["HF_HOME"].rstrip("/") + "/hub")
    else:
        hub = DEFAULT_HUB
    return HubCache(model_path, hub)


def _path_word(path: str) -> str:
    return '"$HOME"/' + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)
