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
