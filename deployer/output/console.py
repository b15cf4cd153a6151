"""Output for people (rich: live phase, elapsed, last log line; reports) and for machines (NDJSON events, JSON).

Progress goes to stderr so stdout stays clean for `--json` and for piping. Lines are never wrapped (a CI log or a
pipe is not 80 columns wide), and engine text is printed without its control sequences. rich is imported where it draws, so
`--json` runs and `deploy --help` never load it.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from deployer.logtext import clip, printable
from deployer.events import (
    AttemptStarted, BecameReady, Changed, Diagnosed, Download, Drift, EngineExited, EngineHung, Event, FollowerExited, Info, Override,
    PhaseEntered, PortTakenSeen, Problem, Progressed, Restored, RollingBack, StartupTimedOut, Suggestion,
    SupervisorLost, Warn,
)

DOWNLOAD_NOTE_EVERY_S = 30.0   # without a terminal: a download's progress line at most this often


class JsonEvents:
    """`--json`: one JSON object per event on stdout, flushed at once."""

    def __call__(self, event: Event) -> None:
        sys.stdout.write(json.dumps(event.to_json(), default=str) + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        pass


class LiveProgress:
    """For people: a live status line (phase, elapsed, last log line) plus permanent lines for what matters."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.live: Any = None
        self.phase = "connecting"
        self.line = ""
        self.started = time.monotonic()
        self.download_noted: tuple[str, float, bool] = ("", 0.0, False)  # file, when, done: last download line
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self._render(), console=self.console, refresh_per_second=8, transient=True)
            self.live.start()

    def _render(self) -> Any:
        from rich.text import Text

        elapsed = time.monotonic() - self.started
        text = Text.assemble((f"{self.phase:<22}", "bold cyan"), (f"{elapsed:7.1f}s  ", "dim"),
                             (self.line[-110:], "dim"))
        return text

    def say(self, markup: str) -> None:
        self.console.print(markup)

    def __call__(self, event: Event) -> None:
        self._line(event)
        if self.live is not None:
            self.live.update(self._render())

    def _line(self, event: Event) -> None:  # noqa: C901 (one branch per event class, each a line)
        if isinstance(event, (PhaseEntered, Progressed)):
            self.phase, self.line = event.phase, printable(event.line)
            if isinstance(event, Progressed) and event.download is not None and event.download.file is not None:
                self._download(event, event.download)
            if isinstance(event, PhaseEntered):
                self.say(f"  [cyan]{event.phase:<22}[/] [dim]{event.elapsed:7.1f}s  {_esc(event.line)[:110]}[/]")
        elif isinstance(event, AttemptStarted):
            self.started = time.monotonic()
            self.phase = "starting"
            self.say(f"[bold]attempt {event.attempt}[/] (content {event.content_hash[:12]})")
        elif isinstance(event, BecameReady):
            self.say(f"  [bold green]ready[/] after {event.elapsed:.1f}s")
        elif isinstance(event, EngineExited):
            self.say(f"  [bold red]engine died[/] ({event.how()}) after {event.elapsed:.1f}s")
        elif isinstance(event, FollowerExited):
            self.say(f"  [bold red]engine died[/] ({_esc(event.message)})")
        elif isinstance(event, (EngineHung, StartupTimedOut)):
            self.say(f"  [bold red]{event.kind}[/] after {event.elapsed:.1f}s")
        elif isinstance(event, Diagnosed):
            self._diagnosis(event)
        elif isinstance(event, Changed):
            when = " before launch" if event.before_launch else ""
            self.say(f"  [bold yellow]changing{when}[/]: {_esc(event.text())}")
        elif isinstance(event, (Warn, Drift, Override, Suggestion)):
            self.say(f"  [yellow]{event.kind}[/]: {_esc(event.message)}")
        elif isinstance(event, Problem):
            self.say(f"  [bold red]problem[/]: {_esc(event.message)}")
        elif isinstance(event, (RollingBack, Restored)):
            self.say(f"  [bold yellow]{_esc(event.message)}[/]")
        elif isinstance(event, SupervisorLost):
            self.say(f"  [bold red]supervisor lost[/]: {_esc(event.message)}")
        elif isinstance(event, PortTakenSeen):
            self.say(f"  [bold red]port {event.port} taken[/] by {_esc(', '.join(event.holders))}")
        elif isinstance(event, Info):
            self.say(f"  {_esc(event.message)}")

    def _download(self, event: Progressed, download: Download) -> None:
        """The live line shows the download; a log without a terminal gets a line per file and every 30 s."""
        self.line = download.text or self.line
        if self.live is not None:
            return
        file, now, done = str(download.file), time.monotonic(), download.percent == 100
        last_file, last_at, last_done = self.download_noted
        if file != last_file or now - last_at >= DOWNLOAD_NOTE_EVERY_S or (done and not last_done):
            self.download_noted = (file, now, done)
            self.say(f"  [cyan]{'downloading':<22}[/] [dim]{event.elapsed:7.1f}s  {_esc(self.line)}[/]")

    def _diagnosis(self, event: Diagnosed) -> None:
        self.say(f"  [bold]diagnosis[/] [magenta]{event.signature or 'unknown'}[/]: {_esc(event.summary)}")
        for line in event.evidence[:3]:
            self.say(f"    [dim]> {_esc(line)[:160]}[/]")
        if event.hint:
            self.say(f"    hint: {_esc(event.hint)}")

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def _esc(text: Any) -> str:
    from rich.markup import escape

    return escape(clip(printable(str(text)), 2000))


def _change_text(data: dict[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in (data.get("args") or {}).items()]
    parts += [f"env {k}={v}" for k, v in (data.get("env") or {}).items()]
    return ", ".join(parts)


def print_up_report(report: Any, progress: LiveProgress) -> None:
    """The final report of `up`: every attempt, its diagnosis and the change made."""
    if report.status == "already-running":
        progress.say(f"[green]{report.name}[/] is already running this version ({str(report.content_hash)[:12]})"
                     f" on {report.host}: nothing to do")
        return
    for note in report.before_launch:
        progress.say(f"before launch: [yellow]{note.diagnosis.signature}[/]: {_esc(note.diagnosis.summary)}")
        progress.say(f"  changed: {_esc(note.change.reason)}")
    for item in report.attempts:
        colour = "green" if item.outcome == "ready" else "red"
        progress.say(f"attempt {item.attempt}: [{colour}]{item.outcome}[/] ({_esc(item.detail)})")
        diagnosis = item.diagnosis_json()
        if diagnosis:
            progress.say(f"  diagnosis: {diagnosis['signature'] or 'unknown'}: {_esc(diagnosis['summary'])}")
            for line in diagnosis["evidence"][:2]:
                progress.say(f"  evidence: [dim]{_esc(line)[:200]}[/]")
        if item.change:
            progress.say(f"  changed: {_esc(item.change.reason or _change_text(item.change.to_json()))}")
    if report.status == "ready":
        progress.say(f"[bold green]{report.name} is ready[/] on {report.host} ({report.run_dir})")
        if getattr(report, "restart", None):
            progress.say(f"  {_esc(report.restart['text'])}")
    restored = report.restored
    if restored:
        back = f"{restored.content_hash[:12]} ({restored.run_id})"
        if restored.serving:
            progress.say(f"[bold yellow]brought back the previous version {back}[/]: it is serving again")
        else:
            progress.say(f"[bold red]could not bring back the previous version {back}[/]: "
                         f"{_esc(restored.detail or '')}")
    for line in report.drift:
        progress.say(f"[yellow]drift[/]: {_esc(line)}")
    if report.saved_fixed:
        progress.say(f"wrote the profile that worked to {report.saved_fixed}")
