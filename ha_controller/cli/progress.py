"""Progress of long ``hactl`` work, on stderr.

- stderr is a terminal: a rich progress bar (count, rate, ETA), redrawn in place;
- stderr is a file or a pipe (logs, CI): one plain line every ``interval_s`` and a last
  one when the work ends, each ending in a newline;
- switched off (``--no-progress``, or ``--json`` when stderr is not a terminal): nothing.

Only :func:`reporter` is public; rich is imported when a bar is drawn.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import IO, Any, Protocol

__all__ = ["Reporter", "format_duration", "reporter"]

#: Seconds between two plain lines.
PLAIN_INTERVAL_S = 5.0


class Reporter(Protocol):
    def update(self, completed: int, info: str = "") -> None:
        """``completed`` units done so far; ``info`` is shown after the count."""

    def close(self) -> None:
        """The work ended: draw (or print) the last state and stop."""


def format_duration(seconds: float) -> str:
    """``7s``, ``3m04s``, ``1h02m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class _Off:
    def update(self, completed: int, info: str = "") -> None:
        pass

    def close(self) -> None:
        pass


class _Plain:
    """Plain lines: ``produce T: 1200/10000 (12%) acked 1190, 850 msg/s, ETA 10s``.

    Without a total (``consume`` without ``--count``, ``analyze``) a ticker thread
    prints the elapsed time even while the caller blocks."""

    def __init__(
        self, label: str, total: int | None, unit: str, stream: IO[str], interval_s: float
    ) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream
        self.interval_s = interval_s
        self.started = time.monotonic()
        self.completed = 0
        self.info = ""
        self._last = self.started
        self._updated = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if total is None:
            self._ticker = threading.Thread(target=self._tick, name="hactl-progress", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._print()

    def _line(self) -> str:
        elapsed = time.monotonic() - self.started
        rate = self.completed / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.label}:"]
        if self.total is not None:
            pct = 100 * self.completed // self.total if self.total else 100
            parts.append(f"{self.completed}/{self.total} ({pct}%)")
        elif self.unit:
            parts.append(f"{self.completed} {self.unit}")
        if self.info:
            parts.append(self.info)
        text = " ".join(parts)
        if self.unit and self.completed:
            text += f", {rate:,.0f} {self.unit}/s"
        if self.total is not None and self.completed < self.total and rate > 0:
            text += f", ETA {format_duration((self.total - self.completed) / rate)}"
        return text + f", {format_duration(elapsed)} elapsed"

    def _print(self) -> None:
        with self._lock:
            self._last = time.monotonic()
            print(self._line(), file=self.stream, flush=True)

    def update(self, completed: int, info: str = "") -> None:
        self.completed = completed
        self.info = info
        self._updated = True
        if time.monotonic() - self._last >= self.interval_s:
            self._print()

    def close(self) -> None:
        """The last line, unless the work never started (it failed first)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(1.0)
        if self._updated:
            self._print()


class _Rich:
    """A rich bar (or spinner without a total): description, bar, M/N, rate, ETA."""

    def __init__(self, label: str, total: int | None, unit: str) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            SpinnerColumn,
            Task,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.text import Text

        class Rate(ProgressColumn):
            def render(self, task: Task) -> Text:
                speed = task.finished_speed or task.speed
                if not unit:
                    return Text("")
                return Text(f"{speed:,.0f} {unit}/s" if speed else f"- {unit}/s")

        columns: list[Any] = [TextColumn("[bold]{task.description}")]
        if total is not None:
            columns += [BarColumn(), MofNCompleteColumn(), Rate(), "ETA", TimeRemainingColumn()]
        elif unit:
            columns += [SpinnerColumn(), TextColumn(f"{{task.completed}} {unit}"), Rate()]
            columns += [TimeElapsedColumn()]
        else:
            columns += [SpinnerColumn(), TimeElapsedColumn()]
        columns += [TextColumn("{task.fields[info]}")]
        self._progress = Progress(
            *columns,
            console=Console(stderr=True),
            redirect_stdout=False,  # --json lines go to stdout as they are
            refresh_per_second=8,
        )
        self._task = self._progress.add_task(label, total=total, info="")
        self._progress.start()

    def update(self, completed: int, info: str = "") -> None:
        self._progress.update(self._task, completed=completed, info=info)

    def close(self) -> None:
        self._progress.stop()


def reporter(
    label: str,
    total: int | None = None,
    *,
    unit: str = "msg",
    enabled: bool = True,
    json_output: bool = False,
    stream: IO[str] | None = None,
    interval_s: float = PLAIN_INTERVAL_S,
) -> Reporter:
    """The reporter for this stderr: a bar on a terminal, plain lines elsewhere, none
    when not ``enabled`` or when ``json_output`` goes with a non-terminal stderr."""
    stream = sys.stderr if stream is None else stream
    terminal = stream.isatty()
    if not enabled or (json_output and not terminal):
        return _Off()
    if terminal:
        return _Rich(label, total, unit)
    return _Plain(label, total, unit, stream, interval_s)
