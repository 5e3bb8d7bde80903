#!/usr/bin/env python3
"""Benchmarks for leaderrun: `python3 bench/bench.py [--quick]`.

Builds the release binaries, then measures, for every store of the registry that has a test server (one table
row each):

  1. overhead   start-to-exit of a one-shot run, next to `true` and `flock FILE true`
                in the same hyperfine run (ratios from that run)
  2. handoff    a holder's child exits -> a --wait peer's child starts
  3. failover   kill -9 of the holder's wrapper -> a --wait peer's child starts;
                and how long the old child lived on
  4. standby    store requests per second made by one idle --wait standby
  5. memory     peak RSS (VmHWM) of the wrapper, its watchdog, and a standby
  6. contract   what the child sees, next to `etcdctl lock`
  7. clusters   3-node etcd, NATS and ZooKeeper: handoff and failover on the cluster
                URL, a node killed or frozen under a holder (false losses), one-shot
                runs while a node is down (--clusters-only runs this alone)

It prints the tables and writes BENCHMARKS.md at the repository root (a --quick run
writes only where --out says). It reports figures; it never asserts speed.
bench/README.md says what each figure means and how it is measured.

The code is the package bench/leaderbench/, one module per section (overhead.py,
handoff.py, failover.py, standby.py, memory.py, contract.py, clusters.py) and what they
share (stores.py, servers.py, procs.py, probe.py, stats.py, report.py, goals.py). The
servers are the tests' own (tests/servers/), started by `leaderrun-serve` (bench/serve.rs).

Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from leaderbench.build import ROOT, clean_build_seconds, prepare
from leaderbench.procs import MARK, Procs
from leaderbench.report import machine, report
from leaderbench.run import run_all
from leaderbench.stats import say

FULL = dict(hf_warmup=30, hf_runs=300, handoffs=200, handoff_hold="150ms", herd=100, herd_hold="20ms",
            herd_settle=8.0, failovers=10,
            failover_ttl="2s", failover_renew="500ms", failover_kill_after="500ms",
            standby_settle=1.0, standby_seconds=10.0, strace_seconds=3.0, memory_ttl="3s", memory_renew="250ms", memory_after=1.6,
            contract_ttl="3s", contract_kill_after="1s", contract_patience=15.0,
            # Section 7 (clusters): handoffs on the cluster URL; reps of each node fault, each
            # watched `cluster_watch` s (a freeze lasts `cluster_freeze` s), the fault
            # `cluster_fault_after` s after the holder's child started; one-shot runs.
            cluster_handoffs=100, cluster_reps=3, cluster_watch=20.0, cluster_freeze=10.0, cluster_fault_after=1.0,
            cluster_oneshots=5, cluster_follower_oneshots=5, cluster_failover_trials=10)
QUICK = dict(FULL, hf_warmup=5, hf_runs=40, handoffs=30, herd=20, herd_settle=4.0, failovers=3, standby_seconds=3.0,
             cluster_handoffs=20, cluster_reps=1, cluster_oneshots=2, cluster_failover_trials=3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke test, ~30 s, + ~5 min of clusters); writes BENCHMARKS.md only with --out")
    ap.add_argument("--out", type=Path, help="where to write the report (default: BENCHMARKS.md at the repository root; none for --quick)")
    ap.add_argument("--store", action="append",
                    help="only this store (repeatable); etcd, nats, zookeeper also select their 3-node cluster")
    ap.add_argument("--clusters-only", action="store_true", help="only section 7, the 3-node clusters")
    ap.add_argument("--no-clusters", action="store_true", help="skip section 7, the 3-node clusters")
    ap.add_argument("--no-build", action="store_true", help="use the release binaries as they are")
    ap.add_argument("--json", type=Path, help="also write every raw figure as JSON here")
    ap.add_argument("--build-time", action="store_true", help="also time a clean release build (several minutes)")
    args = ap.parse_args()
    if args.clusters_only and args.no_clusters:
        ap.error("--clusters-only and --no-clusters exclude each other")
    cfg = QUICK if args.quick else FULL
    mode = "quick" if args.quick else "full"
    out = args.out if args.out else (None if args.quick else ROOT / "BENCHMARKS.md")

    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def on_signal(signum, _frame):
        for s in stop_signals:  # a second signal must not cut the cleanup short
            signal.signal(s, signal.SIG_IGN)
        say(f"bench.py: got signal {signum}; stopping every process it started")
        raise SystemExit(128 + signum)

    for s in stop_signals:
        signal.signal(s, on_signal)

    prepare(build=not args.no_build)
    build_seconds = clean_build_seconds() if args.build_time else None
    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    tmp = Path(tempfile.mkdtemp(prefix="leaderrun-bench-"))
    started = time.monotonic()
    try:
        results = run_all(cfg, set(args.store) if args.store else None, tmp,
                          singles=not args.clusters_only, clusters=not args.no_clusters)
    finally:
        # Whatever happened: no process of ours outlives the script.
        Procs(MARK).cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    m = machine()
    m["build_seconds"] = build_seconds
    text = report(results, m, cfg, mode, load_before)
    print(text)
    say(f"total {time.monotonic() - started:.0f} s")
    if out:
        out.write_text(text)
        say(f"wrote {out}")
    if args.json:
        args.json.write_text(json.dumps({"mode": mode, "config": cfg, "results": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
