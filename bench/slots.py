#!/usr/bin/env python3
"""Section 9 of BENCHMARKS.md: handoffs and the herd on a semaphore (`--slots 3`, issue 24).

Three `--wait --slots 3` holders keep the three slots while WAITERS more `--wait --slots 3`
runs start and settle; then the holders are stopped and each waiter in turn holds a slot for
HOLD. Per slot: each START minus the latest STOP before it in that slot (the handoff gap).
Requests per handoff: every run's store requests (-vvv) while the waiters take their turns,
over the handoffs: with no herd it stays what a plain lock's herd costs (section 2b), however
many waiters there are. Also the most children seen at once (at most 3) and the overlaps
(two children in one slot; flock on the slot's file, and the intervals).

It reuses bench.py's package, bench/leaderbench/ (its servers, the same release binary, the same
Procs sweep). Run:
    python3 bench/slots.py [--store NAME ...] [--no-build] [--out FILE]
"""

import sys
import time

from leaderbench.probe import ProbeLog, count_requests, probe_argv, why_not
from leaderbench.procs import MARK, Procs
from leaderbench.run import each_session, section_args, write_section
from leaderbench.stats import fmt, lock_name, md_table, ms, pct
from leaderbench.stores import Session, leaderrun_command

SLOTS = 3
WAITERS = 30
SETTLE = 8.0
HOLD = "20ms"
# The stores whose standbys are woken by a release (the others poll: section 2b has them).
PUSH_STORES = ("sqlite", "postgres", "mysql", "redis", "etcd", "nats", "zookeeper")


def fig_slots(session: Session, mark: str) -> dict:
    d = session.dir / "slots"
    d.mkdir()
    log, lockfile, lock = d / "probe.log", d / "probe-{slot}.lock", lock_name("slots")
    flags = ["-vvv", "--slots", str(SLOTS)]
    probes = ProbeLog(log)
    failure = None
    with open(d / "stderr.log", "wb") as errf, Procs(mark) as procs:
        holders = []
        for i in range(SLOTS):
            argv = leaderrun_command(session, lock, probe_argv(log, lockfile, f"h{i}", run_for="1000s"), True, flags)
            holders.append(procs.spawn(argv, stderr=errf))
            if probes.wait("START", f"h{i}", 30, holders[-1]) is None:
                return {"store": session.store.name, "failure": f"holder h{i} never started: " + why_not(holders[-1], d / "stderr.log")}
        waiters = [procs.spawn(leaderrun_command(session, lock, probe_argv(log, lockfile, f"w{i}", run_for=HOLD), True, flags),
                               stderr=errf) for i in range(WAITERS)]
        time.sleep(SETTLE)
        before = count_requests(d / "stderr.log")
        for h in holders:
            Procs.terminate(h)
        deadline = time.monotonic() + 60 + WAITERS * 5
        while time.monotonic() < deadline:
            probes.poll()
            if len(probes.stop) >= SLOTS + WAITERS or all(w.poll() is not None for w in waiters):
                break
            time.sleep(0.05)
        probes.poll()
        after = count_requests(d / "stderr.log")
        bad_exits = sum(1 for w in waiters if w.wait(30) != 0)
    ran = [p for p in probes.start if p.startswith("w")]
    if len(ran) < WAITERS:
        failure = f"{len(ran)} of {WAITERS} waiters ran"
    gaps, overlaps = [], len(probes.overlaps)
    for slot in range(SLOTS):
        ids = [p for p, s in probes.slot.items() if s == slot]
        # A STOP before a START at the same instant.
        events = sorted([(probes.stop[p], 0, "STOP") for p in ids if p in probes.stop]
                        + [(probes.start[p], 1, "START") for p in ids])
        last_stop, alive = None, 0
        for t, _, kind in events:
            alive += 1 if kind == "START" else -1
            overlaps += alive > 1
            if kind == "STOP":
                last_stop = t
            elif last_stop is not None:
                gaps.append(t - last_stop)
                last_stop = None
    edges = sorted([(probes.start[p], 1) for p in probes.start] + [(t, -1) for t in probes.stop.values()])
    alive, most = 0, 0
    for _, step in edges:
        alive += step
        most = max(most, alive)
    gaps_ms = [ms(g) for g in gaps]
    requests = sum((after - before).values())
    return {"store": session.store.name, "handoffs": len(gaps), "p50_ms": pct(gaps_ms, 0.5),
            "p99_ms": pct(gaps_ms, 0.99), "max_ms": max(gaps_ms, default=float("nan")),
            "requests_per_handoff": requests / len(gaps) if gaps else None, "most_at_once": most,
            "overlaps": overlaps, "bad_exits": bad_exits, "failure": failure}


def report(rows: list) -> str:
    lines = ["## 9. Semaphores: handoffs and the herd with `--slots 3` (bench/slots.py)", "",
             f"Three `--wait --slots {SLOTS}` holders keep the slots while {WAITERS} more `--wait --slots {SLOTS}` "
             f"runs start and settle ({SETTLE:g} s); then the holders get SIGTERM and each waiter in turn holds a "
             f"slot for `--run-for {HOLD}`. Gap: each START minus the latest STOP before it in the same slot. "
             "Requests per handoff: every run's store requests while the waiters take their turns, over the "
             "handoffs (compare section 2b, one lock and 100 waiters). Most at once: children alive at one "
             "instant, all slots together.", ""]
    table = []
    for r in rows:
        if "handoffs" not in r:
            table.append([r["store"], "", "", "", "", "", "", "", r.get("failure", "")])
            continue
        table.append([r["store"], r["handoffs"], fmt(r["p50_ms"]), fmt(r["p99_ms"]), fmt(r["max_ms"]),
                      fmt(r["requests_per_handoff"]), r["most_at_once"], r["overlaps"], r["failure"] or ""])
    lines += [md_table(["store", "handoffs", "p50 ms", "p99 ms", "max ms", "requests per handoff", "most at once",
                          "overlaps", "failure"], table), ""]
    return "\n".join(lines)


def main() -> int:
    args = section_args(__doc__)
    rows = []
    wanted = lambda s: s.name in PUSH_STORES and (not args.store or s.name in args.store)  # noqa: E731
    for session in each_session(wanted, "leaderrun-slots-"):
        try:
            rows.append(fig_slots(session, f"{MARK}-fig"))
        except Exception as err:
            rows.append({"store": session.store.name, "failure": repr(err)})
    return write_section(report(rows), args.out)


if __name__ == "__main__":
    sys.exit(main())
