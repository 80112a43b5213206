"""Kernel signatures: what the model treats as one kernel (DESIGN §3 ``signature``).

One kernel name is often launched for different work: cuBLAS runs the QKV, projection and MLP
GEMMs of a layer, forward and backward, under one name. Fitting them as one kernel makes its
residual the spread between shapes (±60 % on a Megatron trace), not the launch-to-launch
noise. A launch's *place key* (:mod:`bayesprism.ingest.annotate`: name, grid/block, pipeline
stage, the kind of chunk between two send/recv ops and the ordinal among same-named launches
in that chunk) separates them, but there are thousands of places and most do the same work
(every layer repeats the same shapes).

:class:`SignatureStats` accumulates the mean log duration of every place key over all files
(memory: one entry per key), and :func:`signature_map` merges the keys of one name and
launch configuration whose typical durations lie within :data:`MERGE_TOLERANCE` of the
fastest key of their cluster, or within three standard errors of a key's mean where the
launches are too few or too noisy to tell 5 % apart (complete linkage in sorted order, so a
cluster never spans more than that, whatever the spacing of its keys). A name with one
cluster keeps its name as signature; otherwise its clusters are ``name #1``, ``name #2``,
... in order of duration.
The fit then costs cells of signature × GPU × step: tens of signatures, not thousands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bayesprism.ingest.annotate import KEY_SEP

#: Largest ratio of typical durations inside one signature.
MERGE_TOLERANCE = 1.05


@dataclass
class SignatureStats:
    """Per place key: launches and the sum of log durations, accumulated file by file."""

    count: dict[str, int] = field(default_factory=dict)
    log_sum: dict[str, float] = field(default_factory=dict)
    log_square_sum: dict[str, float] = field(default_factory=dict)

    def add(self, df: pd.DataFrame) -> None:
        """Account for the rows of one file (rows whose signature is a place key)."""
        if "signature" not in df or len(df) == 0:
            return
        sig = df["signature"]
        if not isinstance(sig.dtype, pd.CategoricalDtype):
            return
        keys = sig.cat.categories.astype(str)
        is_key = np.array([KEY_SEP in k for k in keys] + [False])
        codes = sig.cat.codes.to_numpy()
        rows = is_key[codes]
        if not rows.any():
            return
        log_d = np.log(df["duration_us"].to_numpy(dtype=np.float64)[rows])
        n = np.bincount(codes[rows], minlength=len(keys))
        total = np.bincount(codes[rows], weights=log_d, minlength=len(keys))
        squares = np.bincount(codes[rows], weights=log_d**2, minlength=len(keys))
        for code in np.flatnonzero(n):
            key = keys[code]
            self.count[key] = self.count.get(key, 0) + int(n[code])
            self.log_sum[key] = self.log_sum.get(key, 0.0) + float(total[code])
            self.log_square_sum[key] = self.log_square_sum.get(key, 0.0) + float(squares[code])

    def merge(self, other: SignatureStats) -> None:
        """Add another file's (or worker's) accumulated launches."""
        for key, n in other.count.items():
            self.count[key] = self.count.get(key, 0) + n
            self.log_sum[key] = self.log_sum.get(key, 0.0) + other.log_sum[key]
            self.log_square_sum[key] = (self.log_square_sum.get(key, 0.0)
                                        + other.log_square_sum.get(key, 0.0))

    def noise(self, keys: list[str]) -> float:
        """Standard error of one key's mean log duration: the pooled within-key sd over the
        typical key's launches (0 when no key has two launches)."""
        n = np.array([self.count[k] for k in keys], dtype=float)
        sums = np.array([self.log_sum[k] for k in keys])
        squares = np.array([self.log_square_sum.get(k, 0.0) for k in keys])
        ss = np.maximum(squares - sums**2 / n, 0.0)
        dof = (n - 1).sum()
        if dof <= 0:
            return 0.0
        return float(np.sqrt(ss.sum() / dof / np.median(n)))


def signature_map(stats: SignatureStats, tolerance: float = MERGE_TOLERANCE) -> dict[str, str]:
    """Place key → signature.

    Parameters
    ----------
    stats
        Accumulated over every file of the table.
    tolerance
        Largest ratio of typical durations merged into one signature.

    Returns
    -------
    dict

    Examples
    --------
    >>> s = SignatureStats()
    >>> def key(name, ordinal):
    ...     return "\\x1f".join((name, "", "0", "0", str(ordinal)))
    >>> for k, us in ((key("gemm", 0), 100.0), (key("gemm", 1), 102.0),
    ...               (key("gemm", 2), 300.0), (key("add", 0), 5.0)):
    ...     s.count[k], s.log_sum[k] = 1, math.log(us)
    >>> sorted(set(signature_map(s).values()))
    ['add', 'gemm #1', 'gemm #2']
    """
    by_name: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for key, n in stats.count.items():
        name, launch, *_ = key.split(KEY_SEP)
        by_name.setdefault((name, launch), []).append((stats.log_sum[key] / n, key))
    clusters: dict[str, list[list[str]]] = {}
    for (name, _), entries in sorted(by_name.items()):
        entries.sort()
        # keys closer than the noise of their means are one signature (a kernel seen a few
        # times per place, as in a one-step trace, must not split on noise)
        limit = max(math.log(tolerance), 3.0 * stats.noise([key for _, key in entries]))
        groups: list[list[str]] = []
        start = None
        for value, key in entries:
            if start is None or value - start > limit:
                groups.append([])
                start = value
            groups[-1].append(key)
        clusters.setdefault(name, []).extend(groups)
    out: dict[str, str] = {}
    for name, groups in clusters.items():
        if len(groups) == 1:
            out.update(dict.fromkeys(groups[0], name))
            continue
        for i, keys in enumerate(groups, start=1):
            out.update(dict.fromkeys(keys, f"{name} #{i}"))
    return out


def apply_signatures(signature: pd.Series, mapping: dict[str, str]) -> pd.Categorical:
    """The signature column with place keys replaced by signatures (other values kept)."""
    values = signature.astype("category") if not isinstance(
        signature.dtype, pd.CategoricalDtype) else signature
    categories = values.cat.categories.astype(str)
    new = np.array([mapping.get(c, c) for c in categories], dtype=object)
    uniques, new_codes = np.unique(new, return_inverse=True)
    codes = values.cat.codes.to_numpy()
    mapped = np.where(codes >= 0, new_codes[np.maximum(codes, 0)], -1)
    return pd.Categorical.from_codes(mapped, categories=uniques)


__all__ = ["MERGE_TOLERANCE", "SignatureStats", "apply_signatures", "signature_map"]
