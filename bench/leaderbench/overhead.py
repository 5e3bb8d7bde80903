"""Figure 1: start-to-exit overhead of a one-shot run, in one hyperfine run with `true`,
`flock FILE true` and `leaderrun --version`."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections import Counter

from .build import LEADERRUN
from .procs import Procs
from .stats import lock_name
from .stores import Contender, Session


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
