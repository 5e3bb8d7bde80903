"""The report: the machine, section 0 (build), the goals, sections 1 to 6 and section 7."""

from __future__ import annotations

import datetime
import os
import subprocess
from pathlib import Path
from typing import Optional

from .build import LEADERRUN, ROOT, stripped_size
from .clusters import cluster_section
from .failover import failover_table
from .goals import goals
from .handoff import handoff_table
from .stats import fmt, md_table, mib
from .stores import FIGURES


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def out(argv, cwd=None) -> str:
        try:
            return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = out(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT) or "unknown"
    dirty = out(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT)
    mem_kib = status_kib_meminfo()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory": f"{mem_kib / 1048576:.0f} GiB" if mem_kib else "unknown",
        "kernel": f"{os.uname().sysname} {os.uname().release}",
        "commit": commit + (" (+ uncommitted changes)" if dirty else ""),
        "leaderrun": out([str(LEADERRUN), "--version"]),
        "hyperfine": out(["hyperfine", "--version"]),
        "rustc": out(["rustc", "--version"]),
        "load": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
        "binary_bytes": LEADERRUN.stat().st_size if LEADERRUN.exists() else None,
        "stripped_bytes": stripped_size(LEADERRUN),
    }


def status_kib_meminfo() -> Optional[int]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def report(results: dict, m: dict, cfg: dict, mode: str, load_before: str) -> str:
    parts = [
        "# leaderrun benchmarks",
        "",
        f"Written by `python3 bench/bench.py{' --quick' if mode == 'quick' else ''}` on {m['date']} ({mode} run). "
        "What each figure means and how it is measured: [bench/README.md](bench/README.md). "
        "The machine is shared and noisy: these are observations, not guarantees, and nothing here is asserted.",
        "",
        md_table(["machine", ""], [
            ["date", m["date"]],
            ["nproc", m["nproc"]],
            ["CPU", m["cpu"]],
            ["memory", m["memory"]],
            ["kernel", m["kernel"]],
            ["leaderrun commit", m["commit"]],
            ["binaries", f"{m['leaderrun']}, release profile ({m['rustc']})"],
            ["hyperfine", m["hyperfine"]],
            ["load average before / after", f"{load_before} / {m['load']}"],
        ]),
        "",
    ]

    size = lambda b: "—" if b is None else f"{b / 1e6:.2f} MB"
    parts += ["## 0. Build", "",
              md_table(["", ""], [
                  ["release binary (every store)", size(m.get("binary_bytes"))],
                  ["stripped", size(m.get("stripped_bytes"))],
                  ["clean release build (`cargo build --release --locked`, every dependency)",
                   f"{m['build_seconds']:.0f} s on {m['nproc']} cores" if m.get("build_seconds") else
                   "not measured in this run (`bench.py --build-time`)"],
              ]), ""]
    if any(results.get(f) for f in FIGURES):  # not with --clusters-only
        parts += goals(results, m, cfg)
        parts += store_sections(results, cfg)
    parts += cluster_section(results, cfg)
    return "\n".join(parts)


def store_sections(results: dict, cfg: dict) -> list:
    """Sections 1 to 6: one row per store (one server each)."""
    parts = []
    parts += ["## 1. Start-to-exit overhead of a one-shot run", "",
              f"`leaderrun --store URL --min-hold 0s --lock NAME -- true`, next to `true` and `flock FILE true` "
              f"in the same `hyperfine -N` run ({cfg['hf_warmup']} warm-up runs, {cfg['hf_runs']} measured per command). "
              "Ratios are of medians. Requests: store requests one such run makes (counted with `-vvv`).", ""]
    for run in results["overhead"]:
        if "error" in run:
            parts += [f"Store: **{run['store']}**: {run['error']}", ""]
            continue
        rows = []
        for r in run["rows"]:
            req = "—"
            if r["requests"] is not None:
                req = f"{r['requests']} (" + ", ".join(f"{k} {v}" for k, v in sorted(r["requests_by_op"].items())) + ")"
            rows.append([f"`{r['command']}`" if r["command"] in ("true", "flock FILE true") else r["command"],
                         fmt(r["median_ms"], 2), f"{fmt(r['mean_ms'], 2)} ± {fmt(r['stddev_ms'], 2)}",
                         fmt(r["min_ms"], 2), fmt(r["x_true"], 1) + "×", fmt(r["x_flock"], 1) + "×", req])
        parts += [f"Store: **{run['store']}**", "",
                  md_table(["command", "median ms", "mean ± σ ms", "min ms", "vs true", "vs flock", "store requests"], rows), ""]

    parts += ["## 2. Clean handoff", "",
              f"A `--wait` holder's child (the probe, `--run-for {cfg['handoff_hold']}`) exits; the gap is until the "
              "next `--wait` peer's child starts (its START minus the holder's STOP, both CLOCK_MONOTONIC). "
              f"Chained: each waiter becomes the next holder.", ""]
    parts += [handoff_table(results["handoff"]), ""]
    parts += ["Requests per handoff: every run's store requests (`-vvv`: its acquire, its renewals while it holds, its "
              "release) divided by the handoffs.", ""]

    parts += ["### 2b. Clean handoff with many waiters on one lock", "",
              f"A holder keeps the lock while {cfg['herd']} `--wait` runs start and settle ({cfg['herd_settle']:g} s); "
              f"then it is stopped and each waiter in turn holds the lock for `--run-for {cfg['herd_hold']}`. Gap: each "
              "START minus the latest STOP before it. Requests per handoff: the store requests of every run (all "
              "the waiters re-reading, or not, on each release) over the handoffs.", ""]
    rows = []
    for r in results.get("herd", []):
        if "error" in r or ("n" not in r):
            rows.append([r["label"], *["—"] * 7, r.get("error") or r.get("failure")])
            continue
        per = r.get("requests_per_handoff")
        rows.append([r["label"], r["waiters"], r["n"], fmt(r["p50_ms"]), fmt(r["p99_ms"]), fmt(r["max_ms"]),
                     "—" if per is None else fmt(per), r["overlaps"], r["failure"] or ""])
    parts += [md_table(["row", "waiters", "handoffs", "p50 ms", "p99 ms", "max ms", "requests per handoff",
                        "overlaps", "failure"], rows), ""]

    parts += ["## 3. Crash failover (kill -9 of the holder's wrapper)", "",
              "The holder's wrapper (not its child) gets SIGKILL at a random point of its renewal cycle. "
              "Takeover: until the `--wait` peer's child STARTs. Old child: until the killed holder's child logged "
              "STOP (its watchdog's stop signal) and until its pid was gone (polled every ~1 ms). All from the kill.", ""]
    parts += [failover_table(results["failover"]), ""]
    own = [r["label"] for r in results["failover"] if "ttl" in r and (r["ttl"], r["renew_every"], r["kill_after"]) !=
           (cfg["failover_ttl"], cfg["failover_renew"], cfg["failover_kill_after"])]
    if own:
        parts += ["Timings of their own (the ttl / renew / kill-after column), where the store's leases cannot be "
                  "that short: " + ", ".join(own) + ".", ""]

    parts += ["## 4. Store requests of an idle standby", "",
              "One holder with a long child and one `--wait -vvv` standby (default timings); the standby's "
              "`store request` trace lines counted over the window.", ""]
    rows = []
    for r in results["standby"]:
        if "failure" in r or "error" in r:
            rows.append([r["label"], "—", "—", "—", r.get("failure") or r["error"], "—"])
            continue
        rows.append([r["label"], fmt(r["seconds"]), r["requests"], fmt(r["per_second"], 2),
                     ", ".join(f"{k} {v}/s" for k, v in r["by_op"].items()),
                     "—" if r.get("syscalls") is None else r["syscalls"]])
    parts += [md_table(["row", "window s", "requests", "requests/s", "by op",
                        f"system calls in {cfg['strace_seconds']:g} s"], rows), ""]
    parts += [f"System calls: every thread of the standby's wrapper, `strace -c -f -p` for {cfg['strace_seconds']:g} s "
              "after the request window (its `-vvv` trace writes included when it makes requests).", ""]

    parts += ["## 5. Memory", "",
              f"VmHWM (peak resident set) from /proc/PID/status while the child runs, sampled "
              f"{cfg['memory_after']:g} s after the child started with `--ttl {cfg['memory_ttl']} --renew-every "
              f"{cfg['memory_renew']}` (so after several renewals); current VmRSS in brackets.", ""]
    rows = []
    for r in results["memory"]:
        if "failure" in r or "error" in r:
            rows.append([r["label"], r.get("failure") or r["error"], "—", "—", "—"])
            continue
        rows.append([r["label"], f"{mib(r['wrapper_hwm_kib'])} ({mib(r['wrapper_rss_kib'])})",
                     f"{mib(r['watchdog_hwm_kib'])} ({mib(r['watchdog_rss_kib'])})",
                     f"{mib(r['standby_hwm_kib'])} ({mib(r['standby_rss_kib'])})", r["renewals"]])
    parts += [md_table(["row", "wrapper MiB", "watchdog MiB", "standby wrapper MiB", "renewals before sampling"], rows), ""]
    # A store whose leases cannot be that short ran with its own timings (stores.STORE_TIMINGS).
    own = [f"{r['label']}: `--ttl {r['ttl']} --renew-every {r['renew_every']}`, sampled {r['sampled_after_s']:g} s "
           "after the child started" for r in results["memory"]
           if "ttl" in r and (r["ttl"], r["renew_every"], r["sampled_after_s"]) !=
           (cfg["memory_ttl"], cfg["memory_renew"], cfg["memory_after"])]
    if own:
        parts += ["Timings of their own, where the store's leases cannot be that short: " + "; ".join(own) + ".", ""]

    parts += ["## 6. What the child sees, next to `etcdctl lock`", "",
              "A one-shot run whose child exits 7: the wrapper's exit status. Then a holder whose etcd lease "
              "is revoked under it (every lease on the server, as when a lease lapses in a partition): whether "
              f"its child is stopped, and when (watched for {cfg['contract_patience']:g} s).", ""]
    rows = []
    for r in results["contract"]:
        if "failure" in r or "error" in r:
            rows.append([r["label"], r.get("exit_7", "—"), r.get("failure") or r["error"], "—"])
            continue
        after = (f"stopped after {r['stopped_after_s'] * 1e3:.0f} ms (ttl {r['ttl']})" if r["ttl"] else
                 f"stopped after {r['stopped_after_s'] * 1e3:.0f} ms") if r["stopped_after_s"] is not None else \
            f"still running {cfg['contract_patience']:g} s later"
        rows.append([r["label"], r["exit_7"], after, r["wrapper_exit"] if r["wrapper_exit"] is not None else "still running"])
    parts += [md_table(["row", "child exits 7, wrapper exits", "child after its lease is revoked", "wrapper exits"], rows), ""]
    return parts
