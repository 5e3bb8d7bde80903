"""The benchmarks of bench/bench.py (sections 1 to 7) and the section scripts observe.py
(8) and slots.py (9): one module per section, and what they share.

    build     the binaries (leaderrun, leaderrun-probe, leaderrun-serve), building them
    servers   the stores' servers, started by leaderrun-serve through the tests' own code
    stores    the stores (one table row each), their sessions, the commands measured
    procs     the processes started, each marked so that a sweep ends them all
    probe     the probe's log (START / STOP / OVERLAP) and the runs' request counts
    stats     percentiles, formats, Markdown tables
    overhead, handoff, failover, standby, memory, contract, clusters: the sections
    goals     issue 12's goals, checked against the figures
    report    the Markdown report
    run       every store in turn, then the clusters
"""
