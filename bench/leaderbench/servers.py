"""The stores' servers, started by `leaderrun-serve` (bench/serve.rs) through the tests' own
server code in tests/servers/: the benchmarks run the servers the tests run, with the same
settings, and start none themselves.

leaderrun-serve prints one JSON line (the URL, the environment some stores take their server
from, the password to blank in the report; a cluster's URL per node), then answers one JSON
line per command it reads. It stops its server on `stop`, at the end of its input (so a
benchmark that dies leaves no server behind) and on SIGTERM. It is started in a session of
its own and without the processes' mark: a Ctrl-C or the final sweep never kills it before
it has stopped its server.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Optional

from .build import SERVE
from .procs import MARK_VAR


class Served:
    """One store's server, up until close(): `info` is what leaderrun-serve printed first
    (url, env, secret; etcd: endpoints; a cluster: urls, pids). While it is up, its `env` is
    in os.environ, so every process started meanwhile reaches the server."""

    def __init__(self, store: str, d: Path, cluster: bool = False, start_within: float = 300):
        d.mkdir(parents=True, exist_ok=True)
        argv = [str(SERVE), "--store", store, *(["--cluster"] if cluster else []), "--dir", str(d)]
        env = {k: v for k, v in os.environ.items() if k != MARK_VAR}
        self.log = d / "serve.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         start_new_session=True, env=env)
        self.buffer = b""
        self.env: dict = {}
        first = self.read(start_within)
        if first is None or "error" in first:
            why = first["error"] if first else f"no answer ({self.exit_text()})"
            self.close()
            raise RuntimeError(f"leaderrun-serve --store {store}: {why}")
        self.info: dict = first
        self.env = dict(first.get("env") or {})
        os.environ.update(self.env)

    def read(self, timeout: float) -> Optional[dict]:
        """The next JSON line, or None at the end of the output or after `timeout`."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            data = os.read(fd, 65536)
            if not data:
                return None
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def ask(self, command: str, timeout: float = 300) -> dict:
        """Send one command and wait for its answer; an error is raised."""
        try:
            self.proc.stdin.write(command.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise RuntimeError(f"leaderrun-serve is gone ({self.exit_text()})") from None
        answer = self.read(timeout)
        if answer is None:
            raise RuntimeError(f"leaderrun-serve: no answer to {command!r} within {timeout:g} s ({self.exit_text()})")
        if "error" in answer:
            raise RuntimeError(f"{command}: {answer['error']}")
        return answer

    def exit_text(self) -> str:
        status = self.proc.poll()
        state = "still running" if status is None else f"exited with {status}"
        try:
            tail = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()][-3:]
        except OSError:
            tail = []
        return state + (": " + " / ".join(tail) if tail else "")

    def close(self, grace: float = 120) -> None:
        """Stop the server (and leaderrun-serve), and take its environment back out."""
        for name in self.env:
            os.environ.pop(name, None)
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b"stop\n")
                self.proc.stdin.close()
            except (BrokenPipeError, ValueError):
                pass
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.terminate()  # it stops its server on SIGTERM too
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except (BrokenPipeError, OSError):
                pass


class ServedCluster(Served):
    """A 3-node cluster (etcd, NATS, ZooKeeper) as the tests start it: nodes by index, who
    leads, and faults on a node. Every method returns once the cluster has done what was
    asked (a node started again answers). The leader is etcd's Raft leader, ZooKeeper's, and
    for NATS the leader of the bucket's stream once it exists (JetStream's meta leader
    before)."""

    size = 3

    def __init__(self, store: str, d: Path):
        super().__init__(store, d, cluster=True)
        self.engine = store
        self.frozen: set[int] = set()

    def url_from(self, first: int) -> str:
        """The store URL listing every node, node `first` first (a client's preferred node)."""
        return self.info["urls"][first]

    def leader(self) -> Optional[int]:
        return self.ask("leader")["leader"]

    def wait_for_leader(self, within: float = 60) -> Optional[int]:
        return self.ask(f"wait-leader {within:g}", timeout=within + 60)["leader"]

    def follower(self) -> int:
        """A node that answers and does not lead now (NATS: nor leads JetStream's meta group)."""
        follower = self.ask("follower")["follower"]
        if follower is None:
            raise RuntimeError(f"the {self.engine} cluster has no follower up")
        return follower

    def pid(self, i: int) -> Optional[int]:
        return self.ask(f"pid {i}")["pid"]

    def kill(self, i: int) -> None:
        """SIGKILL node i, as a crash of its host would; returns once it is gone."""
        self.ask(f"kill {i}")
        self.frozen.discard(i)

    def restart(self, i: int) -> None:
        """Node i again, same ports and data; returns once it answers."""
        self.ask(f"restart {i}")

    def freeze(self, i: int) -> None:
        """SIGSTOP: its connections stay open and requests to it hang (a stalled host)."""
        self.ask(f"freeze {i}")
        self.frozen.add(i)

    def thaw(self, i: int) -> None:
        self.ask(f"thaw {i}")
        self.frozen.discard(i)

    def restore(self, i: int) -> None:
        """Node i back (thawed if frozen, started again if killed) and a leader elected."""
        self.ask(f"restore {i}", timeout=600)
        self.frozen.discard(i)
