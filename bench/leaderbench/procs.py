"""The processes the benchmarks start: each marked, so that a sweep ends all of them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from typing import Optional

# Every process this script starts carries this variable (and so do their children,
# watchdogs included): the final sweep kills exactly those, and nothing else.
MARK_VAR = "LEADERRUN_BENCH_RUN"
MARK = uuid.uuid4().hex


def marked_env(mark: str) -> dict:
    env = dict(os.environ)
    env[MARK_VAR] = mark
    # leaderrun's own settings from the caller's environment must not change the runs.
    for name in list(env):
        if name.startswith("LEADERRUN_") and name != MARK_VAR:
            del env[name]
    return env


def marked_pids(mark_prefix: str) -> list[int]:
    """Pids of live processes whose environment carries MARK_VAR=<mark_prefix...>."""
    needle = f"\0{MARK_VAR}={mark_prefix}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = b"\0" + f.read()
        except OSError:
            continue
        if needle in environ and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def proc_stat(pid: int) -> Optional[tuple[str, int]]:
    """(state, ppid) from /proc/PID/stat, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0], int(fields[1])


def pid_alive(pid: int) -> bool:
    """Running (a zombie is gone: its parent may be an init that never reaps)."""
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def children_of(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and st[1] == pid:
                kids.append(int(entry))
    return kids


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def status_kib(pid: int, key: str) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Procs:
    """Starts processes, each in a session of its own, and ends all of them on exit.

    Every process gets MARK_VAR=<mark>, inherited by its children (leaderrun's child
    and its watchdog run in process groups of their own, and outlive a SIGKILLed
    wrapper): cleanup() stops the wrappers politely, then SIGKILLs whatever still
    carries the mark.
    """

    def __init__(self, mark: str):
        self.mark = mark
        self.env = marked_env(mark)
        self.started: list[subprocess.Popen] = []

    def __enter__(self) -> "Procs":
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def spawn(self, argv: list, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw) -> subprocess.Popen:
        p = subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            env=self.env,
            **kw,
        )
        self.started.append(p)
        return p

    @staticmethod
    def terminate(p: subprocess.Popen, grace: float = 3.0) -> Optional[int]:
        """SIGTERM (leaderrun relays it to its child and releases), SIGKILL after `grace`."""
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        return p.returncode

    def cleanup(self) -> None:
        for p in self.started:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 3
        for p in self.started:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _ in range(20):
            pids = [pid for pid in marked_pids(self.mark)]
            pids += [p.pid for p in self.started if p.poll() is None]
            if not pids:
                break
            for pid in set(pids):
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            time.sleep(0.05)
        for p in self.started:
            try:
                p.wait(1)
            except subprocess.TimeoutExpired:
                pass
        self.started.clear()
