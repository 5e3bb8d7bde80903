"""The stores (one table row each), their sessions, and the commands measured on them."""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .build import LEADERRUN, SERVE
from .servers import Served, ServedCluster

FIGURES = ("overhead", "handoff", "herd", "failover", "standby", "memory", "contract")


@dataclass
class Store:
    """A store leaderrun can use: `leaderrun-serve --store SERVE [--cluster]` starts its
    server (the tests' own, tests/servers/) and says its URL. `note` says what runs."""

    name: str
    serve: str
    cluster: bool = False
    note: str = ""


@dataclass
class Session:
    """One store, up for the duration of its benchmarks: its directory, its server, and what
    leaderrun-serve said of it in `info` (url; etcd: endpoints, for etcdctl)."""

    store: Store
    dir: Path
    server: Served

    @property
    def info(self) -> dict:
        return self.server.info

    @property
    def url(self) -> str:
        return self.info["url"]

    def close(self) -> None:
        self.server.close()


def open_session(store: Store, base: Path, dirname: Optional[str] = None) -> Session:
    """Start the store's server in a directory of its own under `base`."""
    d = base / (dirname or store.name)
    d.mkdir()
    server = ServedCluster(store.serve, d) if store.cluster else Served(store.serve, d)
    return Session(store, d, server)


# What each store's test server is (tests/servers/, with their settings: a password wherever
# the store takes one, as users run them), for the report. Which stores there are, and in what
# order, is the registry's (src/store/registry.rs), as `leaderrun-serve --list` says it.
NOTES: dict[str, str] = {
    "sqlite": "embedded, one file on local disk",
    "postgres": "PostgreSQL 15 on loopback (password auth, fsync off), LISTEN/NOTIFY wake-ups",
    "mysql": "MariaDB on loopback (innodb_flush_log_at_trx_commit 2), GET_LOCK wake-ups",
    "redis": "Redis on loopback (a password), appendfsync always, pub/sub wake-ups",
    "etcd": "etcd 3.4 on loopback (--unsafe-no-fsync), watch wake-ups",
    "nats": "NATS 2.15 JetStream KV on loopback (a user), sync_interval always, KV watch",
    "zookeeper": "ZooKeeper 3.8 on loopback (tickTime 500 ms), node watch",
    "kubernetes": "the tests' Kubernetes API server (Python, tests/servers/kube_apiserver.py) over TLS on "
                  "loopback, a Lease watch; no real API server",
    "s3": "moto 5 (Python) on loopback behind the tests' TCP gate, conditional PutObject, HeadObject polled "
          "about once a second; no real S3",
    "dynamodb": "moto 5 (Python) on loopback, conditional PutItem on a version attribute, GetItem polled "
                "about once a second; no real DynamoDB",
    "gcs": "fake-gcs-server 1.54 on loopback (objects on disk), polled about once a second; no real Cloud Storage",
    "datastore": "Google's Cloud Datastore emulator (Java) on loopback (stored on disk), polled lookups; "
                 "no real Datastore",
    "azblob": "Azurite 3.35 (Node.js) on loopback, the blob's own lease (Acquire/Renew/Release), Get Blob "
              "Properties polled about once a second; no real Azure Storage",
}


# Section 3's and section 5's timings for a store whose leases cannot be as short as the bench's
# (2 s and 3 s): these keys of the config replace the bench's for that store's rows, and the
# report shows what each row ran with. Azure's blob leases last 15 to 60 s (docs/stores/azblob.md):
# leaderrun refuses a shorter --ttl there (exit 2). Memory is sampled after about 6 renewals,
# as on the other stores (1.6 s at 250 ms).
STORE_TIMINGS: dict[str, dict] = {
    "azblob": dict(failover_ttl="15s", failover_renew="3s", failover_kill_after="2s",
                   memory_ttl="15s", memory_renew="1s", memory_after=6.4),
}


def store_cfg(cfg: dict, store: str) -> dict:
    """`cfg` with `store`'s own timings (STORE_TIMINGS) in place of the bench's."""
    return dict(cfg, **STORE_TIMINGS.get(store, {}))


@functools.cache
def stores() -> list[Store]:
    """Every store of the registry that has a test server, in the registry's order (one line
    each from `leaderrun-serve --list`; its `NAME --cluster` lines are section 7's)."""
    listed = subprocess.run([str(SERVE), "--list"], capture_output=True, text=True, check=True).stdout
    names = [line.strip() for line in listed.splitlines() if line.strip() and "--cluster" not in line]
    return [Store(name, name, note=NOTES.get(name, "")) for name in names]


# A command template: (session, lock name, child argv, wait?, extra flags) -> argv.
# `wait` False is a one-shot run that must not keep the lease after its child exits.
CommandTemplate = Callable[[Session, str, list, bool, list], list]


def leaderrun_command(session: Session, lock: str, child: list, wait: bool, flags: list) -> list:
    return leaderrun_argv(session.url, lock, child, wait, flags)


def leaderrun_argv(url: str, lock: str, child: list, wait: bool, flags: list) -> list:
    """leaderrun on `url` (section 7 lists a cluster's nodes in an order of its choosing)."""
    argv = [str(LEADERRUN), "--store", url, "--lock", lock]
    argv += ["--wait"] if wait else ["--min-hold", "0s"]
    return argv + list(flags) + ["--", *map(str, child)]


@dataclass
class Contender:
    """One row of the tables: a command template run against one store's session.

    Figures failover/standby/memory rely on leaderrun's flags (--ttl, -vvv) and its
    watchdog; anchors such as `etcdctl lock` take part in overhead and handoff only.
    """

    label: str
    store: str
    command: CommandTemplate
    figures: frozenset = frozenset(FIGURES)
    is_leaderrun: bool = False


def leaderrun_row(store: Store) -> Contender:
    # "contract" sets leaderrun next to an anchor: only where there is one.
    figures = frozenset(FIGURES) if any(a.store == store.name for a in ANCHORS) else frozenset(FIGURES) - {"contract"}
    return Contender(f"leaderrun {store.name}", store.name, leaderrun_command, figures=figures, is_leaderrun=True)


# Other lock tools measured next to a store. `etcdctl lock` always waits its turn and has
# no --ttl, -vvv or watchdog: it takes part in overhead, handoff and "contract" (what its
# child sees: whether its exit status is passed on, whether it is stopped when the lease
# is lost) only.
ANCHORS: list[Contender] = [
    Contender("etcdctl lock", "etcd",
              lambda s, lock, child, wait, flags: ["etcdctl", f"--endpoints={s.info['endpoints']}",
                                                   "lock", lock, "--", *map(str, child)],
              figures=frozenset({"overhead", "handoff", "herd", "contract"})),
]


def contenders() -> list[Contender]:
    return [leaderrun_row(s) for s in stores()] + ANCHORS
