"""Figure 5: peak resident memory of the wrapper, its watchdog and a standby."""

from __future__ import annotations

import time

from .build import PROBE
from .probe import ProbeLog, probe_argv, why_not
from .procs import Procs, children_of, cmdline, status_kib
from .stats import lock_name, ms, parse_seconds, slug
from .stores import Contender, Session, store_cfg


def fig_memory(session: Session, c: Contender, cfg: dict, procs_mark: str) -> dict:
    """VmHWM of the holding wrapper and its watchdog after a few renewals, and of a standby."""
    cfg = store_cfg(cfg, c.store)
    ttl, renew = cfg["memory_ttl"], cfg["memory_renew"]
    flags = ["--ttl", ttl, "--renew-every", renew, "--kill-after", "1s"]
    d = session.dir / f"memory-{slug(c.label)}"
    d.mkdir()
    log, lockfile, lock = d / "probe.log", d / "probe.lock", lock_name("memory")
    probes = ProbeLog(log)
    with open(d / "stderr.log", "wb") as errf, Procs(procs_mark) as procs:
        holder = procs.spawn(c.command(session, lock, probe_argv(log, lockfile, "H"), True, flags), stderr=errf)
        started = probes.wait("START", "H", 20, holder)
        if started is None:
            return {"label": c.label, "failure": "the holder's child never started: " + why_not(holder, d / "stderr.log")}
        standby = procs.spawn(c.command(session, lock, probe_argv(log, lockfile, "S"), True, flags), stderr=errf)
        time.sleep(cfg["memory_after"])
        held_for = ms(time.monotonic_ns() - started) / 1e3
        # The wrapper's children: its child (the probe) and its watchdog, whichever way that
        # was started (forked, or `leaderrun __watchdog`).
        watchdogs = [k for k in children_of(holder.pid) if str(PROBE) not in " ".join(map(str, cmdline(k)))]
        watchdog = watchdogs[0] if watchdogs else None
        result = {
            "label": c.label,
            "held_for_s": held_for,
            "renewals": int(held_for / parse_seconds(renew)),
            "ttl": ttl,
            "renew_every": renew,
            "sampled_after_s": cfg["memory_after"],
            "wrapper_hwm_kib": status_kib(holder.pid, "VmHWM"),
            "wrapper_rss_kib": status_kib(holder.pid, "VmRSS"),
            "watchdog_hwm_kib": status_kib(watchdog, "VmHWM") if watchdog else None,
            "watchdog_rss_kib": status_kib(watchdog, "VmRSS") if watchdog else None,
            "standby_hwm_kib": status_kib(standby.pid, "VmHWM"),
            "standby_rss_kib": status_kib(standby.pid, "VmRSS"),
        }
    return result
