"""The child of figures 2 to 5 (`leaderrun-probe`, bench/probe.rs) and what the runs log."""

from __future__ import annotations

import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Optional

from .build import PROBE


def probe_argv(log: Path, lockfile: Path, pid: str, run_for: Optional[str] = None, beat: str = "1s") -> list:
    argv = [PROBE, "--log", log, "--lockfile", lockfile, "--id", pid, "--beat", beat]
    if run_for:
        argv += ["--run-for", run_for]
    return argv


class ProbeLog:
    """Follows the probes' shared log: START/STOP/OVERLAP times (CLOCK_MONOTONIC ns) by id."""

    def __init__(self, path: Path):
        self.path = path
        self.pos = 0
        self.rest = b""
        self.start: dict[str, int] = {}
        self.stop: dict[str, int] = {}
        self.overlaps: list[str] = []
        self.slot: dict[str, int] = {}

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return
        self.pos += len(data)
        data = self.rest + data
        *lines, self.rest = data.split(b"\n")
        for raw in lines:
            words = raw.decode(errors="replace").split()
            if len(words) >= 3 and words[0] == "START":
                # START id token t [slot] (the slot under --slots, `{slot}` in --lockfile).
                self.start[words[1]] = int(words[3] if len(words) > 4 else words[-1])
                if len(words) > 4:
                    self.slot[words[1]] = int(words[4])
            elif len(words) >= 3 and words[0] == "STOP":
                self.stop[words[1]] = int(words[-1])
            elif words and words[0] == "OVERLAP":
                self.overlaps.append(" ".join(words))

    def wait(self, kind: str, pid: str, timeout: float, proc: Optional[subprocess.Popen] = None,
             step: float = 0.002) -> Optional[int]:
        """The time of `kind` for probe `pid`; None after `timeout`, or as soon as `proc`
        (the wrapper expected to start that probe) has exited without it."""
        table = self.start if kind == "START" else self.stop
        end = time.monotonic() + timeout
        while True:
            exited = proc is not None and proc.poll() is not None
            self.poll()
            if pid in table:
                return table[pid]
            if exited or time.monotonic() >= end:
                return None
            time.sleep(step)


def why_not(proc: subprocess.Popen, stderr: Path) -> str:
    """What to say when a wrapper's child did not start: its exit status and last stderr line."""
    status = proc.poll()
    text = f"exited with {status}" if status is not None else "still running, no START"
    try:
        lines = [l for l in stderr.read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        lines = []
    return f"{text}: {lines[-1]}" if lines else text


def count_requests(path: Path) -> Counter:
    with open(path, "rb") as f:
        text = f.read().decode(errors="replace")
    # Only whole lines: the last one may still be being written.
    text = text[: text.rfind("\n") + 1]
    return Counter(re.findall(r'store request op="?(\w+)', text))
