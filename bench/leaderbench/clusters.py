"""Section 7 (issue 22): the same wrapper on a 3-node cluster of etcd, ZooKeeper or NATS.

Figures 2 and 3 run unchanged on the cluster's URL (a Store whose URL lists the three
nodes); the figures here put a fault on one node of the store under a running holder or
right before a one-shot run, at leaderrun's default timings (ttl 15 s). The cluster is the
tests' own (tests/servers/, started by leaderrun-serve --cluster); its nodes are faulted
one at a time, so a quorum always stands."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

from .failover import failover_table, fig_failover
from .handoff import fig_handoff, handoff_table
from .probe import ProbeLog, probe_argv, why_not
from .procs import MARK, Procs
from .servers import ServedCluster
from .stats import fmt, lock_name, md_table, ms, parse_seconds, pct, redact, say, slug
from .stores import Contender, Session, Store, leaderrun_argv, leaderrun_row, open_session


NODE_FAULTS = (
    ("leader", "SIGKILL of the leader node, listed first"),
    ("follower", "SIGKILL of a follower, listed first"),
    ("freeze", "SIGSTOP of a follower, listed first, then SIGCONT"),
)


def cluster_of(session: Session) -> ServedCluster:
    return session.server


def restore(cl: ServedCluster, i: int) -> None:
    """Node i back (restarted if it was killed, thawed if frozen), and a leader elected:
    every repetition starts from a whole cluster."""
    cl.restore(i)


def prime_cluster(session: Session, procs_mark: str) -> None:
    """One one-shot run until it succeeds (at most 60 s): it makes the NATS bucket, whose
    stream is then placed on all three servers, before anything is timed."""
    deadline, last = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        with Procs(procs_mark) as procs:
            p = procs.spawn(leaderrun_argv(session.url, lock_name("prime"), ["true"], False, []),
                            stderr=subprocess.PIPE, text=True)
            _, err = p.communicate(timeout=90)
        if p.returncode == 0:
            cluster_of(session).wait_for_leader(60)
            return
        last = (err.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        time.sleep(1)
    raise RuntimeError(f"no one-shot run succeeded on the cluster within 60 s: {last}")


def fig_node_loss(session: Session, cfg: dict, procs_mark: str) -> list[dict]:
    """A node lost under a holder at the default timings. For each fault: a `--wait` holder
    whose URL lists the faulted node first, and a `--wait` standby whose URL lists another
    node first; once the holder's child runs, the fault; then `cluster_watch` seconds of
    watching. Kept: the holder's child never stopped and its wrapper never exited (a loss
    with a quorum standing is a false loss). Overlap: the standby's child started while the
    holder's ran. The node comes back, and a leader is elected, before the next rep."""
    cl = cluster_of(session)
    label = f"leaderrun {session.store.name}"
    rows = []
    for fault, what in NODE_FAULTS:
        d = session.dir / f"node-loss-{fault}"
        d.mkdir()
        kept, lost_after, exits, overlaps, standby_ran, failures = 0, [], [], 0, 0, []
        reps = 0
        with open(d / "stderr.log", "wb") as errf:
            for r in range(cfg["cluster_reps"]):
                leader = cl.wait_for_leader(60)
                if leader is None:
                    failures.append(f"rep {r}: no leader")
                    break
                target = leader if fault == "leader" else cl.follower()
                other = next(i for i in range(cl.size) if i != target)
                log, lockfile, lock = d / f"probe-{r}.log", d / f"probe-{r}.lock", lock_name(f"node-{fault}")
                probes = ProbeLog(log)
                try:
                    with Procs(procs_mark) as procs:
                        holder = procs.spawn(leaderrun_argv(cl.url_from(target), lock, probe_argv(log, lockfile, "H"),
                                                            True, []), stderr=errf)
                        if probes.wait("START", "H", 30, holder) is None:
                            failures.append(f"rep {r}: the holder's child never started: " + why_not(holder, d / "stderr.log"))
                            continue
                        standby = procs.spawn(leaderrun_argv(cl.url_from(other), lock, probe_argv(log, lockfile, "W"),
                                                             True, []), stderr=errf)
                        time.sleep(cfg["cluster_fault_after"])
                        t0 = time.monotonic()
                        cl.freeze(target) if fault == "freeze" else cl.kill(target)
                        lost = None
                        while (elapsed := time.monotonic() - t0) < cfg["cluster_watch"]:
                            if target in cl.frozen and elapsed >= cfg["cluster_freeze"]:
                                cl.thaw(target)
                            probes.poll()
                            if lost is None and ("H" in probes.stop or holder.poll() is not None):
                                lost = elapsed
                            time.sleep(0.01)
                        reps += 1
                        probes.poll()
                        if lost is None:
                            kept += 1
                        else:
                            lost_after.append(lost)
                            exits.append(holder.poll())
                        if "W" in probes.start:
                            standby_ran += 1
                            if "H" not in probes.stop or probes.start["W"] < probes.stop["H"]:
                                overlaps += 1
                        overlaps += len(probes.overlaps)
                        # The standby first, so that the holder's release hands it nothing.
                        Procs.terminate(standby)
                        Procs.terminate(holder)
                finally:
                    restore(cl, target)
                say(f"    {what}: {r + 1}/{cfg['cluster_reps']}")
        rows.append({
            "label": label, "fault": fault, "what": what, "reps": reps, "kept": kept,
            "lost_after_s": lost_after, "loss_exits": exits, "standby_ran": standby_ran, "overlaps": overlaps,
            "watch_s": cfg["cluster_watch"], "freeze_s": cfg["cluster_freeze"] if fault == "freeze" else None,
            "failures": failures,
        })
    return rows


def fig_engine_failover(session: Session, cfg: dict, procs_mark: str) -> dict:
    """The engine's own failover, which DESIGN.md §9's rule is stated in: the leader node
    (NATS: the bucket stream's leader) SIGKILLed, then the time until another node says it
    leads, polled every 50 ms. No leaderrun process is involved. The node comes back and a
    leader is elected before the next trial."""
    cl = cluster_of(session)
    took, failures = [], []
    for r in range(cfg["cluster_failover_trials"]):
        leader = cl.wait_for_leader(60)
        if leader is None:
            failures.append(f"trial {r}: no leader")
            break
        try:
            t_kill = time.monotonic_ns()
            cl.kill(leader)
            deadline = time.monotonic() + 60
            new = None
            while new is None and time.monotonic() < deadline:
                new = cl.leader()
                if new is None:
                    time.sleep(0.05)
            if new is None:
                failures.append(f"trial {r}: no new leader within 60 s")
            else:
                took.append(ms(time.monotonic_ns() - t_kill))
        finally:
            restore(cl, leader)
    return {"label": f"leaderrun {session.store.name}", "n": len(took), "min_ms": min(took, default=math.nan),
            "p50_ms": pct(took, 0.5), "max_ms": max(took, default=math.nan), "failures": failures}


def fig_oneshot_election(session: Session, cfg: dict, procs_mark: str) -> dict:
    """One-shot runs while the store is short of a node. (1) The leader is SIGKILLed and a
    one-shot run, listing it first, is started at once: its exit status and the time from
    the kill to its child's START (an election in between). (2) A follower is SIGKILLed
    and `cluster_follower_oneshots` one-shot runs list it first, one after the other: how
    many ran their child and exited 0."""
    cl = cluster_of(session)
    d = session.dir / "oneshot"
    d.mkdir()
    log, lockfile = d / "probe.log", d / "probe.lock"
    probes = ProbeLog(log)
    to_start, spawn_lag, exits, failures = [], [], [], []
    with open(d / "stderr.log", "wb") as errf:
        for r in range(cfg["cluster_oneshots"]):
            leader = cl.wait_for_leader(60)
            if leader is None:
                failures.append(f"rep {r}: no leader")
                break
            url, pid = cl.url_from(leader), cl.pid(leader)
            try:
                with Procs(procs_mark) as procs:
                    t_kill = time.monotonic_ns()
                    # The run is spawned right after the signal, not after the node is reaped
                    # (a JVM takes tens of ms to go away).
                    os.kill(pid, signal.SIGKILL)
                    p = procs.spawn(leaderrun_argv(url, lock_name("oneshot"), probe_argv(log, lockfile, f"L{r}",
                                                                                            run_for="100ms"), False, []),
                                    stderr=errf)
                    spawn_lag.append(ms(time.monotonic_ns() - t_kill))
                    cl.kill(leader)  # reaps it
                    started = probes.wait("START", f"L{r}", 90, p)
                    try:
                        exits.append(p.wait(90))
                    except subprocess.TimeoutExpired:
                        exits.append(None)
                    if started is not None:
                        to_start.append(ms(started - t_kill))
                    else:
                        failures.append(f"rep {r}: no START: " + why_not(p, d / "stderr.log"))
            finally:
                restore(cl, leader)
            say(f"    one-shot after a leader kill: {r + 1}/{cfg['cluster_oneshots']}")

        follower_ok, follower_ms, follower_exits = 0, [], []
        n = cfg["cluster_follower_oneshots"]
        if cl.wait_for_leader(60) is not None:
            down = cl.follower()
            try:
                cl.kill(down)
                cl.wait_for_leader(60)
                for k in range(n):
                    t = time.monotonic_ns()
                    with Procs(procs_mark) as procs:
                        p = procs.spawn(leaderrun_argv(cl.url_from(down), lock_name("oneshot-f"),
                                                       probe_argv(log, lockfile, f"F{k}", run_for="10ms"), False, []),
                                        stderr=errf)
                        try:
                            status = p.wait(90)
                        except subprocess.TimeoutExpired:
                            status = None
                    probes.poll()
                    follower_exits.append(status)
                    if status == 0 and f"F{k}" in probes.start:
                        follower_ok += 1
                        follower_ms.append(ms(time.monotonic_ns() - t))
            finally:
                restore(cl, down)
    return {
        "label": f"leaderrun {session.store.name}",
        "n": len(exits),
        "exits": exits,
        "spawn_lag_max_ms": max(spawn_lag, default=math.nan),
        "to_start_p50_ms": pct(to_start, 0.5),
        "to_start_max_ms": max(to_start, default=math.nan),
        "follower_down_ok": follower_ok,
        "follower_down_runs": len(follower_exits),
        "follower_down_exits": follower_exits,
        "follower_down_p50_ms": pct(follower_ms, 0.5),
        "overlaps": len(probes.overlaps),
        "failures": failures,
        "to_start_ms": to_start,
    }


def etcdctl_lock_ttl(s: Session, lock: str, child: list, wait: bool, flags: list) -> list:
    """`etcdctl lock` on every endpoint, its session ttl taken from leaderrun's --ttl (in whole
    seconds): its takeover is then comparable (its default, 10 s in etcdctl 3.4, would make
    each failover rep last 10 s)."""
    argv = ["etcdctl", f"--endpoints={s.info['endpoints']}", "lock"]
    if "--ttl" in flags:
        argv.append(f"--ttl={max(1, round(parse_seconds(flags[flags.index('--ttl') + 1])))}")
    return argv + [lock, "--", *map(str, child)]


CLUSTER_NOTE = ("the tests' clusters (tests/servers/): etcd 3.4, members with the default heartbeat (100 ms) "
                "and election timeout (1 s), --unsafe-no-fsync; ZooKeeper 3.8, tickTime 500 ms, initLimit 10, "
                "syncLimit 5, maxSessionTimeout 40 s; NATS 2.15 JetStream, sync_interval always, one user, the "
                "bucket made with ?replicas=3")


CLUSTERS: list[Store] = [
    Store("etcd cluster", "etcd", cluster=True,
          note="3 etcd 3.4 members on loopback, default election timings, --unsafe-no-fsync"),
    Store("nats cluster", "nats", cluster=True,
          note="3 NATS 2.15 servers with JetStream on loopback, sync_interval always, bucket ?replicas=3"),
    Store("zookeeper cluster", "zookeeper", cluster=True, note="3 ZooKeeper 3.8 servers on loopback, tickTime 500 ms"),
]


# Next to leaderrun on a cluster: `etcdctl lock` on all three etcd endpoints, in the crash
# failover only (it has no watchdog: its old child is never stopped).
CLUSTER_ANCHORS: list[Contender] = [
    Contender("etcdctl lock, etcd cluster", "etcd cluster", etcdctl_lock_ttl, figures=frozenset({"failover"})),
]


CLUSTER_FIGURES = ("cluster_handoff", "cluster_failover", "cluster_node_loss", "cluster_oneshot", "cluster_engine")


def run_clusters(cfg: dict, only: Optional[set], tmp: Path, results: dict) -> None:
    """Section 7: each engine's 3-node cluster in turn; its figures go into `results`. A
    `--store` filter names the engine (`etcd` selects both `etcd` and `etcd cluster`)."""
    for key in CLUSTER_FIGURES:
        results.setdefault(key, [])
    fig_mark = f"{MARK}-fig"
    for store in CLUSTERS:
        engine = store.name.split()[0]
        if only and engine not in only and store.name not in only:
            continue
        t = time.monotonic()
        say(f"[{store.name}] starting 3 nodes")
        label = f"leaderrun {store.name}"

        session = None
        try:
            session = open_session(store, tmp, dirname=slug(store.name))
            prime_cluster(session, fig_mark)
        except Exception as err:
            say(f"[{store.name}] could not start the cluster: {err!r}")
            secret = session.info.get("secret") if session else None
            for key in CLUSTER_FIGURES:
                results[key].append(redact({"label": label, "store": store.name,
                                            "error": f"cluster did not start: {err}"}, secret))
            if session is not None:
                session.close()
            continue
        secret = session.info.get("secret")

        def attempt(key: str, what: str, run: Callable[[], object]) -> None:
            try:
                out = run()
                results[key] += redact(out if isinstance(out, list) else [out], secret)
            except Exception as err:
                say(f"[{store.name}] {what}: FAILED: {redact(repr(err), secret)}")
                results[key].append(redact({"label": what, "store": store.name,
                                            "error": f"{type(err).__name__}: {err}"}, secret))
            try:  # whatever happened, the next figure starts from a whole cluster with a leader
                for i in range(cluster_of(session).size):
                    restore(cluster_of(session), i)
            except Exception as err:
                say(f"[{store.name}] could not restore the cluster: {err!r}")

        try:
            row = leaderrun_row(store)
            say(f"[{store.name}] 7a. handoff, {cfg['cluster_handoffs']} handoffs")
            attempt("cluster_handoff", label,
                    lambda: fig_handoff(session, row, dict(cfg, handoffs=cfg["cluster_handoffs"]), fig_mark))
            for c in [row] + [a for a in CLUSTER_ANCHORS if a.store == store.name]:
                say(f"[{store.name}] 7a. failover: {c.label}, {cfg['failovers']} kill -9")
                attempt("cluster_failover", c.label, lambda: fig_failover(session, c, cfg, fig_mark))
            say(f"[{store.name}] 7b. a node lost under a holder, {cfg['cluster_reps']} reps per fault")
            attempt("cluster_node_loss", label, lambda: fig_node_loss(session, cfg, fig_mark))
            say(f"[{store.name}] 7c. one-shot runs short of a node")
            attempt("cluster_oneshot", label, lambda: fig_oneshot_election(session, cfg, fig_mark))
            say(f"[{store.name}] 7d. the engine's failover, {cfg['cluster_failover_trials']} leader kills")
            attempt("cluster_engine", label, lambda: fig_engine_failover(session, cfg, fig_mark))
        finally:
            try:
                session.close()
            except Exception as err:
                say(f"[{store.name}] stopping the cluster failed: {err!r}")
        say(f"[{store.name}] done in {time.monotonic() - t:.0f} s")


def tidy_failures(failures: list) -> str:
    """Failure messages for a table cell: store URLs (node ports change every run) said as
    URL, and the same message repeated over reps said once with a count."""
    said = Counter(re.sub(r"\b(?:etcd|zk|nats)://\S+?(?=:? )", "URL", re.sub(r"^rep \d+: ", "", f)) for f in failures)
    return "; ".join(text if n == 1 else f"{n}× {text}" for text, n in said.items())


def cluster_section(results: dict, cfg: dict) -> list:
    """Section 7: the 3-node clusters (issue 22); nothing when none ran."""
    if not any(results.get(key) for key in CLUSTER_FIGURES):
        return []
    parts = ["## 7. Clusters: three nodes, one of them lost", "",
             "Each of etcd, NATS and ZooKeeper as three nodes on loopback, every node its own process, ports and "
             f"directory: {CLUSTER_NOTE}. The URL lists all three (`etcd://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`, "
             "`zk://…`, `nats://leaderrun:***@127.0.0.1:P1,…/bench?replicas=3`); the order says which node a "
             "client tries first. A fault hits one node at a time, so a quorum always stands: SIGKILL (a crash "
             "of its host; it is started again with the same ports and data) or SIGSTOP (a stalled host: its "
             "connections stay open and requests to it hang, then SIGCONT). Every repetition starts with the "
             "three nodes up and a leader elected. The leader is etcd's Raft leader, ZooKeeper's leader, and "
             "for NATS the leader of the bucket's stream (`KV_bench`), which is what a lease's writes go through.",
             ""]

    parts += ["### 7a. Clean handoff and crash failover on a cluster", "",
              f"Figures 2 and 3 as they are, on the cluster's URL, with no node faulted: {cfg['cluster_handoffs']} "
              f"chained handoffs (`--run-for {cfg['handoff_hold']}`), then {cfg['failovers']} kill -9 of the "
              "holder's wrapper at the same timings as figure 3.", ""]
    if results.get("cluster_handoff"):
        parts += [handoff_table(results["cluster_handoff"]), ""]
    if results.get("cluster_failover"):
        parts += [failover_table(results["cluster_failover"]), ""]
        if any(r["label"].startswith("etcdctl") for r in results["cluster_failover"]):
            parts += ["`etcdctl lock, etcd cluster`: `etcdctl --endpoints=<all three> lock --ttl=N`, its session ttl "
                      "the same whole seconds as leaderrun's `--ttl` (its own default is 10 s in etcdctl 3.4), so the "
                      "takeovers compare. It has no watchdog: nothing stops the old child when its wrapper dies (the "
                      "old-child columns), so the standby's child starts beside it (the overlaps column).", ""]

    parts += ["### 7b. A node lost under a holder, at the default timings", "",
              "A `--wait` holder with no timing flags (ttl 15 s, a renewal every 5 s; on the replicated NATS bucket "
              "35 s and 11.7 s, the defaults there since its stream's election may take 15 s) whose URL lists the faulted "
              "node first, and a `--wait` standby on the same lock whose URL lists another node first. "
              f"{cfg['cluster_fault_after']:g} s after the holder's child started, the fault; then "
              f"{cfg['cluster_watch']:g} s watched (a frozen node is thawed after {cfg['cluster_freeze']:g} s). "
              "**Kept**: the holder's child never stopped and its wrapper never exited in the window. With a "
              "quorum standing throughout, a loss is a false loss (DESIGN.md §9: a node lost or frozen must cost no "
              "lease whose ttl exceeds the engine's failover plus two renewals). Lost after: from the fault to the "
              "child's STOP or the wrapper's exit, whichever came first; the wrapper's exit status then (75: lease "
              "lost). Overlaps: the standby's child running while the holder's did (must be 0).", ""]
    rows = []
    for r in results.get("cluster_node_loss", []):
        if "error" in r:
            rows.append([r["label"], "—", "—", "—", "—", "—", "—", r["error"]])
            continue
        rows.append([r["label"], r["what"], f"{r['kept']}/{r['reps']}",
                     ", ".join(f"{x:.1f}" for x in r["lost_after_s"]) or "—",
                     ", ".join("running" if x is None else str(x) for x in r["loss_exits"]) or "—",
                     r["standby_ran"], r["overlaps"], tidy_failures(r["failures"])])
    parts += [md_table(["row", "fault", "kept", "lost after s", "wrapper exit on loss", "standby's child ran",
                        "overlaps", "failures"], rows), ""]

    parts += ["### 7c. One-shot runs short of a node", "",
              "A one-shot run (`--min-hold 0s`, the probe as its child for 100 ms) started right after the leader "
              "node is SIGKILLed (the spawn's lag after the kill is in the table), its URL listing the killed node "
              "first: each run's exit status, and the time from the kill to its child's START (an election lies "
              "in between: DESIGN.md §9 has a one-shot run ride it out before it exits 69). Then, with a follower "
              f"SIGKILLed and listed first, {cfg['cluster_follower_oneshots']} one-shot runs one after the other: "
              "how many ran their child and exited 0, and their median start-to-exit time.", ""]
    rows = []
    for r in results.get("cluster_oneshot", []):
        if "error" in r:
            rows.append([r["label"], "—", "—", "—", "—", "—", "—", "—", r["error"]])
            continue
        rows.append([r["label"], r["n"], ", ".join("none (timed out)" if x is None else str(x) for x in r["exits"]),
                     fmt(r["to_start_p50_ms"], 0), fmt(r["to_start_max_ms"], 0), fmt(r["spawn_lag_max_ms"]),
                     f"{r['follower_down_ok']}/{r['follower_down_runs']}" +
                     ("" if r["follower_down_ok"] == r["follower_down_runs"] else
                      " (exits " + ", ".join("none" if x is None else str(x) for x in r["follower_down_exits"]) + ")"),
                     fmt(r["follower_down_p50_ms"], 0),
                     tidy_failures(r["failures"] + ([f"{r['overlaps']} overlaps"] if r["overlaps"] else []))])
    parts += [md_table(["row", "leader killed: runs", "exit statuses", "kill → START p50 ms", "max ms",
                        "spawned ≤ ms after the kill", "follower down, listed first: exit 0",
                        "its start-to-exit p50 ms", "failures"], rows), ""]

    parts += ["### 7d. The engine's own failover", "",
              f"The leader node SIGKILLed ({cfg['cluster_failover_trials']} trials; NATS: the bucket stream's "
              "leader) and the time until another node says it leads, polled every 50 ms, with no leaderrun "
              "process involved: the failover time in DESIGN.md §9's rule (a node's loss costs no lease whose ttl "
              "exceeds it plus two renewal attempts). ZooKeeper's session move to another server, which the rule "
              "also counts there, is not in this figure: see docs/stores/zookeeper.md.", ""]
    rows = []
    for r in results.get("cluster_engine", []):
        if "error" in r:
            rows.append([r["label"], "—", "—", "—", "—", r["error"]])
            continue
        rows.append([r["label"], r["n"], fmt(r["min_ms"], 0), fmt(r["p50_ms"], 0), fmt(r["max_ms"], 0),
                     tidy_failures(r["failures"])])
    parts += [md_table(["row", "trials", "new leader min ms", "p50 ms", "max ms", "failures"], rows), ""]
    return parts
