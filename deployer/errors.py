"""The one error tree of deployer; the CLI maps each class to one clear line and an exit code.

    DeployError                       anything deployer expects can go wrong (exit 1 unless noted)
    +-- ProfileError                  bad profile or override: file, line, field (exit 2)
    |   +-- ProfileProblems           several at once, each a ProfileError (validate lists them all)
    +-- RenderError                   template missing or failing to render (exit 2)
    +-- RemoteError                   anything at or beyond the SSH seam (exit 3)
    |   +-- ConnectFailed             cannot reach the host (DNS, refused, timeout)
    |   +-- AuthFailed                reached, but no key was accepted
    |   +-- HostKeyUnknown            host not in known_hosts (use --trust-new-host)
    |   +-- HostKeyMismatch           host key changed: possible man-in-the-middle
    |   +-- CommandFailed             a remote command exited non-zero (carries the Result)
    |   +-- TransferFailed            an upload/download failed or its hash did not match
    +-- TargetError                   the target is not fit for this deployment (exit 4)
    |   +-- Locked                    another operation holds the deployment lock
    |   +-- LockLost                  this operation lost its lock part way and stopped changing the target
    |   +-- PortBusy                  the engine port is already taken on the target
    |   +-- PreflightFailed           preflight found problems that would fail the launch
    |   +-- RecordUnreadable          a record the target keeps (env file, state) cannot be read
    |   +-- DiskFull                  the target's disk under the workdir filled up part way
    |   +-- UnsafeTarget              a directory or link on the deployment's path another user controls
    +-- LaunchFailed                  the engine did not become ready (exit 5); carries the Outcome
    |   +-- RetriesExhausted          every attempt failed; carries the attempt reports
    +-- Unhealthy                     engine up but failing health or smoke requests (exit 6)
    +-- NotFound                      no such deployment / run on the target (exit 7)
    +-- PartlyFailed                  a fleet operation failed on some hosts, worked on others (exit 9)
"""

from __future__ import annotations

from typing import Any


class DeployError(Exception):
    """Base of every expected failure. `message` is the one line shown to the user."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class ProfileError(DeployError):
    """A profile that cannot be loaded or validated; says where."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        where = file or "<profile>"
        if line is not None:
            where += f":{line}"
        prefix = f"{where}: " if file or line is not None else ""
        field_part = f"{field}: " if field else ""
        super().__init__(f"{prefix}{field_part}{message}", hint=hint)
        self.file = file
        self.line = line
        self.field = field


class ProfileProblems(ProfileError):
    """Every problem of one profile, each a ProfileError with its own file:line: one line each, none hidden."""

    def __init__(self, problems: list[ProfileError], *, file: str | None = None) -> None:
        lines = "".join(f"\n  {p}" for p in problems)
        super().__init__(f"{len(problems)} problems:{lines}", file=file)
        self.problems = problems


class RenderError(DeployError):
    exit_code = 2


class RemoteError(DeployError):
    exit_code = 3

    def __init__(self, message: str, *, host: str | None = None, hint: str | None = None) -> None:
        super().__init__(f"{host}: {message}" if host else message, hint=hint)
        self.host = host


class ConnectFailed(RemoteError):
    pass


class AuthFailed(RemoteError):
    pass


class HostKeyUnknown(RemoteError):
    pass


class HostKeyMismatch(RemoteError):
    pass


class TransferFailed(RemoteError):
    pass


class CommandFailed(RemoteError):
    """A remote command exited non-zero; carries the command result and its last output lines."""

    def __init__(self, result: Any, *, host: str | None = None, what: str | None = None) -> None:
        tail = (result.stderr or result.stdout or "").strip().splitlines()[-5:]
        detail = " | ".join(tail) if tail else "no output"
        label = what or f"command {result.command!r}"
        super().__init__(f"{label} failed (exit {result.exit_code}): {detail}", host=host)
        self.result = result
        self.tail = tail


class TargetError(DeployError):
    exit_code = 4


class Locked(TargetError):
    pass


class LockLost(TargetError):
    """The lease could not be renewed (link down too long) or was broken/taken over: stop touching the target."""


class PortBusy(TargetError):
    pass


class RecordUnreadable(TargetError):
    """The supervisor's own parsers (SuperviseError, outside this tree: it runs on the target) are translated
    into this one where the deployer calls them."""


class DiskFull(TargetError):
    """No space left under the workdir on the target: what failed there (an engine and its supervisor that could
    not write, a command that could not write a record) failed for that reason, whatever it said; `outcome`: the
    report of the operation it ended, as LaunchFailed's."""

    outcome: Any = None


class UnsafeTarget(TargetError):
    """The deployment dir (or a directory or link on its path) is one another user controls: nothing is written
    there, and nothing there is run or believed."""


class PreflightFailed(TargetError):
    def __init__(self, problems: list[str], *, hint: str | None = None) -> None:
        first = problems[0] if problems else "preflight failed"
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"preflight: {first}{more}", hint=hint)
        self.problems = problems


class LaunchFailed(DeployError):
    exit_code = 5

    def __init__(self, message: str, *, outcome: Any = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.outcome = outcome


class RetriesExhausted(LaunchFailed):
    def __init__(self, message: str, *, attempts: list[Any] | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts or []


class Unhealthy(DeployError):
    exit_code = 6


class NotFound(DeployError):
    exit_code = 7


class PartlyFailed(DeployError):
    """A fleet operation that worked on some hosts and failed on others (exit 9); carries the fleet report."""

    exit_code = 9

    def __init__(self, message: str, *, outcome: Any = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.outcome = outcome
