"""Step-level model for step-time logs of several runs at several scales (MLPerf-style).

Input rows have ``kernel_class == "step"`` (one row per logged optimizer step, ``rank = -1``);
each run's ``attrs["runs"][run]`` describes its layout (``bayesprism.inventory.run_layout``):
``world_size``, ``gpus_per_node``, ``global_batch`` and ``plan`` with ``dp``, ``tp``, ``pp``,
``cp``, ``microbatches`` (gradient-accumulation steps per data-parallel rank) and optionally
``virtual_stages`` and ``micro_batch_size``.

Model (seconds). For run r with m micro-batches, pp stages, v virtual stages, a gradient
all-reduce group of p = dp * cp ranks and R = world-size ranks:

    c_r      = exp(mb_log_median) * (w_r / w_ref) ** work_exponent    (one micro-batch, one stage)
    slots_r  = m + bubble_efficiency * (pp - 1) / v                   (interleaved 1F1B bubble)
    strag_r  = exp(rank_sigma * E[max of R standard normals])         (slowest of R ranks)
    comm_r   = exp(mb_log_median) * (comm_latency * 2 (p - 1)
                                     + comm_tier * 2 (p - 1) / p * B_r)  (ring all-reduce)
    log median_r = log(slots_r * c_r * strag_r + comm_r)
    config_k ~ Normal(log median_k, config_sd)   (per layout k; both integrated out)
    run_log_median_r ~ Normal(config_k(r), run_sd)
    log y_rs ~ (1 - w_r) Normal(run_log_median_r, noise_r)
               + w_r Normal(run_log_median_r + slow_shift, sqrt(noise_r^2 + slow_spread^2))
    w_r      = slow_weight_r = 0.5 * sigmoid(spike_logit + spike_slope * log(nodes_r / nodes_ref))
    noise_r  = sqrt((rank_sigma^2 * SD[max of R]^2 + slot_noise^2) / slots_r + step_noise^2)

``w_r = micro_batch_size / (tp * pp * cp)`` is the work of one micro-batch on one GPU (the
trained model is the same along a ladder) and ``w_ref`` that of the reference configuration
(the one with the most timed steps). The sampler does not see ``mb_log_median`` directly: it
samples ``reference_log_median``, the structural log median of the reference configuration
(prior Normal(observed log median, 0.5)), which the data pin tightly, and ``mb_log_median``
follows from it; otherwise the per-slot time and the scale terms form a curved ridge.

Pipeline bubble: the schedule fixes it at (pp - 1) / v idle slots (interleaved 1F1B with v
virtual stages; plain 1F1B when v = 1); ``bubble_efficiency`` ~ LogNormal(0, 0.25) only allows
for imperfect overlap around that theoretical value, so a ladder whose runs all share one
micro-batch count (MLPerf GPT-3 at 512 and 768 GPUs) still gets a bubble of the right size
*provided the layout has the right v* (``plan.virtual_stages``; 1 when not logged: state it
with ``read_traces(..., layout={"virtual_stages": v})`` when the logs lack it).

Exposed data-parallel communication is a ring all-reduce of the gradients
(:mod:`bayesprism.costs.collectives`): ``comm_latency`` per ring step (2 (p - 1) steps) plus a
bandwidth term 2 (p - 1) / p times the relative gradient bytes per rank
``B_r = (tp * pp)_ref / (tp * pp)``, at ``comm_intra`` while the group stays in one node
(``tp * cp * dp <= gpus_per_node``, Megatron rank order) and ``comm_inter`` once it leaves it.
Priors are log-wide (:data:`COMM_PRIORS`: LogNormal with sigma 1.2 around 5e-5, 0.05 and 0.5
slots): the ratio of gradient-reduction time to one micro-batch's compute has no scale common
to workloads. When every fitted run has the same micro-batch count (GPT-3 at 512 and 768
GPUs: 128) the per-step cost and the per-micro-batch cost cannot be separated; the forecast at
8 or 16 micro-batches then carries that prior width instead of a split fixed by a narrow
prior. All three are in reference slots (multiples of
``exp(mb_log_median)``). The bandwidth part saturates in p and jumps once when the group leaves
the node, instead of growing per doubling of dp.

Sampler coordinates of the per-step overhead: when the reference layout has both a bubble and
a data-parallel group, the sampler sees its per-step overhead (bubble plus bandwidth term of
its tier, in slots) and the bubble's share of it (``overhead_z``, ``bubble_share_z``; see
:func:`_overhead_terms`) instead of ``bubble_efficiency`` and the tier's cost: a ladder whose
runs share one pipeline layout and nearly the same gradient bytes per rank pins only their sum,
a curved ridge in the costs' log coordinates (GPT-3 with 12 virtual stages, 4 chains: R-hat
1.02-1.03, ESS 170, 31 leapfrog steps per draw; with these coordinates R-hat 1.006, ESS 760-960,
18 steps). An exact change of variables (Jacobian determinant -1 in the logs): the priors and
the posterior are unchanged.

Fabric tier (a stated fact): when the runs' metadata carry ``nodes_per_leaf`` (nodes under one
leaf switch), a gradient group spread over more nodes than that crosses the spine and pays
``comm_leaf`` (:data:`LEAF_PRIOR`) times its inter-node bandwidth factor on top of
``comm_inter``; nothing small predicts that jump, so only a user who knows the fabric can say
so (and may say it at forecast time only: the cost is then drawn from its prior).

Rank-level variability is a lognormal per-rank slot time with log-sd ``rank_sigma``; every
micro-batch slot waits for the slowest of the R ranks, which shifts its log time by
``rank_sigma`` times the expected maximum of R standard normals and spreads it by
``rank_sigma`` times that maximum's standard deviation (both exact, by quadrature:
:func:`max_normal_moments`). Averaging over the ``slots_r`` slots of a step divides the slot
variance by ``slots_r``; ``step_noise`` is the part that does not average out. Sampled as
``noise_scale`` (the step-noise sd at the reference configuration, which its steps pin) and
two shares of its variance: ``rank_share`` ~ Beta(0.5, 1) (rank part; ``rank_sigma`` follows
and is uniform below the bound the measured noise sets) and ``slot_share`` ~ Beta(2, 2)
(per-slot vs per-step). These are the identified coordinates: sampling ``rank_sigma`` and an
unanchored noise scale gave a corner and a banana (ESS ~120-200).

Step-to-step noise is a two-component lognormal mixture, marginalised (no discrete latent): a
tight core and rare spikes. The spike rate of run r grows with its node count: ``slow_weight_r =
0.5 * sigmoid(spike_logit + spike_slope * log(nodes_r / nodes_ref))`` (below 1/2, so the core is
the majority), one intercept (``spike_logit`` ~ Normal(-3, 1.5), at the reference layout's
nodes) and one slope for all fitted runs. ``spike_slope``'s prior comes from the learned prior
file (``[step] layout_prior``, below); ``slow_shift`` ~ Gamma(2, 10) > 0 is kept away from 0 so
the components cannot swap, ``slow_spread`` ~ HalfNormal(0.1). Unlike exp of a Student-t, its
mean is finite, so forecast means and training-time sums are stable. The likelihood is written
out (:func:`mixture_logp`), ~2x cheaper gradients than ``pymc.NormalMixture``.

Levels: each layout (configuration) k has a level ``config_k`` ~ Normal(structural median,
``config_sd``). With 2-3 measured layouts a ladder cannot learn ``config_sd``; its prior is
learned across ladders (:mod:`bayesprism.layout_prior`; option ``layout_prior``: ``"learned"``,
the lognormal shipped in ``bayesprism/data/step_layout_prior.json``, default; ``"builtin"``,
Gamma(2, 40), mean 0.05, boundary-avoiding; ``"flat"``, flat in log config_sd, for learning; or
the path of a file written by ``bayesprism learn-prior``), and runs scatter around it with
``run_sd`` (HalfNormal(0.02)). A forecast at a new layout draws a new ``config_k``: how far the
formula is off at a new scale is part of the predictive spread. Sampler coordinates
(``bayesprism.inference.fit`` starts chains at jittered prior support points): run levels are
centred but anchored at each run's observed median and scaled by its standard error
(``run_offset``, a flat variable plus the prior as a potential), the layout levels and
``config_sd`` are integrated out (:func:`_marginal_config_levels`: exactly for the levels, by
quadrature on a log grid for ``config_sd``, whose funnel with the structural terms made NUTS
diverge on the Llama 3.1 8B ladder) and drawn afterwards from their conditionals
(``config_sd_z``, ``config_z``), and the reference structural median is anchored at the
reference runs' mean in units of config_sd's prior mean (``reference_z``, flat). Option
``[step] config_effects = false`` drops the layout level (runs scatter around the structure
with ``run_sd``; ``run_parameterisation`` then picks centred/non-centred runs).

Posterior variables: ``reference_log_median``, ``mb_log_median``, ``work_exponent``,
``bubble_efficiency``, ``rank_share``, ``rank_sigma``, ``comm_latency``, ``comm_intra``,
``comm_inter``, ``noise_scale``, ``slot_share``, ``slot_noise``, ``step_noise``,
``spike_logit``, ``spike_slope``, ``slow_weight`` (run), ``slow_shift``, ``slow_spread``,
``config_sd``,
``config_log_median`` (config), ``run_sd``, ``run_log_median`` (run) and the deterministic
``run_effect`` and ``run_median_s`` (run); sampler coordinates ``reference_z`` /
``reference_offset``, ``overhead_z`` and ``bubble_share_z`` (when used), ``config_sd_z``,
``config_z``, ``run_offset`` / ``run_z``.
``posterior.attrs``: ``model_kind="step"``, ``time_unit="s"``, ``reference_work``,
``reference_tp_pp``, ``reference_config``, ``run_population="normal"``, ``warmup_steps``,
``reference_nodes``, ``fitted_microbatches`` (JSON list), ``layout_prior`` (JSON: the priors
used and their source) and ``run_layouts`` (JSON). When every fitted run has the same
micro-batch count, the fit notes (``fit_summary["notes"]``) say that per-micro-batch and
per-step cost were not separated, and forecasts at another count warn the same. The first
timed step of every run is dropped as warm-up
(``summary["skipped"]``).
Options (``ModelSpec.step``): ``warmup_steps`` (1), ``noise`` (``"mixture"`` or ``"normal"``),
``layout_prior`` (``"learned"``),
``config_effects`` (true), ``target_accept`` (0.95, NUTS), ``mass_matrix`` (``"diag"``, or
``"low_rank"``: nutpie's low-rank modified mass matrix), ``run_parameterisation``
(``"auto"``: centred with layout levels; without them centred run levels when each run's
median is pinned much tighter than runs differ, else non-centred; or ``"centred"``,
``"noncentred"``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bayesprism.costs.step import (
    LEAF_PRIOR,
    comm_terms,
    config_label,
    max_normal_moments,
    schedule_bubble_slots,
    separability_note,
)
from bayesprism.errors import InputError, Problem, SpecError
from bayesprism.inventory import run_layout
from bayesprism.layout_prior import load_layout_prior
from bayesprism.model.prepared import PreparedData

# PyMC, PyTensor and scipy.stats are imported inside the functions that build the graph or
# its priors (start-up time: importing bayesprism.model must not load PyMC).

MIN_STEPS_PER_RUN = 3
#: Run levels are centred when (median standard error of a run's median) / (sd of run medians
#: within a configuration) is below this.
CENTRED_BELOW = 0.45
WARMUP_STEPS = 1
#: Gamma (alpha, beta) prior of ``config_sd`` (mean 0.05, mode 0.025, boundary-avoiding: a
#: structural formula never fits a new layout exactly, and with 2-3 measured layouts a prior
#: with mass at 0 gave forecasts as if it did).
CONFIG_SD_PRIOR: tuple[float, float] = (2.0, 40.0)
#: config_sd is integrated out on this many log-spaced nodes over CONFIG_SD_RANGE: spacing
#: 0.064 in log sd, against a conditional at least ~0.1 wide in log sd up to ~50 layouts; the
#: prior puts 8e-8 of its mass below the lower end and exp(-75) above the upper one.
CONFIG_SD_NODES = 192
CONFIG_SD_RANGE: tuple[float, float] = (1e-5, 2.0)
#: LogNormal (mu, sigma) of ``bubble_efficiency``: the schedule fixes the bubble at
#: (pp - 1) / v slots; the efficiency only allows for imperfect overlap around it.
BUBBLE_PRIOR: tuple[float, float] = (0.0, 0.25)
#: LogNormal (mu, sigma) of the ring all-reduce costs in reference slots. Inter-node: gradient
#: bytes per rank over the link bandwidth against one micro-batch's compute is
#: FLOPS * 2 B / (6 * tokens per micro-batch * BW), about 0.2-2 slots for bf16 gradients,
#: 2k-16k tokens and 25-50 GB/s per GPU on current GPUs; sigma 1.2 spans 0.05-5 (95 %).
#: Intra-node links are ~10x faster; a ring step costs a few µs against a ~0.1 s slot.
COMM_PRIORS: dict[str, tuple[float, float]] = {
    "comm_latency": (float(np.log(5e-5)), 1.2),
    "comm_intra": (float(np.log(0.05)), 1.2),
    "comm_inter": (float(np.log(0.5)), 1.2),
}
#: Normal (mean, sd) of ``spike_logit``, the log-odds of twice the spike rate at the reference
#: layout's node count: 2 x rate 0.05 at the median, 0.003-0.5 within 2 sd (logs show 0-5 %
#: of steps as spikes per run).
SPIKE_LOGIT_PRIOR: tuple[float, float] = (-3.0, 1.5)
#: Normal (mean, sd) of ``spike_slope`` (growth of the spike log-odds per e-fold of nodes) for
#: ``layout_prior = "builtin"``; the default takes it from the learned prior file.
SPIKE_SLOPE_PRIOR: tuple[float, float] = (0.0, 1.0)
#: ``spike_slope``'s prior when learning the priors (``layout_prior = "flat"``): wide, divided
#: out afterwards (``bayesprism.layout_prior``).
FLAT_SLOPE_PRIOR: tuple[float, float] = (0.0, 2.0)


def _option(spec, name: str, default):
    """An option of the step model: ``spec.step[name]``, else ``default``."""
    options = getattr(spec, "step", None)
    if isinstance(options, dict) and name in options:
        return options[name]
    return default


def _mass_matrix(spec) -> str:
    """The ``mass_matrix`` option: ``"diag"`` (default) or ``"low_rank"`` (nutpie's low-rank
    modified mass matrix; on the real MLPerf ladders it did worse: GPT-3 R-hat 1.0105 and 10
    divergences with a stated layout, against 0 with the diagonal one)."""
    value = _option(spec, "mass_matrix", "diag")
    if value not in ("diag", "low_rank"):
        raise InputError(Problem("model spec", "step.mass_matrix",
                                 "must be 'diag' or 'low_rank'", example=value))
    return str(value)


def resolve_layout_prior(spec) -> dict:
    """The priors of ``config_sd`` and ``spike_slope`` a spec asks for (``[step] layout_prior``).

    Parameters
    ----------
    spec
        The model spec; option ``layout_prior``: ``"learned"`` (default: the file shipped in
        the package, :mod:`bayesprism.layout_prior`), ``"builtin"`` (Gamma(2, 40) config_sd
        and :data:`SPIKE_SLOPE_PRIOR`), ``"flat"`` (flat in log config_sd and a wide slope:
        for learning the priors) or the path of a file written by
        :func:`bayesprism.learn_prior.learn_layout_prior`.

    Returns
    -------
    dict
        ``kind`` (``"lognormal"``, ``"gamma"`` or ``"flat"``), ``config_sd`` (its parameters:
        log mean and log sd, Gamma alpha and beta, or ``None``), ``spike_slope`` (normal mean
        and sd) and ``source`` (provenance, carried into the posterior's attrs).

    Raises
    ------
    InputError
        Unknown option value or an unreadable prior file.

    Examples
    --------
    >>> resolve_layout_prior(None)["kind"]
    'lognormal'
    """
    value = _option(spec, "layout_prior", "learned")
    if value == "builtin":
        return {"kind": "gamma", "config_sd": list(CONFIG_SD_PRIOR),
                "spike_slope": list(SPIKE_SLOPE_PRIOR), "source": "builtin"}
    if value == "flat":
        return {"kind": "flat", "config_sd": None, "spike_slope": list(FLAT_SLOPE_PRIOR),
                "source": "flat (for learning priors)"}
    if not isinstance(value, str) or not value:
        raise InputError(Problem("model spec", "step.layout_prior",
                                 "must be 'learned', 'builtin', 'flat' or a file path",
                                 example=value))
    try:
        prior = load_layout_prior(None if value == "learned" else value)
    except FileNotFoundError:
        raise InputError(Problem("model spec", "step.layout_prior",
                                 "names no file (or 'learned', 'builtin', 'flat')",
                                 example=value)) from None
    names = [str(ladder.get("name")) for ladder in prior.ladders]
    return {"kind": "lognormal",
            "config_sd": [prior.config_sd_log_mean, prior.config_sd_log_sd],
            "spike_slope": [prior.spike_slope_mean, prior.spike_slope_sd],
            "source": f"{'learned' if value == 'learned' else value} "
                      f"(ladders: {', '.join(names) or 'none recorded'})"}


def _config_sd_log_prior(layout_prior: dict, nodes: np.ndarray) -> np.ndarray:
    """Log prior density of ``config_sd`` per unit of log config_sd at ``nodes`` (> 0)."""
    from scipy import stats

    if layout_prior["kind"] == "flat":
        return np.zeros_like(nodes)
    if layout_prior["kind"] == "gamma":
        alpha, beta = layout_prior["config_sd"]
        return stats.gamma.logpdf(nodes, alpha, scale=1.0 / beta) + np.log(nodes)
    mean, sd = layout_prior["config_sd"]
    return stats.norm.logpdf(np.log(nodes), mean, sd)


def prepare_step(tables: Sequence[pd.DataFrame], spec) -> PreparedData:
    """Step-time rows of several runs → the arrays :func:`build_step` needs.

    Parameters
    ----------
    tables
        Trace tables whose rows are all ``kernel_class == "step"``; their ``attrs["runs"]``
        must describe each run's layout (see the module docstring).
    spec
        The model spec (``kind == "step"``); options ``warmup_steps`` (default 1).

    Returns
    -------
    PreparedData
        coords ``run`` and ``obs``; data per observation (``run_idx``, ``log_step_time``) and
        per run (layout, work, max-of-ranks moments); attrs ``model_kind``, ``time_unit``,
        ``reference_work``, ``run_population``; summary with counts and skipped rows.

    Raises
    ------
    InputError
        Non-step rows, missing run layouts, fewer than 2 runs or too few steps per run.
    """
    warmup = int(_option(spec, "warmup_steps", WARMUP_STEPS))
    rows, run_meta = _step_rows(tables)
    runs = sorted(rows["run"].unique().tolist())
    layouts = _run_layouts(runs, run_meta)
    rows, counts, warm = _timed_rows(rows, runs, warmup)
    layout_frame = pd.DataFrame([layouts[r] for r in runs], index=runs)
    configs = _Configurations.of(layout_frame, counts, runs)
    log_y = np.log(rows["duration_us"].to_numpy(dtype=float) * 1e-6)
    by_run = pd.Series(log_y, index=rows["run"].to_numpy()).groupby(level=0)
    run_median = by_run.median()
    run_se = _run_median_se(by_run, runs)
    parameterisation, se_ratio = _run_parameterisation(run_se, run_median, runs,
                                                       configs.keys)
    if str(_option(spec, "run_parameterisation", "auto")) != "auto":
        parameterisation = str(_option(spec, "run_parameterisation", "auto"))
    elif _option(spec, "config_effects", True):
        # with configuration levels integrated out the centred run levels mix on both
        # ladders (the full GPT-3 ladder, ratio 0.50: R-hat 1.006, ESS 830 in 10 s; the
        # non-centred variant did not finish in 10 minutes)
        parameterisation = "centred"
    run_index = {run: i for i, run in enumerate(runs)}
    data = {
        "run_idx": rows["run"].map(run_index).to_numpy(dtype=np.int64),
        "log_step_time": log_y,
        **_layout_data(layout_frame, configs, runs),
        **_run_level_data(run_median.reindex(runs).to_numpy(dtype=float), run_se, configs,
                          runs),
    }
    per_leaf = leaf_sizes(run_meta, runs)
    if per_leaf is not None:
        # a stated fabric fact: nodes per leaf switch; a group spread over more nodes crosses
        # the spine (comm_leaf, on top of the inter-node cost). The gradient group of one
        # stage is a contiguous block of tp * cp * dp ranks
        group_nodes = np.ceil((layout_frame["tp"] * layout_frame["cp"] * layout_frame["dp"])
                              .to_numpy(dtype=float)
                              / layout_frame["gpus_per_node"].to_numpy(dtype=float))
        data["leaf_bandwidth"] = np.where(group_nodes > per_leaf, data["inter_bandwidth"], 0.0)
    layout_prior = resolve_layout_prior(spec)
    counts_mb = sorted({int(v) for v in layout_frame["microbatches"]})
    summary = {
        "rows": len(rows),
        "runs": len(runs),
        "skipped": {"warm-up step": warm},
        "notes": _notes(warmup, counts_mb, layout_prior,
                        [r for r in runs if not layouts[r]["micro_batch_size_known"]]),
        "steps_per_run": {r: int(counts[r]) for r in runs},
    }
    attrs = {
        "model_kind": "step",
        "time_unit": "s",
        "reference_work": configs.reference_work,
        "reference_tp_pp": configs.reference_tp_pp,
        "reference_config": configs.reference,
        "run_parameterisation": parameterisation,
        "run_se_to_spread": se_ratio,
        # the scale terms leave curved ridges (bubble vs. exposed communication): smaller steps
        "target_accept": float(_option(spec, "target_accept", 0.95)),
        "mass_matrix": _mass_matrix(spec),
        "run_population": "normal",
        "warmup_steps": warmup,
        "reference_nodes": float(data.pop("reference_nodes")),
        "fitted_microbatches": json.dumps(counts_mb),
        "layout_prior": json.dumps(layout_prior, sort_keys=True),
        "nodes_per_leaf": json.dumps(None if per_leaf is None else
                                     sorted({int(v) for v in per_leaf if np.isfinite(v)})),
        "run_layouts": _layouts_json(layout_frame),
    }
    coords = {"config": configs.labels, "run": runs, "obs": list(range(len(rows)))}
    return PreparedData(coords=coords, data=data, attrs=attrs, summary=summary)


# --------------------------------------------------------------------------- preparation steps


def _step_rows(tables: Sequence[pd.DataFrame]) -> tuple[pd.DataFrame, dict[str, dict]]:
    """Every table's (run, step, duration) rows and the runs' metadata; tables with other than
    step rows are refused."""
    problems: list[Problem] = []
    frames = []
    run_meta: dict[str, dict] = {}
    for i, table in enumerate(tables):
        source = str(table.attrs.get("source", f"table {i}")) if len(tables) > 1 else "table"
        if "kernel_class" not in table.columns or "duration_us" not in table.columns:
            problems.append(Problem(source, "kernel_class, duration_us",
                                    "required columns are missing"))
            continue
        not_step = (table["kernel_class"].astype(str) != "step").to_numpy()
        if not_step.any():
            problems.append(Problem(source, "kernel_class",
                                    "the step model needs step rows only (kernel_class == 'step')",
                                    int(not_step.sum()),
                                    table["kernel_class"].to_numpy()[not_step][0]))
            continue
        frames.append(table[["run", "step", "duration_us"]].assign(
            run=table["run"].astype(str), _source=source))
        for run, meta in (table.attrs.get("runs") or {}).items():
            run_meta[str(run)] = meta
    if problems:
        raise InputError(problems)
    return pd.concat(frames, ignore_index=True), run_meta


def _run_layouts(runs: list[str], run_meta: dict[str, dict]) -> dict[str, dict]:
    """Each run's layout (:func:`bayesprism.inventory.run_layout`); a run without one is
    refused."""
    problems: list[Problem] = []
    layouts = {}
    for run in runs:
        if run not in run_meta:
            problems.append(Problem("table", f"attrs.runs[{run!r}]",
                                    "is missing: the step model needs the run's layout"))
            continue
        layouts[run], run_problems = run_layout(run, run_meta[run])
        problems.extend(run_problems)
    if problems:
        raise InputError(problems)
    return layouts


def _timed_rows(rows: pd.DataFrame, runs: list[str], warmup: int
                ) -> tuple[pd.DataFrame, pd.Series, int]:
    """The rows after each run's first ``warmup`` steps, the timed steps per run and the
    number dropped; too few runs or steps are refused."""
    rows = rows.sort_values(["run", "step"], kind="stable")
    warm = rows.groupby("run").cumcount() < warmup
    rows = rows.loc[~warm]
    counts = rows.groupby("run").size().reindex(runs, fill_value=0)
    short = counts[counts < MIN_STEPS_PER_RUN]
    problems: list[Problem] = []
    if len(short):
        problems.append(Problem("table", "step",
                                f"each run needs at least {MIN_STEPS_PER_RUN} timed steps after "
                                f"dropping {warmup} warm-up step(s)", len(short),
                                f"{short.index[0]}: {int(short.iloc[0])} steps"))
    if len(runs) < 2:
        problems.append(Problem("table", "run", "the step model needs at least 2 runs", len(runs)))
    if problems:
        raise InputError(problems)
    return rows, counts, int(warm.sum())


#: Layout fields that make a configuration (runs of one configuration share its level).
CONFIG_FIELDS = ("world_size", "dp", "tp", "pp", "cp", "microbatches", "virtual_stages",
                 "micro_batch_size")


@dataclass(frozen=True)
class _Configurations:
    """The runs' configurations and the reference one (most timed steps), which anchors the
    scale of the structure: its median is pinned by the data, which decorrelates the per-slot
    time from the other terms."""

    keys: list[tuple]  # per run
    distinct: list[tuple]  # sorted
    labels: list[str]  # of ``distinct``
    reference: int  # index in ``distinct``
    reference_runs: list[str]
    work: pd.Series  # per run: micro_batch_size / (tp * pp * cp)
    reference_work: float
    reference_tp_pp: float

    @classmethod
    def of(cls, layout_frame: pd.DataFrame, counts: pd.Series, runs: list[str]
           ) -> _Configurations:
        work = layout_frame["micro_batch_size"] / (layout_frame["tp"] * layout_frame["pp"]
                                                   * layout_frame["cp"])
        keys = [tuple(row) for row in layout_frame[list(CONFIG_FIELDS)].itertuples(index=False)]
        distinct = sorted(set(keys))
        labels = [config_label(dict(zip(CONFIG_FIELDS, key, strict=True))) for key in distinct]
        steps_per_config = pd.Series(counts.reindex(runs).to_numpy(), index=keys)
        reference = steps_per_config.groupby(level=0).sum().idxmax()
        reference_runs = [r for r, k in zip(runs, keys, strict=True) if k == reference]
        first = reference_runs[0]
        return cls(keys, distinct, labels, distinct.index(reference), reference_runs,
                   work, float(work[first]),
                   float(layout_frame.loc[first, "tp"] * layout_frame.loc[first, "pp"]))


def _layout_data(layout_frame: pd.DataFrame, configs: _Configurations, runs: list[str]
                 ) -> dict[str, np.ndarray]:
    """Per run: its configuration, layout, bubble slots, all-reduce factors, relative work,
    max-of-ranks moments and node count relative to the reference's."""
    emax, smax = max_normal_moments(layout_frame["world_size"].to_numpy())
    # nodes of each run (spikes: a step waits for the slowest node, so their rate grows with
    # the node count); relative to the reference layout's, where spike_logit is anchored
    nodes = np.maximum(np.ceil(layout_frame["world_size"].to_numpy(dtype=float)
                               / layout_frame["gpus_per_node"].to_numpy(dtype=float)), 1.0)
    reference_nodes = float(nodes[runs.index(configs.reference_runs[0])])
    return {
        "config_idx": np.array([configs.distinct.index(k) for k in configs.keys],
                               dtype=np.int64),
        # one run of each configuration: they share the structural median
        "config_run": np.array([configs.keys.index(k) for k in configs.distinct],
                               dtype=np.int64),
        "microbatches": layout_frame["microbatches"].to_numpy(dtype=float),
        "pp": layout_frame["pp"].to_numpy(dtype=float),
        "virtual_stages": layout_frame["virtual_stages"].to_numpy(dtype=float),
        "dp": layout_frame["dp"].to_numpy(dtype=float),
        "world_size": layout_frame["world_size"].to_numpy(dtype=float),
        "schedule_bubble_slots": schedule_bubble_slots(layout_frame["pp"].to_numpy(),
                                                       layout_frame["virtual_stages"].to_numpy()),
        **comm_terms(layout_frame["dp"] * layout_frame["cp"], layout_frame["tp"],
                     layout_frame["pp"], layout_frame["tp"] * layout_frame["cp"]
                     * layout_frame["dp"], layout_frame["gpus_per_node"],
                     configs.reference_tp_pp),
        "log_relative_work": np.log(configs.work.to_numpy(dtype=float) / configs.reference_work),
        "max_rank_mean": emax.astype(float),
        "max_rank_sd": smax.astype(float),
        "log_nodes_rel": np.log(nodes / reference_nodes),
        "reference_nodes": np.asarray(reference_nodes),  # moved to the attrs by prepare_step
    }


def _run_level_data(run_median: np.ndarray, run_se: np.ndarray, configs: _Configurations,
                    runs: list[str]) -> dict[str, np.ndarray]:
    """The sampler's coordinates of the run and configuration levels: each run's observed
    median log step time and its standard error (see :func:`build_step`)."""
    reference = np.array([runs.index(r) for r in configs.reference_runs])
    return {
        "prior_center": np.asarray(float(np.median(run_median[reference]))),
        "run_center": run_median,
        **_config_anchor(run_median, run_se, [configs.distinct.index(k) for k in configs.keys],
                         len(configs.distinct)),
        "run_scale": np.maximum(run_se, 1e-6),
        "reference_scale": np.asarray(max(float(np.std(run_median[reference])),
                                          float(np.median(run_se)), 1e-4)),
        "reference_run": np.asarray(reference[0], dtype=np.int64),
    }


def _notes(warmup: int, counts_mb: list[int], layout_prior: dict, unknown_mbs: list[str]
           ) -> list[str]:
    """The fit's notes: warm-up dropped, separability, priors used, assumed micro-batch size."""
    notes = [f"dropped the first {warmup} timed step(s) of each run as warm-up"]
    if len(counts_mb) == 1:
        notes.append(separability_note(counts_mb[0]))
    notes.append(f"layout-deviation and spike-growth priors: {layout_prior['source']}")
    if unknown_mbs:
        notes.append(f"micro-batch size unknown for {len(unknown_mbs)} run(s) "
                     f"(no global batch size): assumed 1, e.g. {unknown_mbs[0]}")
    return notes


def _config_anchor(run_median: np.ndarray, run_se: np.ndarray, config_idx: list[int],
                   n_configs: int) -> dict[str, np.ndarray]:
    """Sampler coordinates of the configuration levels: mean run median and its spread."""
    idx = np.asarray(config_idx)
    center = np.array([run_median[idx == k].mean() for k in range(n_configs)])
    scale = np.array([max(run_median[idx == k].std() / np.sqrt((idx == k).sum()),
                          float(np.median(run_se)), 1e-4) for k in range(n_configs)])
    return {"config_center": center, "config_scale": scale}


def _run_median_se(by_run, runs: list[str]) -> np.ndarray:
    """Robust standard error of each run's median log step time: 1.2533 * 1.4826 * MAD / sqrt(n)."""
    mad = by_run.apply(lambda v: float(np.median(np.abs(v - np.median(v)))))
    n = by_run.size()
    return (1.2533 * 1.4826 * mad / np.sqrt(n)).reindex(runs).to_numpy(dtype=float)


def _run_parameterisation(se: np.ndarray, run_median: pd.Series, runs: list[str],
                          config_keys: list[tuple]) -> tuple[str, float]:
    """``"centred"`` when the data pin each run's level much tighter than runs differ.

    Compares the median standard error of a run's median log step time
    (:func:`_run_median_se`) with the standard deviation of run medians within a
    configuration; centred when the ratio is below :data:`CENTRED_BELOW` (0.17 on the GPT-3
    512/768-GPU runs, 0.39 on Llama 3.1 8B at 8-32 GPUs).
    """
    medians = pd.Series(run_median.reindex(runs).to_numpy(), index=pd.Index(config_keys))
    deviations = medians - medians.groupby(level=0).transform("mean")
    sizes = medians.groupby(level=0).transform("size").to_numpy()
    usable = sizes > 1
    if not usable.any():
        return "noncentred", float("nan")
    groups = medians[usable].groupby(level=0).ngroups
    between = float(np.sum(deviations.to_numpy()[usable] ** 2) / (usable.sum() - groups))
    ratio = float(np.median(se)) / max(np.sqrt(between), 1e-12)
    return ("centred" if ratio < CENTRED_BELOW else "noncentred"), ratio


def leaf_sizes(run_meta: dict, runs: list[str]) -> np.ndarray | None:
    """Nodes per leaf switch of each run (``nodes_per_leaf`` in its metadata or plan).

    ``None`` when no run states it; runs without it get ``inf`` (never crossing).

    Examples
    --------
    >>> leaf_sizes({"a": {"nodes_per_leaf": 16}, "b": {}}, ["a", "b"]).tolist()
    [16.0, inf]
    """
    values = []
    for run in runs:
        meta = run_meta.get(run) or {}
        value = meta.get("nodes_per_leaf", (meta.get("plan") or {}).get("nodes_per_leaf"))
        try:
            values.append(np.inf if value is None else float(value))
        except (TypeError, ValueError):
            values.append(np.nan)
    if all(np.isinf(values)):
        return None
    bad = [v for v in values if not (np.isinf(v) or (v >= 1 and v == int(v)))]
    if bad:
        raise InputError(Problem("table", "attrs.runs.nodes_per_leaf",
                                 "must be a positive integer", example=bad[0]))
    return np.asarray(values)


def _layouts_json(layout_frame: pd.DataFrame) -> str:
    cols = ["world_size", "gpus_per_node", "dp", "tp", "pp", "cp", "microbatches",
            "virtual_stages", "micro_batch_size"]
    table = {run: {c: (float(v) if c == "micro_batch_size" else int(v))
                   for c, v in row.items() if c in cols}
             for run, row in layout_frame[cols].iterrows()}
    return json.dumps(table, sort_keys=True)


def mixture_logp(value, mu, sigma, slow_weight, slow_shift, slow_spread):
    """Log density of the step-noise mixture (module docstring), elementwise.

    ``(1 - w) Normal(value; mu, sigma) + w Normal(value; mu + shift, sqrt(sigma^2 + spread^2))``
    written out with ``logaddexp``: the same value as ``pymc.NormalMixture`` with about 2.3x
    cheaper gradients (no stacked component axis).
    """
    import pytensor.tensor as pt

    slow_sigma = pt.sqrt(sigma**2 + slow_spread**2)
    core_z = (value - mu) / sigma
    slow_z = (value - mu - slow_shift) / slow_sigma
    return pt.logaddexp(pt.log1p(-slow_weight) - pt.log(sigma) - 0.5 * core_z**2,
                        pt.log(slow_weight) - pt.log(slow_sigma) - 0.5 * slow_z**2) \
        - 0.5 * np.log(2.0 * np.pi)


def _anchored_run_levels(d):
    """Run levels in coordinates anchored at each run's observed median, scaled by its SE.

    An affine map of the centred levels (constant Jacobian; their prior enters as a
    potential). The sampler's start jitter of +-1 is then +-1 standard error instead of a
    factor e on the step time, which sent chains into a mode where the slow mixture component
    held the data (R-hat 1.85).
    """
    import pymc as pm

    run_offset = pm.Flat("run_offset", dims="run")
    return pm.Deterministic("run_log_median", d["run_center"] + d["run_scale"] * run_offset,
                            dims="run")


def _config_sd_grid() -> tuple[np.ndarray, float]:
    """Log-spaced nodes (log config_sd) and their spacing for integrating config_sd out."""
    log_nodes = np.linspace(np.log(CONFIG_SD_RANGE[0]), np.log(CONFIG_SD_RANGE[1]),
                            CONFIG_SD_NODES)
    return log_nodes, float(log_nodes[1] - log_nodes[0])


def _marginal_config_levels(d, run_log_median, structural, run_sd, layout_prior=None):
    """Prior of the run levels with the configuration levels and ``config_sd`` integrated out.

    Runs r of configuration k: ``run_r ~ N(c_k, run_sd)``, ``c_k ~ N(structural_k,
    config_sd)``; marginally the n_k runs are jointly normal with covariance
    ``run_sd^2 I + config_sd^2 11'``, whose density needs only their mean and sum of squares.
    Sampling the c_k next to run_sd gave a funnel (divergences at small run_sd). ``config_sd``
    is then integrated out too, by the trapezoid rule on :data:`CONFIG_SD_NODES` log-spaced
    nodes against its Gamma prior: with as many structural parameters as measured layouts
    (Llama 3.1 8B: 6 layouts, 5 structural terms) it was a funnel with them (small config_sd
    pins the structure to a thin curved manifold, large config_sd frees it; NUTS diverged with
    energy errors > 1000 at config_sd ~ 0.015-0.02). The integrated density has one width in
    the structural terms and Student-t-like tails.

    ``config_sd`` is drawn afterwards from its conditional given the levels (inverse CDF on the
    grid, uniform ``Phi(config_sd_z)``), and the levels from their exact conditional ``c_k |
    runs, config_sd`` (a normal) through a standard normal ``config_z``; neither enters the
    likelihood. ``structural`` holds the structural log median of every run (the reference
    configuration's is ``reference_log_median``). ``layout_prior`` is the prior of config_sd
    (:func:`resolve_layout_prior`; default: the builtin Gamma). Returns ``(config_log_median,
    config_sd)``.
    """
    import pymc as pm
    import pytensor.tensor as pt

    k = d["config_idx"]
    n_configs = len(d["config_run"])
    counts = np.bincount(k, minlength=n_configs).astype(float)
    onehot = (k[None, :] == np.arange(n_configs)[:, None]).astype(float)  # config x run
    mean = pt.dot(onehot, run_log_median) / counts
    squares = pt.dot(onehot, (run_log_median - mean[k]) ** 2)
    mu = structural[d["config_run"]]
    within = pt.sum(-(counts - 1.0) * pt.log(run_sd) - squares / (2.0 * run_sd**2))
    log_nodes, spacing = _config_sd_grid()
    nodes = np.exp(log_nodes)
    if layout_prior is None:  # the builtin Gamma prior
        layout_prior = {"kind": "gamma", "config_sd": list(CONFIG_SD_PRIOR)}
    prior = _config_sd_log_prior(layout_prior, nodes)  # per unit log sd
    total = run_sd**2 + counts[None, :] * nodes[:, None] ** 2  # node x config
    between = pt.sum(-0.5 * pt.log(total) - counts * (mean - mu) ** 2 / (2.0 * total), axis=1)
    trapezoid = np.full(CONFIG_SD_NODES, np.log(spacing))
    trapezoid[[0, -1]] -= np.log(2.0)
    log_mass = prior + between + trapezoid
    pm.Potential("run_level_prior", within + pt.logsumexp(log_mass))
    config_sd = _conditional_config_sd(log_mass, log_nodes, spacing)
    precision = counts / run_sd**2 + 1.0 / config_sd**2
    cond_mean = (counts * mean / run_sd**2 + mu / config_sd**2) / precision
    config_z = pm.Normal("config_z", 0.0, 1.0, dims="config")
    config_log_median = pm.Deterministic(
        "config_log_median", cond_mean + config_z / pt.sqrt(precision), dims="config")
    return config_log_median, config_sd


def _conditional_config_sd(log_mass, log_nodes: np.ndarray, spacing: float):
    """``config_sd`` drawn from its conditional (node masses ``log_mass``) by inverse CDF.

    The mass of node j is spread uniformly over ``log_nodes[j] +- spacing / 2``; the uniform
    variate is ``Phi(config_sd_z)`` of a standard normal that enters no likelihood, so the
    joint draw of (levels, config_sd) has the right distribution.
    """
    import pymc as pm
    import pytensor.tensor as pt

    config_sd_z = pm.Normal("config_sd_z", 0.0, 1.0)
    uniform = 0.5 * pt.erfc(-config_sd_z / np.sqrt(2.0))
    mass = pt.exp(log_mass - pt.logsumexp(log_mass))
    cdf = pt.cumsum(mass)
    cell = pt.minimum(pt.sum(pt.lt(cdf, uniform)), len(log_nodes) - 1)
    below = pt.concatenate([pt.zeros(1), cdf])[cell]
    fraction = pt.clip((uniform - below) / mass[cell], 0.0, 1.0)
    log_sd = pt.as_tensor(log_nodes)[cell] + spacing * (fraction - 0.5)
    return pm.Deterministic("config_sd", pt.exp(log_sd))


def _overhead_terms(d):
    """``bubble_efficiency``, ``comm_latency``, ``comm_intra`` and ``comm_inter`` with their
    priors (:data:`BUBBLE_PRIOR`, :data:`COMM_PRIORS`).

    When the reference layout has both a pipeline bubble (``b = (pp - 1) / v > 0`` slots) and
    a bandwidth term ``B > 0`` on its tier (cost ``comm_tier``), the sampler sees its per-step
    overhead ``O = bubble_efficiency * b + comm_tier * B`` (in reference slots) and the
    bubble's share of it, ``s = bubble_efficiency * b / O``: coordinates ``overhead_z`` and
    ``bubble_share_z``, flat, affine in ``log O`` and ``logit s`` and zero at the prior
    medians. A ladder whose runs share one pipeline layout and nearly the same gradient bytes
    per rank (MLPerf GPT-3) pins ``O`` but not the split, and in the log coordinates of the
    two costs that is a curved ridge (``log(b e^x + B e^y) = const``) whose tail mixed slowly
    (R-hat 1.02-1.03); here it is the axis ``bubble_share_z``, along which the priors alone
    shape the posterior. The map ``(log O, logit s) -> (log bubble_efficiency, log
    comm_tier)``, ``x = log O + log s - log b`` and ``y = log O + log(1 - s) - log B``, has
    Jacobian determinant -1, so the log-normal priors, written as normal densities of the
    logs, are the exact density in the new coordinates: the posterior is unchanged.
    Otherwise (no bubble or no data-parallel group at the reference) all four are sampled
    directly, in the order (and so with the start points) of the model before these
    coordinates.
    """
    import pymc as pm
    import pytensor.tensor as pt

    ref = int(d["reference_run"])
    bubble = float(d["schedule_bubble_slots"][ref])
    tier = "comm_inter" if d["inter_bandwidth"][ref] > 0 else "comm_intra"
    bandwidth = float(d["inter_bandwidth" if tier == "comm_inter" else "intra_bandwidth"][ref])
    if bubble <= 0 or bandwidth <= 0:
        # the schedule fixes the bubble; the efficiency only allows for imperfect overlap
        bubble_efficiency = pm.LogNormal("bubble_efficiency", *BUBBLE_PRIOR)
        comm = {name: pm.LogNormal(name, *COMM_PRIORS[name])
                for name in ("comm_latency", "comm_intra", "comm_inter")}
        return bubble_efficiency, comm["comm_latency"], comm["comm_intra"], comm["comm_inter"]
    # prior medians of the reference layout's bubble and bandwidth cost, in log slots
    log_bubble = BUBBLE_PRIOR[0] + np.log(bubble)
    log_comm = COMM_PRIORS[tier][0] + np.log(bandwidth)
    log_overhead = np.logaddexp(log_bubble, log_comm) + pm.Flat("overhead_z")
    logit_share = (log_bubble - log_comm) + pm.Flat("bubble_share_z")
    log_efficiency = log_overhead - pt.softplus(-logit_share) - np.log(bubble)
    log_cost = log_overhead - pt.softplus(logit_share) - np.log(bandwidth)
    pm.Potential("overhead_prior",
                 pm.logp(pm.Normal.dist(*BUBBLE_PRIOR), log_efficiency)
                 + pm.logp(pm.Normal.dist(*COMM_PRIORS[tier]), log_cost))
    bubble_efficiency = pm.Deterministic("bubble_efficiency", pt.exp(log_efficiency))
    comm = {tier: pm.Deterministic(tier, pt.exp(log_cost))}
    for name in ("comm_latency", "comm_intra", "comm_inter"):
        if name not in comm:
            comm[name] = pm.LogNormal(name, *COMM_PRIORS[name])
    return bubble_efficiency, comm["comm_latency"], comm["comm_intra"], comm["comm_inter"]


def build_step(prepared, spec):
    """The PyMC model of :mod:`bayesprism.model.step` for prepared step data.

    Parameters
    ----------
    prepared
        Output of :func:`prepare_step`.
    spec
        The model spec; options ``noise`` (``"mixture"`` or ``"normal"``) and
        ``config_effects`` (see the module docstring).

    Returns
    -------
    pymc.Model
    """
    import pymc as pm
    import pytensor.tensor as pt

    d = prepared.data
    noise_family = str(_option(spec, "noise", "mixture"))
    if noise_family not in ("mixture", "normal"):
        raise SpecError(Problem("model spec", "step.noise", "must be 'mixture' or 'normal'",
                                example=noise_family))
    config_effects = bool(_option(spec, "config_effects", True))
    run_parameterisation = prepared.attrs.get("run_parameterisation", "centred")
    ref_config = int(prepared.attrs.get("reference_config", 0))
    layout_prior = json.loads(prepared.attrs.get("layout_prior") or "null") \
        or resolve_layout_prior(spec)
    with pm.Model(coords=prepared.coords) as model:
        run_idx = pm.Data("run_idx", d["run_idx"], dims="obs")
        config_idx = pm.Data("config_idx", d["config_idx"], dims="run")
        microbatches = pm.Data("microbatches", d["microbatches"], dims="run")
        bubble_slots = pm.Data("schedule_bubble_slots", d["schedule_bubble_slots"], dims="run")
        log_work = pm.Data("log_relative_work", d["log_relative_work"], dims="run")
        emax = pm.Data("max_rank_mean", d["max_rank_mean"], dims="run")
        smax = pm.Data("max_rank_sd", d["max_rank_sd"], dims="run")
        lat_steps = pm.Data("latency_steps", d["latency_steps"], dims="run")
        intra_bw = pm.Data("intra_bandwidth", d["intra_bandwidth"], dims="run")
        inter_bw = pm.Data("inter_bandwidth", d["inter_bandwidth"], dims="run")

        run_sd = pm.HalfNormal("run_sd", 0.02)
        marginal = config_effects and run_parameterisation != "noncentred"
        if config_effects and not marginal:
            if layout_prior["kind"] == "gamma":
                config_sd = pm.Gamma("config_sd", *layout_prior["config_sd"])
            elif layout_prior["kind"] == "lognormal":
                config_sd = pm.LogNormal("config_sd", *layout_prior["config_sd"])
            else:  # flat in log config_sd, as in the integrated version
                config_sd = pm.Deterministic("config_sd", pt.exp(pm.Uniform(
                    "config_sd_log", *np.log(CONFIG_SD_RANGE))))

        reference_prior = pm.Normal.dist(float(d["prior_center"]), 0.5)
        if marginal:
            run_log_median = _anchored_run_levels(d)
            # anchored at the reference runs' mean, one unit = config_sd's prior mean (how far
            # the structure may sit from a layout's level); its density is the reference
            # layout's term of the integrated level prior (_marginal_config_levels)
            ref_mean = run_log_median[d["config_idx"] == ref_config].mean()
            reference_z = pm.Flat("reference_z")
            reference_log_median = pm.Deterministic(
                "reference_log_median",
                ref_mean - CONFIG_SD_PRIOR[0] / CONFIG_SD_PRIOR[1] * reference_z)
        else:
            # anchored at the reference runs' median (sampler jitter of +-1 is one scale unit)
            reference_offset = pm.Flat("reference_offset")
            reference_log_median = pm.Deterministic(
                "reference_log_median",
                d["prior_center"] + float(d["reference_scale"]) * reference_offset)
        pm.Potential("reference_prior", pm.logp(reference_prior, reference_log_median))
        work_exponent = pm.Normal("work_exponent", 1.0, 0.25)
        # ring all-reduce in reference slots: per-step latency and per-tier bandwidth cost.
        # Log-wide priors: the ratio of gradient-reduction time to one micro-batch's compute
        # has no scale common to workloads (it falls with the tokens per micro-batch).
        bubble_efficiency, comm_latency, comm_intra, comm_inter = _overhead_terms(d)
        # noise_scale is the step-noise sd at the reference configuration (what its steps
        # pin); rank_share and slot_share split its variance into the slowest-rank part, the
        # per-slot part and the per-step part. rank_sigma follows from its share: the
        # rank part cannot exceed the measured noise, and sampling rank_sigma directly left a
        # corner where noise_scale -> 0 (divergences, ESS ~200). Beta(0.5, 1) makes rank_sigma
        # uniform below that bound; a ladder whose runs share one slot count leaves
        # slot_share at its prior instead of a banana with noise_scale.
        noise_scale = pm.HalfNormal("noise_scale", 0.1)
        rank_share = pm.Beta("rank_share", 0.5, 1.0)
        slot_share = pm.Beta("slot_share", 2.0, 2.0)
        slots = microbatches + bubble_efficiency * bubble_slots
        ref = int(d["reference_run"])
        rank_sigma = pm.Deterministic("rank_sigma", noise_scale * pt.sqrt(
            rank_share * slots[ref]) / float(d["max_rank_sd"][ref]))
        other = noise_scale * pt.sqrt(1.0 - rank_share)
        slot_noise = pm.Deterministic("slot_noise", other * pt.sqrt(slot_share * slots[ref]))
        step_noise = pm.Deterministic("step_noise", other * pt.sqrt(1.0 - slot_share))
        comm = comm_latency * lat_steps + comm_intra * intra_bw + comm_inter * inter_bw
        if "leaf_bandwidth" in d:  # stated fabric: crossing the spine costs extra
            leaf_bw = pm.Data("leaf_bandwidth", d["leaf_bandwidth"], dims="run")
            comm = comm + pm.LogNormal("comm_leaf", *LEAF_PRIOR) * leaf_bw
        shape = slots * pt.exp(work_exponent * log_work + rank_sigma * emax) + comm
        mb_log_median = pm.Deterministic("mb_log_median",
                                         reference_log_median - pt.log(shape[ref]))
        structural = mb_log_median + pt.log(shape)
        if marginal:
            location = _marginal_config_levels(d, run_log_median, structural,
                                               run_sd, layout_prior)[0][config_idx]
        else:
            if config_effects:  # fully non-centred configuration and run levels
                config_z = pm.Normal("config_z", 0.0, 1.0, dims="config")
                config_log_median = pm.Deterministic(
                    "config_log_median", structural[d["config_run"]] + config_sd * config_z,
                    dims="config")
                location = config_log_median[config_idx]
            else:
                location = structural
            if run_parameterisation == "noncentred":
                run_z = pm.Normal("run_z", 0.0, 1.0, dims="run")
                run_log_median = pm.Deterministic("run_log_median",
                                                  location + run_sd * run_z, dims="run")
            else:
                run_log_median = _anchored_run_levels(d)
                pm.Potential("run_level_prior",
                             pm.logp(pm.Normal.dist(location, run_sd), run_log_median).sum())
        pm.Deterministic("run_effect", run_log_median - location, dims="run")
        pm.Deterministic("run_median_s", pt.exp(run_log_median), dims="run")
        noise = pt.sqrt((rank_sigma**2 * smax**2 + slot_noise**2) / slots + step_noise**2)
        mu = run_log_median[run_idx]
        sigma = noise[run_idx]
        if noise_family == "normal":
            pm.Normal("log_step_time", mu, sigma, observed=d["log_step_time"], dims="obs")
        else:
            # spikes (a step that waits for a straggling node, a checkpoint, a hiccup of the
            # fabric) get more frequent with the node count: log-odds linear in log nodes,
            # anchored at the reference layout, one intercept and slope for all fitted runs.
            # Below 1/2, so the core is the majority: otherwise a chain can settle with the
            # "slow" component holding most steps and the run levels shifted (R-hat 1.85)
            log_nodes = pm.Data("log_nodes_rel", d["log_nodes_rel"], dims="run")
            spike_logit = pm.Normal("spike_logit", *SPIKE_LOGIT_PRIOR)
            spike_slope = pm.Normal("spike_slope", *layout_prior["spike_slope"])
            slow_weight = pm.Deterministic(
                "slow_weight", 0.5 * pm.math.sigmoid(spike_logit + spike_slope * log_nodes),
                dims="run")
            # Gamma(2, .) keeps the slow component away from the core (no label switching)
            slow_shift = pm.Gamma("slow_shift", 2.0, 10.0)
            slow_spread = pm.HalfNormal("slow_spread", 0.1)
            pm.CustomDist("log_step_time", mu, sigma, slow_weight[run_idx], slow_shift,
                          slow_spread,
                          logp=mixture_logp, observed=d["log_step_time"], dims="obs")
    return model
