"""Learn the step model's layout-deviation and spike-growth priors from several ladders.

Step 1 of :mod:`bayesprism.layout_prior` (the evidence of each ladder) fits the step model to
every run of the ladder; step 2 (pooling) and the file format live there. This module reads
the ladders (:func:`bayesprism.read_traces`), fits them (:func:`bayesprism.fit`) and writes the
pooled prior: the library side of ``bayesprism learn-prior``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from bayesprism.errors import InputError, Problem
from bayesprism.inference import fit
from bayesprism.ingest import read_traces
from bayesprism.layout_prior import LayoutPrior, evidence_from_draws, pool_evidence
from bayesprism.outputs import write_text_atomic
from bayesprism.spec import ModelSpec


def _provenance(name: str, table: pd.DataFrame) -> dict:
    """Runs, layouts and source files (SHA-256 of their bytes, snapshot commit) of a ladder."""
    runs = table.attrs.get("runs") or {}
    files: dict[str, dict] = {}
    for meta in runs.values():
        for path in meta.get("source_files") or []:
            p = Path(path)
            if str(p) in files or not p.is_file():
                continue
            files[str(p)] = {"sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
    manifest = _manifest_rows(list(files))
    entries = []
    for path, info in sorted(files.items()):
        row = manifest.get(path)
        entries.append({"path": row["repo_path"] if row else Path(path).name, **info,
                        **({"repository": row["repository"], "commit": row["commit"]}
                           if row else {})})
    layouts = {json.dumps(meta.get("plan", {}), sort_keys=True) + str(meta.get("world_size"))
               for meta in runs.values()}
    return {"name": name, "runs": len(runs), "layouts": len(layouts),
            "world_sizes": sorted({int(m["world_size"]) for m in runs.values()
                                   if m.get("world_size")}),
            "benchmarks": sorted({str(m.get("benchmark")) for m in runs.values()
                                  if m.get("benchmark")}),
            "systems": sorted({str(m.get("platform")) for m in runs.values()
                               if m.get("platform")}),
            "files": entries}


def _manifest_rows(paths: list[str]) -> dict[str, dict]:
    """Rows of a ``MANIFEST.tsv`` above the files (``bayesprism``'s shared data layout), if any.

    The manifest names each stored file's source repository, snapshot commit and path there.
    """
    found: dict[str, dict] = {}
    seen: set[Path] = set()
    for path in paths:
        for parent in Path(path).parents:
            manifest = parent / "MANIFEST.tsv"
            if manifest in seen or not manifest.is_file():
                if manifest in seen:
                    break
                continue
            seen.add(manifest)
            try:
                rows = pd.read_csv(manifest, sep="\t", dtype=str)
            except (OSError, ValueError, pd.errors.ParserError):
                break
            columns = {c.lower(): c for c in rows.columns}
            local = next((columns[c] for c in ("stored_path", "path", "file") if c in columns),
                         None)
            repo = next((columns[c] for c in ("source_repository", "repository", "source_repo",
                                              "repo") if c in columns), None)
            commit = next((columns[c] for c in ("snapshot_commit", "commit") if c in columns),
                          None)
            inner = next((columns[c] for c in ("path_in_repository", "source_path", "repo_path",
                                               "upstream_path") if c in columns), None)
            if local is None:
                break
            for _, row in rows.iterrows():
                full = (parent / str(row[local])).resolve()
                found[str(full)] = {"repository": str(row[repo]) if repo else "",
                                    "commit": str(row[commit]) if commit else "",
                                    "repo_path": str(row[inner]) if inner else str(row[local])}
            break
    return {p: found[str(Path(p).resolve())] for p in paths if str(Path(p).resolve()) in found}


def ladder_evidence(table: pd.DataFrame, name: str, *, draws: int | None = None,
                    tune: int | None = None,
                    chains: int = 2, random_seed: int = 0, progress: bool = False) -> dict:
    """Fit the step model to every run of one ladder under flat priors; its evidence.

    Parameters
    ----------
    table
        Step-level rows of one ladder (one model, one system, several scales).
    name
        The ladder's name in the file.
    draws, tune, chains, random_seed, progress
        Passed to :func:`bayesprism.fit`.

    Returns
    -------
    dict
        Provenance (:func:`_provenance`) plus the evidence of :func:`evidence_from_draws`.
    """
    base = ModelSpec.load("step")
    spec = dataclasses.replace(base, step={**base.step, "layout_prior": "flat"})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="every row is a step-level row")
        tree = fit(table, spec, draws=draws, tune=tune, chains=chains,
                   random_seed=random_seed, progress=progress)
    post = tree["posterior"]
    return {**_provenance(name, table),
            **evidence_from_draws(np.log(post["config_sd"].to_numpy()),
                                  post["spike_slope"].to_numpy())}


def learn_layout_prior(ladders: Mapping[str, pd.DataFrame | Sequence[str | Path]], *,
                       output: str | Path | None = None, layout: Mapping | None = None,
                       draws: int | None = None, tune: int | None = None, chains: int = 2,
                       random_seed: int = 0, progress: bool = False) -> LayoutPrior:
    """Learn the step model's layout-deviation and spike-growth priors from several ladders.

    Parameters
    ----------
    ladders
        ``{name: trace table or input paths}``; each ladder is one model on one system at
        several scales (e.g. an MLPerf results folder), read with
        :func:`bayesprism.read_traces` when given as paths.
    output
        Where to write the JSON file (atomically); ``None``: do not write.
    layout
        ``{ladder name: {key: value}}`` layout facts the logs lack (e.g. ``{"gpt3":
        {"virtual_stages": 12}}``), passed to ``read_traces(..., layout=)``.
    draws, tune, chains, random_seed, progress
        Sampler settings of the per-ladder fits (same seed, same prior).

    Returns
    -------
    LayoutPrior
        Use it with ``[step] layout_prior = "<path>"`` in a spec, or replace the shipped file.

    Raises
    ------
    InputError
        No ladders, unreadable inputs, or a ladder the step model cannot fit.

    Examples
    --------
    >>> from bayesprism.learn_prior import learn_layout_prior
    >>> prior = learn_layout_prior({"gpt3": ["logs/gpt3"], "llama": ["logs/llama"]},
    ...                            layout={"gpt3": {"virtual_stages": 12}},
    ...                            output="prior.json")            # doctest: +SKIP
    """
    if not ladders:
        raise InputError(Problem("layout prior", "ladders", "needs at least one ladder"))
    facts = dict(layout or {})
    unknown = sorted(set(facts) - set(ladders))
    if unknown:
        raise InputError(Problem("layout prior", "layout", "names no ladder", example=unknown[0]))
    evidence = []
    for name, inputs in ladders.items():
        if isinstance(inputs, pd.DataFrame):
            table = inputs
        else:
            table = read_traces([Path(p) for p in inputs], progress=progress,
                                layout=facts.get(name))
        evidence.append(ladder_evidence(table, name, draws=draws, tune=tune, chains=chains,
                                        random_seed=random_seed, progress=progress))
    prior = pool_evidence(evidence)
    if output is not None:
        write_text_atomic(output, prior.to_json())
        prior = LayoutPrior(prior.config_sd_log_mean, prior.config_sd_log_sd,
                            prior.spike_slope_mean, prior.spike_slope_sd,
                            ladders=prior.ladders, source=str(output))
    return prior
