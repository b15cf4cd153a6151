"""Output for people (rich: live phase, elapsed, last log line; reports) and for machines (NDJSON events, JSON).

Progress goes to stderr so stdout stays clean for `--json` and for piping. Lines quoting engine text (phases,
evidence) are fitted to the terminal's width, read again for every line (`COLUMNS` wins; 80 when stderr is no
terminal), their beginning kept and the end cut with an ellipsis; deployer's own messages are never cut or wrapped
by us (a download line: only on a terminal, where it must fit); engine text is printed without its control
sequences. rich is imported where it draws, so
`--json` runs and `deploy --help` never load it.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from deployer.logtext import clip, printable
from deployer.output.edge import styled_stderr, terminal_width
from deployer.events import (
    AttemptStarted, BecameReady, Changed, Diagnosed, Download, Drift, EngineExited, EngineHung, Event, FollowerExited, Info, Override,
    PhaseEntered, PortTakenSeen, Problem, Progressed, Restored, RollingBack, StartPredicted, StartSlow,
    SmokePhase, StartupTimedOut, Suggestion, SupervisorLost, Warn,
)

DOWNLOAD_NOTE_EVERY_S = 30.0   # without a terminal: a download's progress line at most this often
ELLIPSIS = "\u2026"


class JsonEvents:
    """`--json`: one JSON object per event on stdout, flushed at once."""

    def __call__(self, event: Event) -> None:
        sys.stdout.write(json.dumps(event.to_json(), default=str) + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        pass


def fit(text: str, width: int) -> str:
    """`text` in at most `width` cells: its beginning kept, the end cut with an ellipsis."""
    from rich.cells import cell_len, set_cell_size

    if cell_len(text) <= width:
        return text
    return set_cell_size(text, max(width - 1, 0)) + ELLIPSIS if width > 0 else ""


class LiveProgress:
    """For people: a live status line (phase, its own time, last log line) plus permanent lines for what matters.

    A phase's permanent line is printed when the phase ends, with that phase's own duration; the end of an
    attempt (ready, died, hung) gives the total. Quoted log text is fitted to the terminal (its beginning kept);
    deployer's own messages are never cut.
    """

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(file=styled_stderr(), highlight=False, soft_wrap=True)  # draws: not stripped (edge.py)
        self.live: Any = None
        self.phase = "connecting"
        self.line = ""
        self.started = time.monotonic()                     # this phase, on our clock (the live line)
        self.opened: tuple[str, float, str] | None = None   # the phase now running: name, engine elapsed, text
        self.download_text = ""                             # the phase's last download line, if any
        self.last_note: tuple[str, float] = ("", 0.0)       # without a terminal: the last download line, when
        self.download_noted: tuple[str, float, bool] = ("", 0.0, False)  # file, when, done: last download line
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self._render(), console=self.console, refresh_per_second=8, transient=True,
                             get_renderable=self._render)
            self.live.start()

    def _render(self) -> Any:
        from rich.text import Text

        width = terminal_width(self.console.file)
        head = f"{self.phase:<22} {time.monotonic() - self.started:7.1f}s  "
        text = Text.assemble((head[:22], "bold cyan"), (head[22:], "dim"),
                             (fit(printable(self.line), width - 1 - len(head)), "dim"), no_wrap=True, overflow="ellipsis")
        return text

    def say(self, markup: str) -> None:
        self.console.print(printable(markup))

    def _quote(self, phase: str, seconds: float, text: str, ours: bool = False) -> None:
        """A permanent line: phase, seconds, and log text fitted to the terminal's width. `ours` (a download line
        deployer wrote: file, percent, bytes, rate) is fitted only on a terminal: a CI log keeps all of it."""
        head = f"  {phase:<22} {seconds:7.1f}s  "
        line = printable(text)
        if not ours or self.live is not None:
            line = fit(line, terminal_width(self.console.file) - len(head))
        self.say(f"  [cyan]{_esc(phase):<22}[/] [dim]{seconds:7.1f}s  {_esc(line)}[/]")

    def __call__(self, event: Event) -> None:
        self._line(event)
        if self.live is not None:
            self.live.update(self._render())

    def _line(self, event: Event) -> None:  # noqa: C901 (one branch per event class, each a line)
        if isinstance(event, (PhaseEntered, Progressed)):
            if isinstance(event, PhaseEntered):
                self._close_phase(event.elapsed)
                self.opened, self.download_text = (event.phase, event.elapsed, printable(event.line)), ""
                self.started = time.monotonic()
            self.phase, self.line = event.phase, printable(event.line)
            if isinstance(event, Progressed) and event.download is not None and event.download.file is not None:
                self._download(event, event.download)
        elif isinstance(event, AttemptStarted):
            self.opened, self.started = None, time.monotonic()
            self.phase = "starting"
            self.say(f"[bold]attempt {event.attempt}[/] (content {event.content_hash[:12]})")
        elif isinstance(event, BecameReady):
            self._close_phase(event.elapsed)
            self.say(f"  [bold green]ready[/] after {event.elapsed:.1f}s (total)")
        elif isinstance(event, EngineExited):
            self._close_phase(event.elapsed)
            self.say(f"  [bold red]engine died[/] ({event.how()}) after {event.elapsed:.1f}s (total)")
        elif isinstance(event, FollowerExited):
            self.say(f"  [bold red]engine died[/] ({_esc(event.message)})")
        elif isinstance(event, (EngineHung, StartupTimedOut)):
            self._close_phase(event.elapsed)
            self.say(f"  [bold red]{event.kind}[/] after {event.elapsed:.1f}s (total)")
        elif isinstance(event, StartPredicted):
            self.say(f"  [cyan]predicted[/]: {_esc(event.summary)}")
        elif isinstance(event, StartSlow):
            self.say(f"  [bold yellow]slow start[/]: {_esc(event.message)}")
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

    def _close_phase(self, elapsed: float) -> None:
        """The running phase's permanent line, with its own duration (a download phase: its last line)."""
        if self.opened is None:
            return
        phase, began, text = self.opened
        self.opened = None
        text = self.download_text or text
        if self.live is None and self.last_note[0] == text and elapsed - self.last_note[1] < 1.0:
            return  # without a terminal the last download line said just this, at this phase's end
        self._quote(phase, max(elapsed - began, 0.0), text, ours=bool(self.download_text))

    def _download(self, event: Progressed, download: Download) -> None:
        """The live line shows the download; a log without a terminal gets a line per file and every 30 s."""
        self.line = download.text or self.line
        self.download_text = printable(self.line)
        if self.live is not None:
            return
        file, now, done = str(download.file), time.monotonic(), download.percent == 100
        last_file, last_at, last_done = self.download_noted
        if file != last_file or now - last_at >= DOWNLOAD_NOTE_EVERY_S or (done and not last_done):
            self.download_noted = (file, now, done)
            if self.download_text != self.last_note[0]:  # the hub cache's line repeats its phase's first line
                self.last_note = (self.download_text, event.elapsed)
                began = self.opened[1] if self.opened else 0.0
                verb = "sending" if download.source == "push" else "downloading"   # a push goes the other way
                self._quote(verb, max(event.elapsed - began, 0.0), self.download_text, ours=True)

    def _diagnosis(self, event: Diagnosed) -> None:
        self.say(f"  [bold]diagnosis[/] [magenta]{event.signature or 'unknown'}[/]: {_esc(event.summary)}")
        width = terminal_width(self.console.file)
        for line in event.evidence[:3]:
            self.say(f"    [dim]> {_esc(fit(printable(line), width - 6))}[/]")
        if event.hint:
            self.say(f"    hint: {_esc(event.hint)}")

    def close(self) -> None:
        """Stop the live line, clearing it once (also after Ctrl-C: callers close in a `finally`); a phase still
        running (interrupted) gets its permanent line, with its time so far."""
        if self.opened is not None:  # printed above the live line, which then goes
            self._close_phase(self.opened[1] + time.monotonic() - self.started)
        live, self.live = self.live, None
        if live is not None:
            live.stop()


class SmokeProgress:
    """Live progress for people (stderr), plus one line per finished smoke phase."""

    def __init__(self) -> None:
        self.progress = LiveProgress()

    def __call__(self, event: Event) -> None:
        if isinstance(event, SmokePhase):
            colour = "green" if event.status == "passed" else "red"
            self.progress.say(f"[bold]{event.phase}[/] [{colour}]{event.status}[/] [dim]{event.duration_s:.2f}s[/]")
        else:
            self.progress(event)

    def close(self) -> None:
        self.progress.close()


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
                line = fit(printable(line), terminal_width(progress.console.file) - len("  evidence: "))
                progress.say(f"  evidence: [dim]{_esc(line)}[/]")
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
