"""Small helpers: percentiles, number formats, Markdown tables, names."""

from __future__ import annotations

import json
import math
import re
import sys
import uuid
from typing import Optional


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


def mib(kib: Optional[int]) -> str:
    return "—" if kib is None else f"{kib / 1024:.1f}"


def parse_seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s)", text)
    if not m:
        raise ValueError(text)
    return float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")


def lock_name(what: str) -> str:
    return f"bench-{what}-{uuid.uuid4().hex[:8]}"


def redact(result, secret: Optional[str]):
    """The result with the store's password blanked wherever a message quoted a URL."""
    if not secret:
        return result
    return json.loads(json.dumps(result, default=str).replace(secret, "***"))
