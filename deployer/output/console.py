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
from deployer.watch.watcher import Event

DOWNLOAD_NOTE_EVERY_S = 30.0   # without a terminal: a download's progress line at most this often


class JsonEvents:
    """`--json`: one JSON object per event on stdout, flushed at once."""

    def __call__(self, event: Event) -> None:
        sys.stdout.write(json.dumps({"event": event.kind, "at": round(event.at, 3), **event.data}, default=str) + "\n")
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
        data = event.data
        if event.kind in ("phase", "progress"):
            self.phase, self.line = data.get("phase", self.phase), printable(str(data.get("line", self.line)))
            if event.kind == "progress" and data.get("file") is not None:
                self._download(data)
            if event.kind == "phase":
                self.say(f"  [cyan]{data['phase']:<22}[/] [dim]{data.get('elapsed', 0):7.1f}s  "
                         f"{_esc(data.get('line', ''))[:110]}[/]")
        elif event.kind == "attempt":
            self.started = time.monotonic()
            self.phase = "starting"
            self.say(f"[bold]attempt {data['attempt']}[/] (content {str(data['content_hash'])[:12]})")
        elif event.kind == "ready":
            self.say(f"  [bold green]ready[/] after {data['elapsed']:.1f}s")
        elif event.kind == "exited":
            how = f"killed by {data.get('signal_name') or data.get('signal')}" if data.get("signal") else \
                f"exit code {data.get('exit_code')}"
            self.say(f"  [bold red]engine died[/] ({how}) after {data['elapsed']:.1f}s")
        elif event.kind in ("hung", "timeout"):
            self.say(f"  [bold red]{event.kind}[/] after {data['elapsed']:.1f}s")
        elif event.kind == "diagnosis":
            self._diagnosis(data)
        elif event.kind == "change":
            when = " before launch" if data.get("before_launch") else ""
            self.say(f"  [bold yellow]changing{when}[/]: {_esc(data.get('reason') or _change_text(data))}")
        elif event.kind in ("warning", "drift", "override", "suggestion"):
            self.say(f"  [yellow]{event.kind}[/]: {_esc(data['message'])}")
        elif event.kind == "problem":
            self.say(f"  [bold red]problem[/]: {_esc(data['message'])}")
        elif event.kind in ("rollback", "restored"):
            self.say(f"  [bold yellow]{_esc(data['message'])}[/]")
        elif event.kind == "supervisor-lost":
            self.say(f"  [bold red]supervisor lost[/]: {_esc(data['message'])}")
        elif event.kind == "port-taken":
            self.say(f"  [bold red]port {data['port']} taken[/] by {_esc(', '.join(data.get('holders') or []))}")
        elif event.kind == "info":
            self.say(f"  {_esc(data['message'])}")
        if self.live is not None:
            self.live.update(self._render())

    def _download(self, data: dict[str, Any]) -> None:
        """The live line shows the download; a log without a terminal gets a line per file and every 30 s."""
        self.line = str(data.get("text") or self.line)
        if self.live is not None:
            return
        file, now, done = str(data["file"]), time.monotonic(), data.get("percent") == 100
        last_file, last_at, last_done = self.download_noted
        if file != last_file or now - last_at >= DOWNLOAD_NOTE_EVERY_S or (done and not last_done):
            self.download_noted = (file, now, done)
            self.say(f"  [cyan]{'downloading':<22}[/] [dim]{data.get('elapsed', 0):7.1f}s  {_esc(self.line)}[/]")

    def _diagnosis(self, data: dict[str, Any]) -> None:
        sig = data.get("signature") or "unknown"
        self.say(f"  [bold]diagnosis[/] [magenta]{sig}[/]: {_esc(data.get('summary', ''))}")
        for line in (data.get("evidence") or [])[:3]:
            self.say(f"    [dim]> {_esc(line)[:160]}[/]")
        if data.get("hint"):
            self.say(f"    hint: {_esc(data['hint'])}")

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
        progress.say(f"before launch: [yellow]{note.get('signature')}[/]: {_esc(note.get('summary', ''))}")
        progress.say(f"  changed: {_esc((note.get('change') or {}).get('reason', ''))}")
    for item in report.attempts:
        colour = "green" if item.outcome == "ready" else "red"
        progress.say(f"attempt {item.attempt}: [{colour}]{item.outcome}[/] ({_esc(item.detail)})")
        if item.diagnosis:
            progress.say(f"  diagnosis: {item.diagnosis.get('signature') or 'unknown'}: "
                         f"{_esc(item.diagnosis.get('summary', ''))}")
            for line in (item.diagnosis.get("evidence") or [])[:2]:
                progress.say(f"  evidence: [dim]{_esc(line)[:200]}[/]")
        if item.change:
            progress.say(f"  changed: {_esc(item.change.get('reason') or _change_text(item.change))}")
    if report.status == "ready":
        progress.say(f"[bold green]{report.name} is ready[/] on {report.host} ({report.run_dir})")
    restored = report.restored
    if restored:
        back = f"{str(restored.get('content_hash'))[:12]} ({restored.get('run_id')})"
        if restored.get("status") == "ready":
            progress.say(f"[bold yellow]brought back the previous version {back}[/]: it is serving again")
        else:
            progress.say(f"[bold red]could not bring back the previous version {back}[/]: "
                         f"{_esc(restored.get('detail', ''))}")
    for line in report.drift:
        progress.say(f"[yellow]drift[/]: {_esc(line)}")
    if report.saved_fixed:
        progress.say(f"wrote the profile that worked to {report.saved_fixed}")
