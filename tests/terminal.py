"""Run a command as a person types it: on a pseudo-terminal, and read back the screen
they are left with (a terminal emulator, so progress bars that erase themselves and
lines that overwrite each other count as a person sees them, not as bytes)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from dataclasses import dataclass

import pyte


@dataclass
class Screen:
    returncode: int
    lines: list[str]  # the non-blank lines left on the screen, in order

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def run_in_terminal(cmd: list[str], *, timeout: float, columns: int = 400, rows: int = 50,
                    env: dict | None = None) -> Screen:
    """stdin, stdout and stderr all on one pty of `columns` x `rows` (rich sizes its
    output from it); the emulated screen is tall enough that nothing scrolls off."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, close_fds=True, start_new_session=True,
                            env={**(env or os.environ), "TERM": "xterm-256color", "COLUMNS": str(columns)})
    os.close(slave)
    received, deadline = bytearray(), time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], 1.0)[0]:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the pty
                break
            if not chunk:
                break
            received += chunk
        else:
            raise TimeoutError(f"{cmd} still running after {timeout} s")
        returncode = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    screen = pyte.Screen(columns, 10_000)
    pyte.ByteStream(screen).feed(bytes(received))
    return Screen(returncode, [line.rstrip() for line in screen.display if line.strip()])
