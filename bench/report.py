"""What the benchmarks print their figures with: percentiles, medians with their spread over rounds, milliseconds.

Its imports are the standard library only, as harness.py's are (a script may gevent-patch before importing it).
"""

from __future__ import annotations

import statistics


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summary(values: list[float], unit: str = "ms", scale: float = 1000.0) -> str:
    """p50, p99 and mean, scaled (seconds to ms by default)."""
    return (
        f"p50 {pct(values, 50) * scale:.2f} {unit}, p99 {pct(values, 99) * scale:.2f} {unit}, "
        f"mean {statistics.fmean(values) * scale:.2f} {unit} (n={len(values)})"
    )


def spread(values: list[float], fmt: str = "{:.0f}", short: bool = False) -> str:
    """The median with the min and max: "median M (min A, max B, n=N)", or `short` "M (A-B)"."""
    m, lo, hi = (fmt.format(v) for v in (statistics.median(values), min(values), max(values)))
    return f"{m} ({lo}-{hi})" if short else f"median {m} (min {lo}, max {hi}, n={len(values)})"


def span(values: list[float], fmt: str = "{:.0f}") -> str:
    """A figure over the rounds as a table cell: "M (A-B)", the value alone for one round, "-" for none."""
    if not values:
        return "-"
    return fmt.format(values[0]) if len(values) == 1 else spread(values, fmt, short=True)


def ms(seconds: float | None) -> str:
    """Seconds as whole milliseconds; "-" for none."""
    return "-" if seconds is None else f"{seconds * 1000:.0f}"
