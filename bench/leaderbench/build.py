"""The binaries the benchmarks run, and building them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from .stats import say

ROOT = Path(__file__).resolve().parent.parent.parent
# Where cargo puts what it builds: CARGO_TARGET_DIR when set, as cargo itself reads it.
TARGET = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
LEADERRUN = TARGET / "release" / "leaderrun"
PROBE = TARGET / "release" / "examples" / "leaderrun-probe"
# Starts each store's server through the tests' own server code (bench/serve.rs).
SERVE = TARGET / "release" / "examples" / "leaderrun-serve"


def prepare(build: bool) -> None:
    if build:
        cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
        say("building: cargo build --release --bins --examples")
        subprocess.run([cargo, "build", "--release", "--bins", "--examples"], cwd=ROOT, check=True)
    for binary in (LEADERRUN, PROBE, SERVE):
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


def stripped_size(binary: Path) -> Optional[int]:
    """The size of `binary` with its symbols stripped (what a package would ship)."""
    if not binary.exists() or not shutil.which("strip"):
        return None
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "stripped"
        if subprocess.run(["strip", "-o", str(out), str(binary)], capture_output=True).returncode != 0:
            return None
        return out.stat().st_size
