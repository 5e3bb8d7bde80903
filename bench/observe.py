#!/usr/bin/env python3
"""Section 8 of BENCHMARKS.md: what watching the election costs (issue 23).

8a. `leaderrun check` in a child (answered from the parent's lease file) next to
    `leaderrun status` (a read of the store), `true` and `flock FILE true`, with hyperfine,
    from inside a leaderrun child.
8b. `leaderrun watch -vvv` on a lock whose holder renews: the store requests it makes per
    second while nothing else changes, per store.

It reuses bench.py's package, bench/leaderbench/ (its servers, the same release binary, the same
Procs sweep). Run:
    python3 bench/observe.py [--store NAME ...] [--no-build] [--out FILE]
"""

import json
import subprocess
import sys
import time

from leaderbench.build import LEADERRUN
from leaderbench.probe import count_requests
from leaderbench.procs import MARK, Procs
from leaderbench.run import each_session, section_args, write_section
from leaderbench.stats import fmt, lock_name, md_table
from leaderbench.stores import Session

CHECK_RUNS = 300
WATCH_SETTLE = 5.0
WATCH_SECONDS = 30.0
CHECK_STORES = {"sqlite", "postgres", "etcd"}


def fig_check(session: Session, mark: str) -> dict:
    """hyperfine inside a child: check (lease file) vs status (the store) vs anchors."""
    d = session.dir / "check"
    d.mkdir()
    lock, out = lock_name("check"), d / "hyperfine.json"
    lockfile = d / "flock.lock"
    bin_ = str(LEADERRUN)
    inner = ["hyperfine", "-N", "--warmup", "10", "--runs", str(CHECK_RUNS), "--export-json", str(out),
             "true", f"flock {lockfile} true", f"{bin_} check",
             f"{bin_} status --store {session.url} --lock {lock}"]
    argv = [bin_, "--store", session.url, "--lock", lock, "--ttl", "60s", "--", *inner]
    with Procs(mark) as procs, open(d / "stderr", "wb") as err, open(d / "stdout", "wb") as so:
        proc = procs.spawn(argv, stdout=so, stderr=err)
        if proc.wait(timeout=600) != 0:
            raise RuntimeError(f"hyperfine in a child failed: {(d / 'stderr').read_text()[-500:]}")
    results = json.loads(out.read_text())["results"]
    names = ["true", "flock FILE true", "check (in a child)", "status (the store)"]
    return {"store": session.store.name,
            "rows": [{"command": n, "mean_ms": r["mean"] * 1000, "median_ms": r["median"] * 1000,
                      "p95_ms": sorted(r["times"])[int(0.95 * len(r["times"])) - 1] * 1000}
                     for n, r in zip(names, results)]}


def fig_watch(session: Session, mark: str) -> dict:
    """A holder that renews (ttl 6 s: a renewal every 2 s), one `watch -vvv`: its requests."""
    d = session.dir / "watch"
    d.mkdir()
    lock = lock_name("watch")
    trace = d / "watch.stderr"
    bin_ = str(LEADERRUN)
    with Procs(mark) as procs, open(d / "holder.stderr", "wb") as herr, open(trace, "wb") as werr, \
            open(d / "watch.stdout", "wb") as wout:
        holder = procs.spawn([bin_, "--store", session.url, "--lock", lock, "--wait", "--ttl", "6s",
                              "--", "sleep", "1000"], stderr=herr)
        t = time.monotonic()
        while subprocess.run([bin_, "status", "--store", session.url, "--lock", lock],
                             capture_output=True).returncode != 0:
            if time.monotonic() - t > 60 or holder.poll() is not None:
                raise RuntimeError("the holder never took the lock: " + (d / "holder.stderr").read_text()[-300:])
            time.sleep(0.2)
        procs.spawn([bin_, "watch", "--store", session.url, "--lock", lock, "-vvv"], stdout=wout, stderr=werr)
        time.sleep(WATCH_SETTLE)
        t0, before = time.monotonic(), count_requests(trace)
        time.sleep(WATCH_SECONDS)
        t1, after = time.monotonic(), count_requests(trace)
    ops = after - before
    seconds = t1 - t0
    return {"store": session.store.name, "seconds": seconds, "requests": sum(ops.values()),
            "per_second": sum(ops.values()) / seconds,
            "by_op": {op: round(n / seconds, 2) for op, n in sorted(ops.items())}}


def report(checks: list, watches: list) -> str:
    lines = ["## 8. Watching the election (bench/observe.py)", ""]
    lines += ["### 8a. `leaderrun check` in a child, next to `status`", "",
              f"hyperfine, {CHECK_RUNS} runs each, started from inside a leaderrun child (ttl 60 s). "
              "`check` there reads the parent's lease file and the boot-time clock; `status` reads the store.", ""]
    rows = []
    for c in checks:
        if "error" in c:
            rows.append([c["store"], "error: " + c["error"], "", "", ""])
            continue
        for r in c["rows"]:
            rows.append([c["store"], r["command"], fmt(r["mean_ms"], 2), fmt(r["median_ms"], 2), fmt(r["p95_ms"], 2)])
    lines += [md_table(["store", "command", "mean ms", "median ms", "p95 ms"], rows), ""]
    lines += ["### 8b. `leaderrun watch`: store requests while nothing but renewals happens", "",
              f"A `--wait --ttl 6s` holder (a renewal every 2 s) and one `watch -vvv`; requests counted "
              f"over {WATCH_SECONDS:g} s after {WATCH_SETTLE:g} s of settling.", ""]
    rows = []
    for w in watches:
        if "error" in w:
            rows.append([w["store"], "error: " + w["error"], ""])
            continue
        by = ", ".join(f"{op} {n}/s" for op, n in w["by_op"].items()) or "-"
        rows.append([w["store"], fmt(w["per_second"], 2), by])
    lines += [md_table(["store", "requests/s", "by operation"], rows), ""]
    return "\n".join(lines)


def main() -> int:
    args = section_args(__doc__)
    checks, watches = [], []
    for session in each_session(lambda s: not args.store or s.name in args.store, "leaderrun-observe-"):
        store = session.store
        if store.name in CHECK_STORES:
            try:
                checks.append(fig_check(session, f"{MARK}-fig"))
            except Exception as err:
                checks.append({"store": store.name, "error": repr(err)})
        try:
            watches.append(fig_watch(session, f"{MARK}-fig"))
        except Exception as err:
            watches.append({"store": store.name, "error": repr(err)})
    return write_section(report(checks, watches), args.out)


if __name__ == "__main__":
    sys.exit(main())
