"""What `deploy prepare` did on each host (or fleet member, or node): the managed environment built or reused, the
weights fetched (or found on disk), or the one line that stopped it. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deployer.errors import DeployError, PartlyFailed
from deployer.prepare.environment import EnvPrepared
from deployer.prepare.pushed import WeightsDone


@dataclass(frozen=True)
class HostPrepared:
    """One host's part: `label` names it (the host, `r0 gpu-a`, `node 1 (gpu-b)`); `environment` None without
    `engine.install`; `weights` None without `engine.weights`; `error` what stopped it."""

    label: str
    environment: EnvPrepared | None = None
    error: DeployError | None = None
    weights: WeightsDone | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.label, "ok": self.error is None}
        if self.environment is not None:
            out.update(self.environment.to_json())
        if self.weights is not None:
            out["weights"] = self.weights.to_json()
        if self.error is not None:
            out.update(error=str(self.error), exit_code=self.error.exit_code)
        return out

    def lines(self) -> list[str]:
        if self.error is not None:
            return [f"{self.label}: {self.error}"]
        lines = self.environment.lines() if self.environment is not None else \
            ["nothing to install (no engine.install: the engine runs from engine.python)"]
        if self.weights is not None:
            lines.append(self.weights.describe())
        return [f"{self.label}: {line}" if i == 0 else line for i, line in enumerate(lines)]


@dataclass
class PrepareReport:
    name: str
    hosts: list[HostPrepared] = field(default_factory=list)

    @property
    def failed(self) -> list[HostPrepared]:
        return [h for h in self.hosts if h.error is not None]

    @property
    def status(self) -> str:
        return "prepared" if not self.failed else ("failed" if len(self.failed) == len(self.hosts) else "partly")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "environments": [h.to_json() for h in self.hosts]}

    def text(self) -> str:
        head = f"{self.name}: {self.status}"
        return "\n".join([head] + ["  " + line for h in self.hosts for line in h.lines()]) + "\n"

    @property
    def error(self) -> DeployError | None:
        """What the command raises after showing the report: a host's own error when it is the only host (its
        exit code), PartlyFailed when some hosts failed and others did not."""
        failed = self.failed
        if not failed:
            return None
        if len(self.hosts) == 1 or len(failed) == len(self.hosts) and len({type(h.error) for h in failed}) == 1:
            assert failed[0].error is not None
            return failed[0].error
        return PartlyFailed(f"{self.name}: prepared on {len(self.hosts) - len(failed)} of {len(self.hosts)} hosts; "
                            + "; ".join(f"{h.label}: {h.error}" for h in failed))
