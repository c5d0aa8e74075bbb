"""Named document-length distributions: shipped histograms, uniform, "auto", and user files.

A histogram is a list of inclusive integer bins [low, high] with weights; a length is drawn by
picking a bin by weight, then an integer uniformly inside it. The shipped histograms live in
longca/data/doc_lengths/<name>.csv and are approximations of the shape of the corpora the paper
used (see the comment at the top of each file). A user's histogram is named `file:<path>` and is
a CSV (columns low,high,weight; `#` comments allowed) or a YAML list of {low, high, weight}.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

SHIPPED = ("pile", "prolong-64k", "prolong-512k")
UNIFORM_RANGE = (1, 8192)  # "uniform": lengths U{1, 8192}
# The paper picks the corpus by sequence length: Pile <= 8K, ProLong-64K <= 64K, ProLong-512K beyond.
AUTO_THRESHOLDS = ((8192, "pile"), (65536, "prolong-64k"))
AUTO_ABOVE = "prolong-512k"


@dataclass(frozen=True, eq=False)
class Histogram:
    name: str
    low: np.ndarray  # (bins,) int64, inclusive
    high: np.ndarray  # (bins,) int64, inclusive
    prob: np.ndarray  # (bins,) float64, sums to 1

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        b = rng.choice(len(self.prob), size=n, p=self.prob)
        return rng.integers(self.low[b], self.high[b] + 1)

    def mean(self) -> float:
        return float(np.sum(self.prob * (self.low + self.high) / 2))


def _from_rows(name: str, rows: list[tuple[float, float, float]]) -> Histogram:
    if not rows:
        raise ValueError(f"distribution {name!r}: no bins")
    arr = np.asarray(rows, dtype=np.float64)
    low, high, w = arr[:, 0], arr[:, 1], arr[:, 2]
    if (low != np.round(low)).any() or (high != np.round(high)).any():
        raise ValueError(f"distribution {name!r}: bin bounds must be integers")
    if (low < 1).any() or (high < low).any():
        raise ValueError(
            f"distribution {name!r}: bins need 1 <= low <= high; got {rows[int(np.argmax((low < 1) | (high < low)))]}"
        )
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"distribution {name!r}: weights must be >= 0 with a positive sum")
    return Histogram(name, low.astype(np.int64), high.astype(np.int64), w / w.sum())


def parse_histogram(name: str, text: str, *, yaml_format: bool = False) -> Histogram:
    """Parse bins (low, high, weight) from CSV (header optional, # comments) or YAML text."""
    rows: list[tuple[float, float, float]] = []
    if yaml_format:
        import yaml

        data = yaml.safe_load(text)
        if isinstance(data, dict) and "bins" in data:
            data = data["bins"]
        if not isinstance(data, list):
            raise ValueError(f"distribution {name!r}: YAML must be a list of bins (or a mapping with 'bins')")
        for item in data:
            if isinstance(item, dict):
                rows.append((item["low"], item["high"], item["weight"]))
            else:
                rows.append(tuple(item))  # type: ignore[arg-type]
        return _from_rows(name, rows)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    for rec in csv.reader(io.StringIO("\n".join(lines))):
        if rec and rec[0].strip().lower() == "low":
            continue  # header
        if len(rec) != 3:
            raise ValueError(f"distribution {name!r}: each bin needs low,high,weight; got {rec}")
        rows.append(tuple(float(x) for x in rec))  # type: ignore[arg-type]
    return _from_rows(name, rows)


_CACHE: dict[str, Histogram] = {}


def load_histogram(name: str) -> Histogram:
    """A shipped histogram by name, or a user's file given as `file:<path>`."""
    if name in _CACHE:
        return _CACHE[name]
    if name.startswith("file:"):
        path = Path(name[len("file:") :])
        if not path.exists():
            raise FileNotFoundError(f"distribution {name!r}: file {str(path)!r} not found")
        hist = parse_histogram(name, path.read_text(), yaml_format=path.suffix in (".yaml", ".yml"))
    elif name in SHIPPED:
        text = (resources.files("longca") / "data" / "doc_lengths" / f"{name}.csv").read_text()
        hist = parse_histogram(name, text)
    else:
        raise ValueError(f"unknown document distribution {name!r}; allowed: {allowed_names()}")
    if name in SHIPPED:  # user files are re-read: they may change between runs
        _CACHE[name] = hist
    return hist


def allowed_names() -> list[str]:
    return ["auto", "uniform", *SHIPPED, "file:<path>"]


def resolve(name: str, seqlen: int) -> str:
    """The concrete distribution: "auto" picks by sequence length as the paper did."""
    if name != "auto":
        if name != "uniform" and not name.startswith("file:") and name not in SHIPPED:
            raise ValueError(f"unknown document distribution {name!r}; allowed: {allowed_names()}")
        return name
    for limit, dist in AUTO_THRESHOLDS:
        if seqlen <= limit:
            return dist
    return AUTO_ABOVE


def sampler(name: str):
    """A function (rng, n) -> n lengths >= 1 for a concrete (resolved) distribution name."""
    if name == "uniform":
        lo, hi = UNIFORM_RANGE
        return lambda rng, n: rng.integers(lo, hi + 1, size=n)
    return load_histogram(name).sample
