"""Figure 4: the store requests (and system calls) of an idle standby."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

from .probe import ProbeLog, count_requests, probe_argv, why_not
from .procs import Procs
from .stats import lock_name, slug
from .stores import Contender, Session


def fig_standby(session: Session, c: Contender, cfg: dict, procs_mark: str) -> dict:
    """A holder with a long child, one `--wait -vvv` standby; count its store requests."""
    d = session.dir / f"standby-{slug(c.label)}"
    d.mkdir()
    log, lockfile, lock = d / "probe.log", d / "probe.lock", lock_name("standby")
    trace = d / "standby.stderr"
    probes = ProbeLog(log)
    with open(d / "holder.stderr", "wb") as errf, open(trace, "wb") as tracef, Procs(procs_mark) as procs:
        holder = procs.spawn(c.command(session, lock, probe_argv(log, lockfile, "H"), True, []), stderr=errf)
        if probes.wait("START", "H", 20, holder) is None:
            return {"label": c.label, "failure": "the holder's child never started: " + why_not(holder, d / "holder.stderr")}
        standby = procs.spawn(c.command(session, lock, probe_argv(log, lockfile, "S"), True, ["-vvv"]), stderr=tracef)
        time.sleep(cfg["standby_settle"])
        t0, before = time.monotonic(), count_requests(trace)
        time.sleep(cfg["standby_seconds"])
        t1, after = time.monotonic(), count_requests(trace)
        syscalls = count_syscalls(standby.pid, cfg["strace_seconds"], d / "strace.txt")
    seconds = t1 - t0
    ops = after - before
    return {
        "label": c.label,
        "seconds": seconds,
        "requests": sum(ops.values()),
        "per_second": sum(ops.values()) / seconds,
        "by_op": {op: round(n / seconds, 1) for op, n in sorted(ops.items())},
        "standby_started": "S" in probes.start,
        "syscalls": syscalls,
        "strace_seconds": cfg["strace_seconds"],
    }


def count_syscalls(pid: int, seconds: float, out: Path) -> Optional[int]:
    """System calls made by every thread of `pid` over `seconds` (`strace -c -f -p`); None
    without strace (it is installed with `apt-get install strace`)."""
    if not shutil.which("strace"):
        return None
    p = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    p.send_signal(signal.SIGINT)
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        return None
    for line in out.read_text(errors="replace").splitlines():
        words = line.split()
        if words and words[-1] == "total":
            # "100.00  0.000123  12  34  5  total": calls is the 4th column.
            return int(words[3])
    return 0
