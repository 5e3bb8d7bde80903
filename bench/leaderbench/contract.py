"""Figure 6: what the child sees (its exit status passed on; stopped when the lease is
lost), next to `etcdctl lock`."""

from __future__ import annotations

import subprocess
import time

from .procs import Procs, pid_alive
from .stats import lock_name, slug
from .stores import Contender, Session


def revoke_every_etcd_lease(endpoint: str) -> int:
    """Revoke every lease the etcd server has (as when they lapse); returns how many."""
    listed = subprocess.run(["etcdctl", f"--endpoints={endpoint}", "lease", "list"],
                            capture_output=True, text=True, check=True).stdout.split()
    ids = [word for word in listed[1:] if all(ch in "0123456789abcdef" for ch in word) and word != "found"]
    for lease in ids:
        subprocess.run(["etcdctl", f"--endpoints={endpoint}", "lease", "revoke", lease],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return len(ids)


def fig_contract(session: Session, c: Contender, cfg: dict, procs_mark: str) -> dict:
    """What the child sees, next to the anchor: (1) a one-shot run whose child exits 7 — what
    the wrapper exits with; (2) a holder whose etcd lease is revoked under it (as when it lapses
    in a partition) — whether its child is stopped, and how soon."""
    d = session.dir / f"contract-{slug(c.label)}"
    d.mkdir()
    flags = ["--ttl", cfg["contract_ttl"], "--kill-after", cfg["contract_kill_after"]] if c.is_leaderrun else []
    exit_7 = subprocess.run(c.command(session, lock_name("exit7"), ["sh", "-c", "exit 7"], False, flags),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60).returncode
    pidfile = d / "child.pid"
    child = ["sh", "-c", f'echo $$ > "{pidfile}.tmp"; mv "{pidfile}.tmp" "{pidfile}"; exec sleep 1000']
    with open(d / "holder.stderr", "wb") as errf, Procs(procs_mark) as procs:
        holder = procs.spawn(c.command(session, lock_name("loss"), child, True, flags), stderr=errf)
        deadline = time.monotonic() + 20
        while not pidfile.exists():
            if time.monotonic() > deadline or holder.poll() is not None:
                return {"label": c.label, "exit_7": exit_7, "failure": "the child never started"}
            time.sleep(0.01)
        pid = int(pidfile.read_text())
        revoked_at = time.monotonic()
        revoked = revoke_every_etcd_lease(session.info["endpoints"])
        stopped_after = None
        while time.monotonic() - revoked_at < cfg["contract_patience"]:
            if not pid_alive(pid):
                stopped_after = time.monotonic() - revoked_at
                break
            time.sleep(0.005)
        wrapper_exit = holder.wait(timeout=10) if stopped_after is not None else None
    return {"label": c.label, "exit_7": exit_7, "leases_revoked": revoked, "stopped_after_s": stopped_after,
            "wrapper_exit": wrapper_exit, "ttl": cfg["contract_ttl"] if c.is_leaderrun else None}
