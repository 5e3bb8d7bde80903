"""Figure 2: clean handoff (one waiter), and 2b: many waiters on one lock."""

from __future__ import annotations

import math
import subprocess
import time
from collections import Counter

from .probe import ProbeLog, count_requests, probe_argv, why_not
from .procs import Procs
from .stats import fmt, lock_name, md_table, ms, pct, say, slug
from .stores import Contender, Session


def fig_handoff(session: Session, c: Contender, cfg: dict, procs_mark: str) -> dict:
    """A chain of --wait runs: each probe runs `hold`, the next waiter is started as
    soon as the current holder's START is logged; gap = next START - this STOP."""
    d = session.dir / f"handoff-{slug(c.label)}"
    d.mkdir()
    log, lockfile, lock = d / "probe.log", d / "probe.lock", lock_name("handoff")
    hold = cfg["handoff_hold"]
    n = cfg["handoffs"]
    probes = ProbeLog(log)
    gaps, head_starts, bad_exits, failure = [], [], 0, None
    with open(d / "stderr.log", "wb") as errf, Procs(procs_mark) as procs:

        def start(i: int) -> subprocess.Popen:
            child = probe_argv(log, lockfile, f"h{i}", run_for=hold)
            return procs.spawn(c.command(session, lock, child, True, ["-vvv"] if c.is_leaderrun else []), stderr=errf)

        prev = start(0)
        if probes.wait("START", "h0", 20, prev) is None:
            failure = "the first holder's child never started: " + why_not(prev, d / "stderr.log")
        for i in range(1, n + 1):
            if failure:
                break
            spawned = time.monotonic_ns()
            cur = start(i)
            started = probes.wait("START", f"h{i}", 20, cur)
            stopped = probes.wait("STOP", f"h{i-1}", 5)
            if started is None or stopped is None:
                failure = f"handoff {i}: " + ("no START from the waiter: " + why_not(cur, d / "stderr.log")
                                              if started is None else "no STOP from the holder")
                break
            gaps.append(started - stopped)
            head_starts.append(stopped - spawned)
            try:
                if prev.wait(10) != 0:
                    bad_exits += 1
            except subprocess.TimeoutExpired:
                bad_exits += 1
            prev = cur
            if i % 50 == 0:
                say(f"    {i}/{n} handoffs")
        probes.wait("STOP", f"h{len(gaps)}", 5)
        try:
            if prev.wait(10) != 0:
                bad_exits += 1
        except subprocess.TimeoutExpired:
            bad_exits += 1
    probes.poll()
    gaps_ms = [ms(g) for g in gaps]
    requests = sum(count_requests(d / "stderr.log").values()) if c.is_leaderrun else None
    return {
        "label": c.label,
        "n": len(gaps),
        "hold": hold,
        # Every run's requests (its acquire, renewals while it holds, release) over the handoffs.
        "requests_per_handoff": requests / (len(gaps) + 1) if requests is not None and gaps else None,
        "p50_ms": pct(gaps_ms, 0.5),
        "p90_ms": pct(gaps_ms, 0.9),
        "p99_ms": pct(gaps_ms, 0.99),
        "max_ms": max(gaps_ms, default=math.nan),
        "min_ms": min(gaps_ms, default=math.nan),
        "overlaps": len(probes.overlaps) + sum(1 for g in gaps if g < 0),
        "bad_exits": bad_exits,
        "waiter_head_start_min_ms": ms(min(head_starts)) if head_starts else math.nan,
        "failure": failure,
        "gaps_ms": gaps_ms,
    }


def fig_herd(session: Session, c: Contender, cfg: dict, procs_mark: str) -> dict:
    """Many waiters on one lock: a holder keeps it while `herd` --wait runs start and settle,
    then each waiter in turn holds it for `herd_hold`. Gap: each START minus the latest STOP
    before it. Requests: every run's `store request` lines (-vvv) over the handoffs."""
    d = session.dir / f"herd-{slug(c.label)}"
    d.mkdir()
    log, lockfile, lock = d / "probe.log", d / "probe.lock", lock_name("herd")
    n, hold = cfg["herd"], cfg["herd_hold"]
    flags = ["-vvv"] if c.is_leaderrun else []
    probes = ProbeLog(log)
    failure = None
    with open(d / "stderr.log", "wb") as errf, Procs(procs_mark) as procs:
        first = procs.spawn(c.command(session, lock, probe_argv(log, lockfile, "w0", run_for="1000s"), True, flags),
                            stderr=errf)
        if probes.wait("START", "w0", 20, first) is None:
            return {"label": c.label, "failure": "the first holder's child never started: " + why_not(first, d / "stderr.log")}
        waiters = [procs.spawn(c.command(session, lock, probe_argv(log, lockfile, f"w{i}", run_for=hold), True, flags),
                               stderr=errf) for i in range(1, n + 1)]
        # Let every waiter reach its wait (start-up on a loaded 2-core machine takes a while).
        time.sleep(cfg["herd_settle"])
        before = count_requests(d / "stderr.log") if c.is_leaderrun else Counter()
        Procs.terminate(first)
        deadline = time.monotonic() + 60 + n * 5
        while time.monotonic() < deadline:
            probes.poll()
            if len(probes.stop) >= n + 1:
                break
            # Every waiter is done (the first holder's child may never log STOP: `etcdctl lock`
            # leaves its child running when it is terminated).
            if all(w.poll() is not None for w in waiters):
                break
            time.sleep(0.05)
        probes.poll()
        after = count_requests(d / "stderr.log") if c.is_leaderrun else Counter()
        if len(probes.start) < n + 1:
            failure = f"{len(probes.start) - 1} of {n} waiters ran"
        # Waiters still running 30 s after that are stopped and counted here (the failure says
        # how many ran): a timeout must not throw away the handoffs that were measured.
        bad_exits, patience = 0, time.monotonic() + 30
        for w in waiters:
            try:
                code = w.wait(max(0.1, patience - time.monotonic()))
            except subprocess.TimeoutExpired:
                code = Procs.terminate(w)  # by a signal: non-zero
            bad_exits += code != 0
    events = sorted([(t, "STOP") for t in probes.stop.values()] + [(t, "START") for t in probes.start.values()])
    gaps, last_stop = [], None
    for t, kind in events:
        if kind == "STOP":
            last_stop = t
        elif last_stop is not None:
            gaps.append(t - last_stop)
            last_stop = None
    gaps_ms = [ms(g) for g in gaps]
    requests = sum((after - before).values()) if c.is_leaderrun else None
    return {
        "label": c.label,
        "waiters": n,
        "n": len(gaps),
        "p50_ms": pct(gaps_ms, 0.5),
        "p99_ms": pct(gaps_ms, 0.99),
        "max_ms": max(gaps_ms, default=math.nan),
        "overlaps": len(probes.overlaps) + sum(1 for g in gaps if g < 0),
        "bad_exits": bad_exits,
        "requests_per_handoff": requests / len(gaps) if requests is not None and gaps else None,
        "failure": failure,
        "gaps_ms": gaps_ms,
    }


def handoff_table(results: list) -> str:
    """Figure 2's table (also 7a's, on the clusters)."""
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["label"], *["—"] * 9, r["error"]])
            continue
        note = r["failure"] or ""
        per = r.get("requests_per_handoff")
        rows.append([r["label"], r["n"], fmt(r["p50_ms"]), fmt(r["p90_ms"]), fmt(r["p99_ms"]), fmt(r["max_ms"]),
                     fmt(r["min_ms"]), "—" if per is None else fmt(per), r["overlaps"], r["bad_exits"], note])
    return md_table(["row", "handoffs", "p50 ms", "p90 ms", "p99 ms", "max ms", "min ms", "requests per handoff",
                     "overlaps", "non-zero exits", "failure"], rows)
