"""Importable helpers for tests/test_study*.py (worker processes import them by module path)."""

from __future__ import annotations

import numpy as np
import pandas as pd

LINEAR_TRUTH = {
    "label": "lin",
    "gate": "softmax",
    "expert": "linear",
    "k": 1,
    "d": 3,
    "noise_sd": 0.5,
    "params": {
        "gate_bias": [0.0],
        "gate_weight": [[0.0, 0.0, 0.0]],
        "expert_weight": [[1.0, -2.0, 0.5]],
        "expert_bias": [0.3],
    },
}


def normal_equations_cell(ctx) -> pd.DataFrame:
    """A custom cell: least squares of a one-expert linear model by the normal equations (numpy).

    Independent of the built-in 'ols' estimator (torch QR), so the two can be checked against each
    other; returns the slope error per replicate and the residual mean square.
    """
    data = ctx.data()
    truth = ctx.truth().params.numpy()
    X, y = data.X, data.y
    Z = np.concatenate([X, np.ones((*X.shape[:2], 1))], axis=-1)
    coef = np.linalg.solve(np.einsum("rni,rnj->rij", Z, Z), np.einsum("rni,rn->ri", Z, y)[..., None])[..., 0]
    resid = y - np.einsum("rni,ri->rn", Z, coef)
    slope_err = np.linalg.norm(coef[:, :-1] - truth.expert_weight[0], axis=-1)
    return pd.DataFrame({"rep": np.arange(ctx.reps), "slope_error": slope_err,
                         "objective": (resid**2).mean(-1)})


def slope_error(ctx) -> np.ndarray:
    """Metric: Euclidean error of the fitted expert slope (k = 1 models)."""
    fitted = ctx.fit.params.numpy().expert_weight[:, 0, :]
    return np.linalg.norm(fitted - ctx.truth.numpy().expert_weight[0], axis=-1)


def sleepy_cell(ctx) -> pd.DataFrame:
    """A custom cell that holds its worker for a minute (for tests that kill a study while cells run)."""
    import time

    time.sleep(60.0)
    return pd.DataFrame({"rep": np.arange(ctx.reps), "objective": np.zeros(ctx.reps)})


def picky_ols(spec, X, y, *, truth=None, seed=None, device="cpu", y0_above=float("inf"), y0_below=float("-inf")):
    """The 'ols' estimator, except that it raises for a batch holding a replicate whose first response exceeds
    ``y0_above``, and flags replicates whose first response is below ``y0_below`` as not converged (failures of
    known replicates, for the failure-row tests)."""
    from moestat.cells import ols_estimator

    bad = np.flatnonzero(y[:, 0] > y0_above)
    if bad.size:
        raise ValueError(f"y[0] = {y[bad[0], 0]:.3f} is above {y0_above}")
    est = ols_estimator(spec, X, y, truth=truth, seed=seed, device=device)
    est.converged = ~(y[:, 0] < y0_below)
    return est


def broken_metric(ctx) -> np.ndarray:
    """A metric that always raises (for the metric-failure test)."""
    raise RuntimeError("this metric is broken")


def raising_cell(ctx) -> pd.DataFrame:
    """A custom cell that raises (a whole-cell failure)."""
    raise RuntimeError(f"cell at n={ctx.n} cannot run")


def mean_estimate_cell(ctx):
    """A custom cell on its own data (no MoE truth): the sample mean of N(mu, 1) draws by replicate, with a
    per-replicate running-mean history as a side piece.  ``ctx.truth_cfg["data"]`` holds ``mu``; the fit's
    ``options`` hold ``shrink`` (the estimator multiplies the mean by it)."""
    from moestat.study import CellOutput

    mu = float(ctx.truth_cfg["data"]["mu"])
    shrink = float(ctx.fit_cfg["options"].get("shrink", 1.0))
    rngs = [np.random.default_rng(s) for s in ctx.data_seed.spawn(ctx.reps)]
    draws = np.stack([g.normal(mu, 1.0, size=ctx.n) for g in rngs])
    estimate = shrink * draws.mean(1)
    running = np.cumsum(draws, 1) / np.arange(1, ctx.n + 1)
    history = pd.DataFrame({"rep": np.repeat(np.arange(ctx.reps), ctx.n), "step": np.tile(np.arange(ctx.n), ctx.reps),
                            "running_mean": running.ravel()})
    return CellOutput(pd.DataFrame({"rep": np.arange(ctx.reps), "estimate": estimate, "error": estimate - mu}),
                      {"history": history})


NAP_ENV = "MOESTAT_TEST_NAP"
"""Environment variable read by :func:`napping_cell`: ``"SECONDS:N"`` makes every cell with ``n < N`` sleep
``SECONDS`` first; ``"SECONDS:N:stubborn"`` also makes it ignore SIGTERM while it sleeps."""


def napping_cell(ctx) -> pd.DataFrame:
    """A custom cell on its own data that can be made to hold its worker (for the Ctrl-C tests).

    Its result is the sample mean of ``n`` N(mu, 1) draws per replicate (``mu`` from the truth's ``data``
    table), drawn from the cell's data seed, so a cell's rows are the same whenever and wherever it runs.
    The environment variable :data:`NAP_ENV` (inherited by pool workers) makes small cells sleep before they
    compute, without being part of the study's configuration: an interrupted run that naps and a reference run
    that does not have the same frame.
    """
    import os
    import signal
    import time

    spec = os.environ.get(NAP_ENV, "")
    if spec:
        seconds, below, *flags = spec.split(":")
        if ctx.n < int(below):
            if "stubborn" in flags:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(float(seconds))
    mu = float(ctx.truth_cfg["data"]["mu"])
    rngs = [np.random.default_rng(s) for s in ctx.data_seed.spawn(ctx.reps)]
    estimate = np.array([g.normal(mu, 1.0, size=ctx.n).mean() for g in rngs])
    return pd.DataFrame({"rep": np.arange(ctx.reps), "estimate": estimate, "error": estimate - mu})


def stubborn_sleep(ready, seconds: float) -> None:
    """A process target that ignores SIGTERM, sets the event ``ready`` and sleeps (for the worker-ending test)."""
    import signal
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(seconds)
