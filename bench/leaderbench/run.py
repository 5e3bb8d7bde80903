"""Running the figures: every store in turn (sections 1 to 6), then the clusters (7); and
what the section scripts (observe.py, slots.py) share."""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from .build import prepare
from .clusters import run_clusters
from .contract import fig_contract
from .failover import fig_failover
from .handoff import fig_handoff, fig_herd
from .memory import fig_memory
from .overhead import fig_overhead
from .procs import MARK, Procs
from .standby import fig_standby
from .stores import FIGURES, Store, contenders, open_session, stores
from .stats import redact, say


def run_all(cfg: dict, only: Optional[set], tmp: Path, singles: bool = True, clusters: bool = True) -> dict:
    """Each store in turn: start its server (if any), run every figure for its rows, stop it;
    then (section 7) each engine's 3-node cluster. A figure that fails becomes an error row;
    the other stores and figures still run."""
    results = {f: [] for f in FIGURES}
    fig_mark = f"{MARK}-fig"
    chosen = [s for s in stores() if singles and (not only or s.name in only)]
    for store in chosen:
        rows = [c for c in contenders() if c.store == store.name]
        t = time.monotonic()
        say(f"[{store.name}] starting")

        def attempt(figure: str, label: str, run: Callable[[], dict]) -> None:
            try:
                results[figure].append(redact(run(), secret))
            except Exception as err:  # report it as a row, go on with the rest
                say(f"[{store.name}] {figure} {label}: FAILED: {redact(repr(err), secret)}")
                results[figure].append(redact({"label": label, "store": store.name,
                                               "error": f"{type(err).__name__}: {err}"}, secret))

        try:
            session = open_session(store, tmp)
        except Exception as err:
            say(f"[{store.name}] could not start the store: {err!r}")
            for c in rows:
                for figure in FIGURES:
                    if figure in c.figures:
                        results[figure].append({"label": c.label, "store": store.name,
                                                "error": f"store did not start: {err}"})
            continue
        secret = session.info.get("secret")
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
            try:
                session.close()
            except Exception as err:
                say(f"[{store.name}] stopping the server failed: {err!r}")
        say(f"[{store.name}] done in {time.monotonic() - t:.0f} s")
    if clusters:
        run_clusters(cfg, only, tmp, results)
    return results


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
        for store in [s for s in stores() if wanted(s)]:
            say(f"[{store.name}] starting")
            session = open_session(store, tmp)
            try:
                yield session
            finally:
                session.close()
    finally:
        Procs(MARK).cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def write_section(text: str, out: Optional[Path]) -> int:
    print(text)
    if out:
        out.write_text(text)
    return 0
