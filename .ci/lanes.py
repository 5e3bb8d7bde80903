#!/usr/bin/env python3
"""Run `cargo test` in parallel lanes: the same test binaries, built once, run several at a time.

`cargo test` runs its test binaries one after another. Most of ours spend their time waiting
on servers and leases, not computing, so on CI's two cores the suite takes about a third of
the time when three binaries run at once (`--lanes`, default 3). Each binary still runs its
own tests as `cargo test` would (same working directory, same default thread count), and its
output is printed whole when it ends, so lanes never interleave. The longest binaries start
first, so that none is left running alone at the end, and those that load the machine most
take turns (CAPACITY).

    python3 .ci/lanes.py [--lanes N] [--timeout SECONDS] [-- ARGS FOR EVERY TEST BINARY]

Exits 1 if any binary failed or ran out of time (its output says which test), else 0.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Rough weights for the start order only (a wrong guess costs a little time, never a result):
# the fault runs take minutes, the end-to-end and cluster tests a minute or so each.
WEIGHTS = [("fault_run", 500), ("failover_run", 300), ("e2e_", 60), ("cluster_", 50), ("conformance_", 40)]


# Binaries that load the machine, and how much of it they may share. A binary whose tests each
# start a server of their own uses a third to two thirds of a core the whole time (its servers
# included: the CPU column of the output), and a JVM's start takes seconds of both cores: with
# too many at once, the servers answer after their clients' timeouts (3 s to connect, 5 s a
# request) and tests fail for the machine, not for leaderrun. The fault runs (one server at a
# time, mostly asleep) count too: their 2 s leases leave a holder's stop signal a few hundred
# milliseconds. Two units of "heavy" may run at once; a binary that starts JVMs takes both.
CAPACITY = 2
HEAVY = ("postgres", "mariadb", "s3", "dynamodb", "gcs", "kubernetes", "azblob", "fault_run", "failover_run")
JVMS = ("datastore", "zookeeper")


def load_of(name):
    """How many units of CAPACITY `name` takes while it runs."""
    if any(word in name for word in JVMS):
        return CAPACITY
    return 1 if any(word in name for word in HEAVY) else 0


def weight(name):
    return next((w for prefix, w in WEIGHTS if name.startswith(prefix)), 5)


def test_binaries():
    """Build every test target once, as `cargo test` does, and list (name, executable)."""
    build = subprocess.run(
        ["cargo", "test", "--locked", "--no-run", "--message-format=json-render-diagnostics"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    if build.returncode != 0:
        sys.exit(build.returncode)
    found = []
    for line in build.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact" or not message["profile"]["test"]:
            continue
        if message.get("executable"):
            target = message["target"]
            kind = target["kind"][0]
            name = target["name"] if kind == "test" else f"{target['name']} ({kind} unit tests)"
            found.append((name, message["executable"]))
    return sorted(found, key=lambda found: -weight(found[0]))


def run_one(name, command, timeout):
    """Run one binary: its output, whether it passed, and the CPU seconds it and the servers
    it started (and reaped) used, which tells which binaries load the machine."""
    with open(os.devnull, "rb") as nothing, subprocess.Popen(
        command, cwd=ROOT, stdin=nothing, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0
    ) as proc:
        # Out of time: kill its whole group, servers included, or their ends of the pipe would
        # keep the read below waiting.
        timer = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
        timer.start()
        output = proc.stdout.read().decode(errors="replace")
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        late = not timer.is_alive()
        timer.cancel()
    if late:
        output += f"\n{name} ran out of its {timeout} s and was killed\n"
    return output, status == 0 and not late, usage.ru_utime + usage.ru_stime


class Lanes:
    def __init__(self, jobs, timeout):
        self.jobs = list(jobs)
        self.timeout = timeout
        self.changed = threading.Condition()
        self.load = 0
        self.failed = []

    def take(self):
        """The first job in order that CAPACITY lets start now; waits while none may."""
        with self.changed:
            while self.jobs:
                for at, (name, _) in enumerate(self.jobs):
                    if self.load + load_of(name) <= CAPACITY:
                        self.load += load_of(name)
                        return self.jobs.pop(at)
                self.changed.wait()
            return None

    def lane(self):
        while (job := self.take()) is not None:
            name, command = job
            started = time.monotonic()
            output, ok, cpu = run_one(name, command, self.timeout)
            took = time.monotonic() - started
            with self.changed:
                verdict = "ok" if ok else "FAILED"
                print(f"     Running {name} ({verdict}, {took:.1f} s, {cpu:.1f} s of CPU)\n{output}", flush=True)
                if not ok:
                    self.failed.append(name)
                self.load -= load_of(name)
                self.changed.notify_all()

    def run(self, lanes):
        threads = [threading.Thread(target=self.lane) for _ in range(lanes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return self.failed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, default=3, help="test binaries at once (default 3)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds one binary may take (default 1800)")
    parser.add_argument("args", nargs="*", help="passed to every test binary (a filter, --nocapture)")
    options = parser.parse_args()
    if options.lanes < 1:
        parser.error("--lanes must be at least 1")
    started = time.monotonic()
    jobs = [(name, [exe, *options.args]) for name, exe in test_binaries()]
    # The doc tests, as `cargo test` runs them after the binaries (cargo's lock is free by then).
    jobs.append(("doc tests", ["cargo", "test", "--locked", "--doc", "--", *options.args]))
    failed = Lanes(jobs, options.timeout).run(options.lanes)
    minutes = (time.monotonic() - started) / 60
    if failed:
        print(f"{len(failed)} of {len(jobs)} test binaries failed ({minutes:.1f} min): {', '.join(failed)}")
        return 1
    print(f"all {len(jobs)} test binaries passed in {options.lanes} lanes ({minutes:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
