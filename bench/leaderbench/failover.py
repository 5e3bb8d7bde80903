"""Figure 3: crash failover (kill -9 of the holder's wrapper)."""

from __future__ import annotations

import math
import os
import random
import signal
import time

from .probe import ProbeLog, probe_argv, why_not
from .procs import Procs, children_of, cmdline, pid_alive
from .stats import fmt, lock_name, md_table, ms, parse_seconds, pct, say, slug
from .stores import Contender, Session, store_cfg


def fig_failover(session: Session, c: Contender, cfg: dict, procs_mark: str) -> dict:
    """kill -9 of the holder's wrapper; time until the --wait peer's child STARTs, and
    until the old child logged STOP / its pid was gone, all from the kill."""
    cfg = store_cfg(cfg, c.store)
    ttl, renew, kill_after = cfg["failover_ttl"], cfg["failover_renew"], cfg["failover_kill_after"]
    flags = ["--ttl", ttl, "--renew-every", renew, "--kill-after", kill_after]
    d = session.dir / f"failover-{slug(c.label)}"
    d.mkdir()
    rng = random.Random(1)
    takeover, child_stop, child_gone, failures, overlaps = [], [], [], [], 0
    with open(d / "stderr.log", "wb") as errf:
        for r in range(cfg["failovers"]):
            log, lockfile, lock = d / f"probe-{r}.log", d / f"probe-{r}.lock", lock_name("failover")
            probes = ProbeLog(log)
            with Procs(procs_mark) as procs:
                holder = procs.spawn(c.command(session, lock, probe_argv(log, lockfile, "H"), True, flags), stderr=errf)
                if probes.wait("START", "H", 20, holder) is None:
                    failures.append(f"rep {r}: the holder's child never started: " + why_not(holder, d / "stderr.log"))
                    break
                waiter = procs.spawn(c.command(session, lock, probe_argv(log, lockfile, "W"), True, flags), stderr=errf)
                # Let two renewals happen, and kill at a random phase of the third renewal cycle.
                time.sleep(2 * parse_seconds(renew) + rng.uniform(0, parse_seconds(renew)))
                kids = [k for k in children_of(holder.pid) if "__watchdog" not in cmdline(k)]
                child_pid = kids[0] if len(kids) == 1 else None
                t_kill = time.monotonic_ns()
                os.kill(holder.pid, signal.SIGKILL)
                gone_at = None  # when the old child's pid was seen gone (None: not yet, or unknown pid)
                limit = time.monotonic() + 3 * parse_seconds(ttl) + 5
                while time.monotonic() < limit:
                    probes.poll()
                    if child_pid is not None and gone_at is None and not pid_alive(child_pid):
                        gone_at = time.monotonic_ns()
                    if "W" in probes.start and "H" in probes.stop and (child_pid is None or gone_at is not None):
                        break
                    # A tool without a watchdog (`etcdctl lock`) never stops the old child: a
                    # second after the takeover is enough to say so.
                    if not c.is_leaderrun and "W" in probes.start and time.monotonic_ns() - probes.start["W"] > 1e9:
                        break
                    time.sleep(0.001)
                holder.wait(5)
                if "W" not in probes.start:
                    failures.append(f"rep {r}: the standby's child never started: " + why_not(waiter, d / "stderr.log"))
                    continue
                if "H" in probes.stop and probes.stop["H"] < t_kill:
                    # Not a crash failover: the holder lost its lease by itself before the kill.
                    failures.append(f"rep {r}: the holder's child stopped "
                                    f"{ms(t_kill - probes.stop['H']):.0f} ms before the kill")
                takeover.append(ms(probes.start["W"] - t_kill))
                if "H" in probes.stop:
                    child_stop.append(ms(probes.stop["H"] - t_kill))
                    if probes.start["W"] < probes.stop["H"]:
                        overlaps += 1
                if gone_at is not None:
                    child_gone.append(ms(gone_at - t_kill))
                overlaps += len(probes.overlaps)
                Procs.terminate(waiter)
            say(f"    {r + 1}/{cfg['failovers']} failovers")
    return {
        "label": c.label,
        "ttl": ttl,
        "renew_every": renew,
        "kill_after": kill_after,
        "n": len(takeover),
        "takeover_min_ms": min(takeover, default=math.nan),
        "takeover_p50_ms": pct(takeover, 0.5),
        "takeover_max_ms": max(takeover, default=math.nan),
        "child_stop_p50_ms": pct(child_stop, 0.5),
        "child_stop_max_ms": max(child_stop, default=math.nan),
        "child_gone_p50_ms": pct(child_gone, 0.5),
        "child_gone_max_ms": max(child_gone, default=math.nan),
        "overlaps": overlaps,
        "failures": failures,
        "takeover_ms": takeover,
    }


def failover_table(results: list) -> str:
    """Figure 3's table (also 7a's, on the clusters)."""
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["label"], *["—"] * 9, r["error"]])
            continue
        rows.append([r["label"], f"{r['ttl']} / {r['renew_every']} / {r['kill_after']}", r["n"],
                     fmt(r["takeover_min_ms"], 0), fmt(r["takeover_p50_ms"], 0), fmt(r["takeover_max_ms"], 0),
                     (fmt(r["takeover_p50_ms"] / (parse_seconds(r["ttl"]) * 1e3), 2) + " ttl") if r["n"] else "—",
                     f"{fmt(r['child_stop_p50_ms'])} / {fmt(r['child_stop_max_ms'])}",
                     f"{fmt(r['child_gone_p50_ms'])} / {fmt(r['child_gone_max_ms'])}",
                     r["overlaps"], "; ".join(r["failures"])])
    return md_table(["row", "ttl / renew / kill-after", "reps", "takeover min ms", "takeover p50 ms",
                     "takeover max ms", "p50 vs ttl", "old child STOP p50 / max ms", "old child pid gone p50 / max ms",
                     "overlaps", "failures"], rows)
