#!/usr/bin/env python3
"""A client-go-style leader elector for leaderrun's interoperability tests: the Python
`kubernetes` client's own `kubernetes.leaderelection` with its LeaseLock, not leaderrun's code.

It campaigns for the Lease LOCK; once it leads it takes an exclusive flock on FLOCK (as
leaderrun's test children do: two leaders at once would find it taken and write OVERLAP),
notes "start elector" and "stop elector" in EVENTS, leads for --lead-for seconds, then:
- --then crash: exits at once, leaving the Lease held (it stops renewing, as a dead pod);
- --then release: stops renewing and frees the Lease as client-go's ReleaseOnCancel does
  (holderIdentity "", the other fields kept; the Python elector has no release of its own).
  --released-duration sets the leaseDurationSeconds it leaves (client-go writes 1).
"""

import argparse
import fcntl
import os
import threading
import time

from kubernetes import client, config
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--lock", required=True)
    parser.add_argument("--identity", required=True)
    parser.add_argument("--lease-duration", type=int, default=5)
    parser.add_argument("--events", required=True)
    parser.add_argument("--flock", required=True)
    parser.add_argument("--lead-for", type=float, default=3)
    parser.add_argument("--then", choices=["crash", "release"], default="release")
    parser.add_argument("--released-duration", type=int, default=1)
    args = parser.parse_args()

    config.load_kube_config(config_file=args.kubeconfig)
    lock = LeaseLock(args.lock, args.namespace, args.identity)
    stopping = threading.Event()

    # Once it stops leading, it writes nothing more (a stopped elector's last renewal
    # must not land after its release).
    for method in ("create", "update"):
        original = getattr(lock, method)

        def guarded(*a, _original=original, **kw):
            return False if stopping.is_set() else _original(*a, **kw)

        setattr(lock, method, guarded)

    def note(line):
        with open(args.events, "a") as f:
            f.write(line + "\n")

    def lead():
        held = open(args.flock, "a")
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            note("OVERLAP elector")
        note("start elector %.3f" % time.monotonic())
        time.sleep(args.lead_for)
        stopping.set()
        note("stop elector %.3f" % time.monotonic())
        if args.then == "release":
            api = client.CoordinationV1Api()
            lease = api.read_namespaced_lease(args.lock, args.namespace)
            lease.spec.holder_identity = ""
            lease.spec.lease_duration_seconds = args.released_duration
            api.replace_namespaced_lease(args.lock, args.namespace, lease)
            note("released elector")
        os._exit(0)

    election = leaderelection.LeaderElection(
        electionconfig.Config(
            lock,
            lease_duration=args.lease_duration,
            renew_deadline=max(2, args.lease_duration - 2),
            retry_period=1,
            onstarted_leading=lead,
            onstopped_leading=lambda: None,
        )
    )
    election.run()


if __name__ == "__main__":
    main()
