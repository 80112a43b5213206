"""GPU×step episodes that last: a two-state Markov chain over each GPU's steps.

Under the ``degraded`` GPU×step population a GPU-step is in an episode (slowed) or not
(``bayesprism.model.kernel``: each state's log marginal of the GPU-step's launches is known in
closed form). Episodes come in stretches: a GPU throttled at one step is likely throttled at the
next (dev traces: one GPU +13.6 % from step 109 to the end, another +6 % from step 108). Drawn
independently per step, a stretch of k slow steps costs the share w to the k-th power, so the
fit explained stretches otherwise (a GPU's own speed, a wider population).

The chain keeps the stationary share ``w`` and adds the lag-one correlation ``λ`` of the episode
state: over a gap of ``k`` steps of one run the state is kept with probability ``c = λ^k`` and
otherwise drawn afresh from (1 − w, w), i.e. the transition matrix ``c·I + (1 − c)·1·(1 − w,
w)``; at a GPU's first step of a run it is drawn afresh (c = 0). ``λ = 0`` is the independent
mixture exactly, and every step's marginal share is ``w`` whatever ``λ``, so a forecast's
single steps keep their law. A GPU's likelihood is the matrix product of its steps' (transition
× emission) matrices, taken as a balanced tree of rescaled 2×2 products (depth log₂ of the
longest sequence, vectorised over GPUs) rather than a sequential forward pass.
"""

from __future__ import annotations

import numpy as np


def step_lags(step_run: np.ndarray, step_local: np.ndarray) -> np.ndarray:
    """Steps since the previous step unit of the same run, 0 at a run's first.

    Step units are in (run, step) order, so a GPU's row of a (GPU × step) grid is its steps in
    order, with the steps it did not run (no launches) as steps without observations.

    Examples
    --------
    >>> step_lags(np.array([0, 0, 0, 1]), np.array([3, 4, 6, 0])).tolist()
    [0, 1, 2, 0]
    """
    step_run, step_local = np.asarray(step_run), np.asarray(step_local)
    follows = np.r_[False, step_run[1:] == step_run[:-1]]
    return np.where(follows, step_local - np.r_[0, step_local[:-1]], 0).astype(np.int64)


def episode_sequences(gs_gpu: np.ndarray, gs_step: np.ndarray, step_run: np.ndarray,
                      step_local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each GPU's GPU-steps in step order, and the steps since the previous one of its run
    (for GPU-steps not laid out as a grid).

    Parameters
    ----------
    gs_gpu, gs_step
        GPU unit and step unit of each GPU-step.
    step_run, step_local
        Run and step number of each step unit.

    Returns
    -------
    index : ndarray of int, shape (gpus, length)
        GPU-step indices per GPU in step order; padding (GPUs with fewer GPU-steps) points one
        past the last GPU-step.
    lag : ndarray of int, same shape
        Steps since the GPU's previous GPU-step of the same run; 0 at the first GPU-step of a
        run and in the padding (the state is drawn afresh there).

    Examples
    --------
    GPU 0 at steps 3, 4 and 6 of run 0, GPU 1 at step 4 of run 0 and step 0 of run 1:

    >>> index, lag = episode_sequences(np.array([0, 0, 0, 1, 1]), np.array([0, 1, 2, 1, 3]),
    ...                                np.array([0, 0, 0, 1]), np.array([3, 4, 6, 0]))
    >>> index.tolist(), lag.tolist()
    ([[0, 1, 2], [3, 4, 5]], [[0, 1, 2], [0, 0, 0]])
    """
    gs_gpu, gs_step = np.asarray(gs_gpu, dtype=np.int64), np.asarray(gs_step, dtype=np.int64)
    n_gs = gs_gpu.size
    order = np.lexsort((step_local[gs_step], step_run[gs_step], gs_gpu))
    gpu = gs_gpu[order]
    counts = np.bincount(gpu, minlength=int(gpu.max()) + 1 if n_gs else 0)
    length = max(int(counts.max()) if n_gs else 1, 1)
    slot = np.arange(n_gs) - np.repeat(np.cumsum(counts) - counts, counts)
    index = np.full((counts.size, length), n_gs, dtype=np.int64)
    index[gpu, slot] = order
    lag = np.zeros((counts.size, length), dtype=np.int64)
    run, local = step_run[gs_step[order]], step_local[gs_step[order]]
    follows = (slot > 0) & (np.r_[-1, run[:-1]] == run)
    lag[gpu[follows], slot[follows]] = (local - np.r_[0, local[:-1]])[follows]
    return index, lag


def episode_chain_loglik(core, slow, weight, persistence, lag, xp=np):
    """Log likelihood of GPU-steps under the episode chain, summed over GPUs.

    Parameters
    ----------
    core, slow
        Each GPU-step's log marginal outside and inside an episode, shape (gpus, steps) in
        step order (0 in both where a GPU has no observation at a step).
    weight, persistence
        The stationary episode share w and the lag-one correlation λ of the state.
    lag
        Steps since the previous column of the same run (0: drawn afresh), shape (steps,) or
        (gpus, steps): :func:`step_lags` or :func:`episode_sequences`.
    xp
        NumPy or PyTensor's ``tensor``.

    Examples
    --------
    With λ = 0 the GPU-steps are independent two-component mixtures:

    >>> core, slow = np.array([[0.0, -3.0, 1.0]]), np.array([[-2.0, 1.0, 0.5]])
    >>> lag = np.array([0, 1, 1])
    >>> mixture = np.logaddexp(np.log(0.9) + core, np.log(0.1) + slow).sum()
    >>> bool(np.isclose(episode_chain_loglik(core, slow, 0.1, 0.0, lag), mixture))
    True

    A stretch of slow steps is likelier when episodes last:

    >>> slow_run = np.full((1, 3), -5.0), np.zeros((1, 3))
    >>> lasting = episode_chain_loglik(*slow_run, 0.1, 0.8, lag)
    >>> bool(lasting > episode_chain_loglik(*slow_run, 0.1, 0.0, lag))
    True
    """
    # Products in linear space, each step's emissions scaled by their larger one and each
    # product by the sum of its entries, the scales summed in logs: exact, and cheaper than
    # products of log matrices (2×2 log-sum-exps at every node of the tree).
    top = xp.maximum(core, slow)
    emission = xp.stack([xp.exp(core - top), xp.exp(slow - top)], axis=-1)
    log_scale = xp.sum(top, axis=1)
    lag = np.asarray(lag)
    lags, lag_code = np.unique(lag, return_inverse=True)
    kept = np.where(lags > 0, 1.0, 0.0) * persistence ** np.maximum(lags, 1)  # c = λ^lag
    share = xp.stack([1.0 - weight, weight])
    transition = (kept[:, None, None] * np.eye(2)
                  + (1.0 - kept)[:, None, None] * share[None, None, :])  # (lag, from, to)
    step_matrix = transition[lag_code.reshape(lag.shape)] * emission[..., None, :]
    length = lag.shape[-1]
    while length > 1:
        paired = length - length % 2
        first, then = step_matrix[:, 0:paired:2], step_matrix[:, 1:paired:2]
        product = (first[..., :, 0, None] * then[..., None, 0, :]
                   + first[..., :, 1, None] * then[..., None, 1, :])
        total = xp.sum(product, axis=(-2, -1))
        product = product / total[..., None, None]
        log_scale = log_scale + xp.sum(xp.log(total), axis=1)
        step_matrix = product if paired == length else xp.concatenate(
            [product, step_matrix[:, paired:]], axis=1)
        length = (length + 1) // 2
    # the first step's transition rows are equal (drawn afresh): any row is the GPU's law
    return xp.sum(xp.log(step_matrix[:, 0, 0, 0] + step_matrix[:, 0, 0, 1]) + log_scale)
