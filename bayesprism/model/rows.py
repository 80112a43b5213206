"""Row-level (per-launch) likelihoods of the kernel model.

No sufficient statistics exist for a Student-t or a two-component residual, so these fit every
launch (tables up to ``bayesprism.model.kernel.MAX_ROWS``) with the GPU×step effects sampled;
the lognormal row likelihood is the reference the collapsed cell likelihood is checked against.
"""

from __future__ import annotations

import numpy as np

from bayesprism.spec import ModelSpec

# PyMC and PyTensor are imported inside the functions that build graphs (start-up time).


def row_likelihood(prepared, spec: ModelSpec, a_free, beta, resid, gpustep) -> None:
    """Per-launch likelihood of the kernel model (lognormal, Student-t or mixture residual).

    ``mu`` of a launch is its kernel's free baseline plus its GPU-step's unit effects
    (``beta``, GPU-step × class) plus, when fitted, the sampled GPU×step effect ``gpustep_z``
    times its class's scale.
    """
    import pymc as pm

    d = prepared.data
    cls = d["kernel_class_of_kernel"]
    k = pm.Data("row_kernel", d["row_kernel"], dims="row")
    gs = pm.Data("row_gpustep", d["row_gpustep"], dims="row")
    c = pm.Data("row_class", cls[d["row_kernel"]], dims="row")
    mu = a_free[k] + beta[gs, c]
    if gpustep is not None:
        z = pm.Normal("gpustep_z", 0.0, 1.0, dims="gpustep")
        mu = mu + gpustep[c] * z[gs]
    noise = _step_noise_factor(prepared, spec)
    if spec.likelihood == "mixture":
        _mixture_likelihood(spec, mu, resid, c, d["row_log_duration"], noise)
        return
    if spec.likelihood == "lognormal":
        pm.Normal("log_duration", mu=mu, sigma=resid[c] * noise,
                  observed=d["row_log_duration"], dims="row")
        return
    nu_excess = pm.Gamma("resid_nu_minus_one", 2.0, spec.prior("nu_rate"), dims="kernel_class")
    nu = pm.Deterministic("resid_nu", 1.0 + nu_excess, dims="kernel_class")
    pm.StudentT("log_duration", nu=nu[c], mu=mu, sigma=resid[c] * noise,
                observed=d["row_log_duration"], dims="row")


def _step_noise_factor(prepared, spec: ModelSpec):
    """Each row's residual-scale factor ``exp(step_noise[step])`` (1.0 without ``step_noise``,
    or when the step level was dropped: runs of a single step have no repeats to compare).

    ``step_noise`` is centred and zero-sum over the fitted steps: steps are data-rich (every
    GPU's launches inform each), the regime where centred zero-sum effects mix, and the sum
    constraint keeps the per-class ``resid_scale`` the scale of a typical step.
    """
    if not (spec.step_noise and "step" in prepared.attrs["levels"]):
        return 1.0
    import pymc as pm
    import pytensor.tensor as pt

    d = prepared.data
    scale = pm.HalfNormal("step_noise_scale", spec.prior("step_noise_scale"))
    log_factor = pm.ZeroSumNormal("step_noise", sigma=scale, dims="step_unit")
    row_step = pm.Data("row_step", d["gpustep_step"][d["row_gpustep"]], dims="row")
    return pt.exp(log_factor)[row_step]


def _mixture_likelihood(spec: ModelSpec, mu, resid, row_class, observed: np.ndarray,
                        noise=1.0) -> None:
    """Two-component residual per class: ε ~ (1 − w)·N(0, σ) + w·N(δ, √(σ² + τ²)).

    With ``step_noise`` a step's core sd is σ times its factor ``noise`` (in both components:
    the slow one's sd is √((σ·noise)² + τ²)); δ and τ, the rare slow launches, are not
    stretched (stretching δ too put a noisy step's slow launches at e^{19 δ}: measured on PAL,
    the slowest of 64 new runs twice too slow).

    The slow component is ordered after the core twice over (δ ≥ 0 and an sd ≥ σ) and its
    weight has a Beta(1, b) prior with a small mean, so the labels cannot switch; with no slow
    launches in the data the posterior of w piles up at 0 and δ, τ fall back to their priors.
    Both components are lognormal in duration, so every moment of a duration is finite
    (expected maxima of many launches stay finite, unlike the Student-t residual's).

    Durations recorded at a timer resolution q (Kineto: whole µs) are rounded: each component
    gets the rounding variance (q/d)²/12 of the row's log duration added (Sheppard). Without
    it a component collapses onto the repeated value of a short kernel (σ → 0, unbounded
    density; measured on the DLRM traces: memcpy σ = 4e-9, step size 3e-4, R-hat 3).
    """
    import pymc as pm
    import pytensor.tensor as pt

    weight = pm.Beta("resid_slow_weight", 1.0, spec.prior("resid_slow_weight_beta"),
                     dims="kernel_class")
    shift = pm.HalfNormal("resid_slow_shift", spec.prior("resid_slow_shift"), dims="kernel_class")
    extra = pm.HalfNormal("resid_slow_extra", spec.prior("resid_slow_sd"), dims="kernel_class")
    slow_sd = pm.Deterministic("resid_slow_sd", pt.sqrt(resid**2 + extra**2),
                               dims="kernel_class")
    durations = np.exp(observed)
    rounding = pm.Data("row_rounding_var", (timer_resolution(durations) / durations) ** 2 / 12.0,
                       dims="row")
    w = weight[row_class]
    if spec.step_noise:
        core_var = (resid[row_class] * noise) ** 2
        slow_var = core_var + extra[row_class] ** 2
    else:  # the same values; kept as the expressions the mixture tests were measured on
        core_var, slow_var = resid[row_class] ** 2, slow_sd[row_class] ** 2
    pm.NormalMixture(
        "log_duration",
        w=pt.stack([1.0 - w, w], axis=-1),
        mu=pt.stack([mu, mu + shift[row_class]], axis=-1),
        sigma=pt.stack([pt.sqrt(core_var + rounding),
                        pt.sqrt(slow_var + rounding)], axis=-1),
        observed=observed,
        dims="row",
    )


#: Timer resolutions (µs) recognised in recorded durations, coarsest first.
RESOLUTIONS_US = (1.0, 0.1, 0.01, 0.001)


def timer_resolution(duration_us: np.ndarray) -> float:
    """The coarsest of :data:`RESOLUTIONS_US` every duration is a whole multiple of (else 0).

    Parameters
    ----------
    duration_us
        Recorded durations (µs), possibly through ``exp(log(d))`` (round-off tolerated).

    Returns
    -------
    float
        The resolution in µs, 0.0 when the durations are on no such grid.
    """
    d = np.asarray(duration_us, dtype=float)
    for q in RESOLUTIONS_US:
        k = d / q
        if np.all(np.abs(k - np.round(k)) <= 1e-6 + 1e-12 * k):
            return q
    return 0.0
