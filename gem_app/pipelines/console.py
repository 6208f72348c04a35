"""What a person sees of a local pipeline run: one line per step, progress bars, and the
failing step's last lines; everything else goes to a log file per step.

kfp.local prints every task's executor chatter and its subprocess's output on stdout.
``PipelineConsole`` takes stdout's place while the pipeline runs: it writes each task's
lines to ``<workspace>/logs/<NN>-<task>.log``, turns the progress and figure events the
steps emit (gem/utils/progress.py) into bars and step lines on the real terminal, and
merges consecutive runs of one step (a ParallelFor's shards) into one line.

kfp.local runs a ParallelFor's iterations in threads, each streaming its task's output
line by line: the partial line, the running step and its log file are per thread.
"""

from __future__ import annotations

import builtins
import io
import json
import logging
import os
import re
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from gem.utils.progress import EVENT_PREFIX

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_START = re.compile(r"Executing task '([^']+)'")
_END = re.compile(r"Task '([^']+)' finished with status (\w+)")
_SUFFIX = re.compile(r"-\d+$")
_RAISED = re.compile(r"^(?P<indent>\s*)(?P<cls>[A-Za-z_][\w.]*): (?P<message>.+)$")
TAIL_LINES = 40


def step_error(lines: list[str]) -> tuple[type, str] | None:
    """The exception class and message a failed step's log ends with (the last traceback's
    final line), when the class is a builtin or one of the project's; None otherwise."""
    import builtins
    import importlib

    starts = [i for i, line in enumerate(lines) if line.strip() == "Traceback (most recent call last):"]
    if not starts:
        return None
    indent = len(lines[starts[-1]]) - len(lines[starts[-1]].lstrip())
    for line in lines[starts[-1] + 1:]:
        match = _RAISED.match(line)
        if match and len(match["indent"]) == indent:
            module, _, name = match["cls"].rpartition(".")
            if not module:
                cls = getattr(builtins, name, None)
            elif module.split(".")[0] in ("gem", "gem_app", "students"):
                try:
                    cls = getattr(importlib.import_module(module), name, None)
                except ImportError:
                    cls = None
            else:
                cls = None
            return (cls, match["message"].strip()) if isinstance(cls, type) else None
    return None


@dataclass
class _Step:
    name: str
    log: Path
    started: float
    file: object = None
    count: int = 1
    ended: float = 0.0
    seconds: float = 0.0
    figures: dict = field(default_factory=dict)
    bars: set = field(default_factory=set)
    warnings: list = field(default_factory=list)


class PipelineConsole(io.TextIOBase):
    def __init__(self, workspace: str | Path, *, console=None):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.logs = Path(workspace) / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.console = console or Console(file=sys.__stdout__, highlight=False)
        self.progress = Progress(TextColumn("  {task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("eta"), TimeRemainingColumn(), console=self.console, transient=True,
                                 # on a terminal rich would otherwise take sys.stdout from us and
                                 # show every task's chatter instead of the step lines
                                 redirect_stdout=False, redirect_stderr=False)
        self._local = threading.local()
        self._lock = threading.RLock()
        self._index = 0
        self._pending: _Step | None = None  # finished, printed when a different step starts
        self._bars: dict[str, int] = {}
        self._warned: set[str] = set()  # each warning once per run (every window's report repeats the data's)
        self.failed: _Step | None = None
        self.refused: str = ""  # a step that refused its input: the refusal's message
        self.machine: str = ""  # a step the machine failed: the resource and what to do

    # ---------------------------------------------------------------- context
    def __enter__(self) -> "PipelineConsole":
        root = logging.getLogger()
        self._saved = sys.stdout, sys.stderr, os.environ.get("GEM_PROGRESS"), root.handlers[:], builtins.print
        os.environ["GEM_PROGRESS"] = "events"
        sys.stdout = sys.stderr = self  # stray chatter (a thread's warning) goes to the step's log too
        # kfp swaps the root logger's handlers per task and restores them racily across
        # threads: whatever it restores must write here too
        root.handlers = [logging.StreamHandler(self)]
        # line-buffered: `tail -f` on a step's log follows a long step as it runs (with the
        # default 8 KB buffer a training log lagged its steps by ~15 minutes)
        self._pipeline_log = open(self.logs / "pipeline.log", "a", buffering=1)
        warnings.filterwarnings("ignore", message="You may be attemping to run a task")
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.flush()
        self._flush_pending()
        self.progress.stop()
        # kfp indents task output by patching print, and restores it racily across threads
        sys.stdout, sys.stderr, previous, logging.getLogger().handlers, builtins.print = self._saved
        if previous is None:
            os.environ.pop("GEM_PROGRESS", None)
        else:
            os.environ["GEM_PROGRESS"] = previous
        self._pipeline_log.close()

    # ---------------------------------------------------------------- stream
    def writable(self) -> bool:
        return True

    @property
    def _current(self) -> _Step | None:
        return getattr(self._local, "step", None)

    @property
    def _file(self):
        step = self._current
        return step.file if step is not None else self._pipeline_log

    def write(self, text: str) -> int:
        buffer = getattr(self._local, "buffer", "") + text
        *lines, self._local.buffer = buffer.split("\n")
        for line in lines:
            self._line(line)
        return len(text)

    def flush(self) -> None:
        if getattr(self._local, "buffer", ""):
            line, self._local.buffer = self._local.buffer, ""
            self._line(line)
        self._file.flush()

    def _line(self, line: str) -> None:
        plain = _ANSI.sub("", line)
        if EVENT_PREFIX in plain:
            self._event(json.loads(plain.split(EVENT_PREFIX, 1)[1]))
            return
        if m := _START.search(plain):
            self._start(m.group(1))
        self._file.write(plain + "\n")
        if m := _END.search(plain):
            self._end(m.group(1), m.group(2))

    # ---------------------------------------------------------------- steps
    def _start(self, name: str) -> None:
        name = _SUFFIX.sub("", name)  # kfp numbers the tasks of a reused sub-pipeline
        with self._lock:
            if self._pending and self._pending.name != name:
                self._flush_pending()
            self._index += 1
            path = self.logs / f"{self._index:03d}-{name}.log"
        self._local.step = _Step(name, path, time.perf_counter(), file=open(path, "w", buffering=1))

    def _end(self, name: str, status: str) -> None:
        step = self._current
        if step is None:
            return
        step.ended = time.perf_counter()
        step.seconds = step.ended - step.started
        step.file.close()
        self._local.step = None
        with self._lock:
            self._finish(step, name, status)

    def _finish(self, step: _Step, name: str, status: str) -> None:
        for desc in step.bars:
            if desc in self._bars:
                self.progress.remove_task(self._bars.pop(desc))
        if status != "SUCCESS":
            self._flush_pending()
            self.failed = step
            self._print_failure(step)
        elif self._pending and self._pending.name == step.name and not (step.figures or self._pending.figures):
            self._pending.count += 1  # a ParallelFor: its wall time, first start to last end
            self._pending.ended = max(self._pending.ended, step.ended)
            self._pending.seconds = self._pending.ended - self._pending.started
            self._pending.figures.update(step.figures)
            self._pending.warnings += step.warnings
        else:
            self._flush_pending()
            self._pending = step

    def _flush_pending(self) -> None:
        step, self._pending = self._pending, None
        if step is None:
            return
        name = step.name + (f" x{step.count}" if step.count > 1 else "")
        figures = "  ".join(f"{k} {_fmt(v)}" for k, v in step.figures.items())
        self.console.print(f"[green]✓[/green] {name:<28} {step.seconds:7.1f} s  {figures}", soft_wrap=True)
        for text in step.warnings:
            if text not in self._warned:
                self._warned.add(text)
                self._say(f"  ! {step.name}: warning: {text}")

    def _print_failure(self, step: _Step) -> None:
        """A refusal of the input (a UserError) or a failure of the machine: one line, its
        message is the run's error; anything else: the step's last lines."""
        from gem.errors import is_user_error_class, machine_failure

        text = step.log.read_text(errors="replace").splitlines()
        raised = step_error(text)
        if raised is not None and is_user_error_class(raised[0]):
            self.refused = raised[1]
            self.console.print(f"[red]✗[/red] {step.name:<28} {step.seconds:7.1f} s  refused its input",
                               soft_wrap=True)
            return
        if raised is not None and issubclass(raised[0], OSError):
            self.machine = machine_failure(raised[0](raised[1])) or ""
            if self.machine:
                self.console.print(f"[red]✗[/red] {step.name:<28} {step.seconds:7.1f} s  stopped by the machine",
                                   soft_wrap=True)
                return
        lines = text[-TAIL_LINES:]
        self._say("\n".join([f"✗ {step.name} failed after {step.seconds:.1f} s; its last {len(lines)} lines "
                              f"(whole log: {step.log}):", *(f"  {line}" for line in lines)]))

    def _say(self, text: str) -> None:
        """Warnings and failures go to stderr; on a terminal through rich, so that they
        print above the live bars instead of being overwritten by their next refresh."""
        if self.console.is_terminal and sys.__stderr__.isatty():
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            print(text, file=sys.__stderr__, flush=True)

    # ---------------------------------------------------------------- events
    def _event(self, event: dict) -> None:
        step = self._current
        if event["kind"] == "figure" and step is not None:
            step.figures[event["name"]] = event["value"]
        elif event["kind"] == "warning" and step is not None:
            step.warnings.append(event["text"])
        elif event["kind"] == "progress":
            desc = event["desc"]
            with self._lock:
                if desc not in self._bars:
                    self._bars[desc] = self.progress.add_task(desc, total=event.get("total"))
                if step is not None:
                    step.bars.add(desc)
                self.progress.update(self._bars[desc], completed=event["n"], total=event.get("total"))


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
