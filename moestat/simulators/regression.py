r"""Simulation from a true mixture of experts.

Two generative models share one regression function :math:`f_G` (:class:`moestat.MoE`):

* ``model="regression"`` — the least-squares papers (nguyen2024 eq. 1):
  :math:`Y = f_G(X) + \varepsilon`, :math:`\varepsilon \sim \mathcal N(0, \nu)`;
* ``model="mixture"`` — the Gaussian MoE (Jordan & Jacobs 1994): draw the expert
  :math:`Z \mid X \sim \mathrm{Categorical}(\tilde\pi(X))`, then
  :math:`Y \mid X, Z=i \sim \mathcal N(h(X;\eta_i), \sigma_i^2)`.

Inputs are random (``design="random"``, the default): :math:`X \sim U[\mathrm{low}, \mathrm{high}]^d`
(the papers' default, :math:`U[-1,1]^d`) or :math:`N(0, I_d)`, drawn afresh for every replicate.  A
**fixed design** keeps the same inputs in every replicate and draws only the responses:
``design="linspace"`` (an evenly spaced grid on :math:`[\mathrm{low}, \mathrm{high}]`; for ``d > 1`` the
full factorial grid of ``m = n^{1/d}`` points per column) or a user array of shape ``(n, d)``.  Replicate
``r`` draws from its own stream ``numpy.random.default_rng(SeedSequence(seed).spawn(R)[r])``: adding
replicates never changes earlier ones, and one replicate can be re-drawn alone by passing its child
sequence as ``seed=[child]``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from .._torch import to_numpy, to_tensor
from .._validation import (
    Choice,
    Integer,
    Optional,
    Real,
    Seed,
    check_choice,
    check_int,
    validate_arguments,
)
from ..model import MoE
from ..params import Params
from ._shapes import ReplicateShapes

SeedLike = int | np.random.SeedSequence | Sequence[np.random.SeedSequence] | None


@dataclass(frozen=True)
class Dataset(ReplicateShapes):
    """Simulated data for R replicates.

    Attributes
    ----------
    X : ndarray, shape (R, n, d)
    y : ndarray, shape (R, n)
    z : ndarray of int, shape (R, n), or None
        The latent expert of each observation (``model="mixture"`` only).
    seeds : list of numpy.random.SeedSequence
        The stream of each replicate.
    """

    X: np.ndarray
    y: np.ndarray
    z: np.ndarray | None
    seeds: list[np.random.SeedSequence]


    @property
    def d(self) -> int:
        return int(self.X.shape[2])

    def select(self, rep: int) -> Dataset:
        """Replicate ``rep`` as a one-replicate Dataset."""
        sl = slice(rep, rep + 1) if rep != -1 else slice(-1, None)
        return Dataset(self.X[sl], self.y[sl], None if self.z is None else self.z[sl], [self.seeds[rep]])

    def to_frame(self) -> pd.DataFrame:
        """Long frame: one row per (rep, obs) with columns x0..x{d-1}, y (and z)."""
        R, n, d = self.X.shape
        cols = {"rep": np.repeat(np.arange(R), n), "obs": np.tile(np.arange(n), R)}
        for j in range(d):
            cols[f"x{j}"] = self.X[:, :, j].ravel()
        cols["y"] = self.y.ravel()
        if self.z is not None:
            cols["z"] = self.z.ravel()
        return pd.DataFrame(cols)


def replicate_seeds(seed: SeedLike, reps: int | None) -> list[np.random.SeedSequence]:
    """One SeedSequence per replicate: ``SeedSequence(seed).spawn(reps)`` or the given children."""
    if isinstance(seed, (list, tuple)):
        if not all(isinstance(s, np.random.SeedSequence) for s in seed):
            raise TypeError("seed given as a sequence must hold numpy.random.SeedSequence objects.")
        if reps is not None and reps != len(seed):
            raise ValueError(f"reps={reps} disagrees with the {len(seed)} seed sequences given.")
        return list(seed)
    r = 1 if reps is None else check_int("reps", reps)
    if isinstance(seed, np.random.SeedSequence):
        root = np.random.SeedSequence(seed.entropy, spawn_key=seed.spawn_key)
    elif seed is None or isinstance(seed, numbers.Integral):
        root = np.random.SeedSequence(None if seed is None else int(seed))
    else:
        raise TypeError(f"seed must be an int, a SeedSequence or a list of them, got {type(seed).__name__}.")
    return root.spawn(r)


def draw_inputs(rng: np.random.Generator, n: int, d: int, inputs: str, low: float, high: float
                ) -> np.ndarray:
    """Draw an (n, d) input matrix from U[low, high]^d or N(0, I_d)."""
    if inputs == "uniform":
        return rng.uniform(low, high, size=(n, d))
    return rng.standard_normal(size=(n, d))


DESIGNS = ("random", "linspace")
"""Named input designs of :func:`simulate` (besides a user array)."""


def linspace_design(n: int, d: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    r"""The evenly spaced fixed design: ``linspace(low, high, n)`` for ``d = 1``; the full factorial grid for ``d > 1``.

    For ``d > 1`` every column takes the ``m`` values ``linspace(low, high, m)`` with :math:`m^d = n`, and the rows
    are all :math:`m^d` combinations (the last column varies fastest).  Repeating one linspace in every column
    would make the columns collinear (a singular design), so ``n`` must be a perfect ``d``-th power.

    Returns
    -------
    ndarray, shape (n, d)
    """
    n, d = check_int("n", n), check_int("d", d)
    if not high > low:
        raise ValueError(f"design='linspace' needs high > low, got low={low}, high={high}.")
    if d == 1:
        return np.linspace(low, high, n)[:, None]
    m = round(n ** (1.0 / d))
    if m**d != n:
        near = sorted({max(m - 1, 1) ** d, m**d, (m + 1) ** d})
        raise ValueError(f"design='linspace' with d={d} is the full grid of m points per column, so n must be "
                         f"m**{d}; n={n} is not (nearby valid n: {near}). Choose such an n or pass the design as an "
                         "(n, d) array.")
    axis = np.linspace(low, high, m)
    grid = np.meshgrid(*([axis] * d), indexing="ij")
    return np.stack([g.ravel() for g in grid], axis=-1)


def fixed_design(design: str | np.ndarray, n: int, d: int, low: float, high: float) -> np.ndarray | None:
    """The (n, d) input matrix of a fixed design, or None for ``design="random"`` (see :func:`simulate`)."""
    if isinstance(design, str):
        check_choice("design", design, DESIGNS)
        return None if design == "random" else linspace_design(n, d, low, high)
    if isinstance(design, torch.Tensor):
        design = design.detach().cpu().numpy()
    try:
        X = np.array(design, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"design must be 'random', 'linspace' or a numeric array of shape (n, d), got "
                        f"{type(design).__name__} ({exc}).") from None
    if X.ndim == 1 and d == 1:
        X = X[:, None]
    if X.shape != (n, d):
        raise ValueError(f"design array has shape {X.shape} but the simulation needs (n, d) = ({n}, {d}); pass one row "
                         "per observation and one column per input (or n=len(design)).")
    if not np.isfinite(X).all():
        raise ValueError("design array contains NaN or infinite values; every input must be finite.")
    return X


@validate_arguments(n=Integer(1), reps=Optional(Integer(1)), seed=Seed(), inputs=Choice("uniform", "gaussian"),
                    low=Real(), high=Real(), model=Choice("regression", "mixture"))
def simulate(spec: MoE, params: Params, n: int, reps: int | None = None, seed: SeedLike = None, *,
             inputs: str = "uniform", low: float = -1.0, high: float = 1.0,
             model: str = "regression", design: str | np.ndarray = "random") -> Dataset:
    r"""Simulate R replicate data sets of size n from a true MoE.

    Parameters
    ----------
    spec : MoE
        The model specification (gate, expert, k, d, noise_sd).
    params : Params
        True parameters, unbatched (shared by all replicates) or batched with R = reps.
    n : int
        Sample size per replicate.
    reps : int, optional
        Number of replicates (default 1, or the number of seed sequences / batched params).
    seed : int, SeedSequence or list of SeedSequence
        Master seed; replicate r uses ``SeedSequence(seed).spawn(reps)[r]``.
    inputs : {"uniform", "gaussian"}
        :math:`U[\mathrm{low},\mathrm{high}]^d` or :math:`N(0, I_d)`.
    model : {"regression", "mixture"}
        :math:`Y = f_G(X) + \varepsilon` with noise sd ``spec.noise_sd`` (or
        ``params.noise_sd`` if every expert shares one value), or the Gaussian MoE
        generative model with per-expert noise.
    design : {"random", "linspace"} or array of shape (n, d)
        ``"random"`` (default): inputs drawn per replicate as ``inputs`` says.  A fixed design uses the
        same inputs in every replicate and draws only the responses (the noise, and for ``model="mixture"``
        the latent experts) from the replicate's stream: ``"linspace"`` is :func:`linspace_design`
        (``linspace(low, high, n)`` for ``d = 1``; the full grid of :math:`m = n^{1/d}` points per column on
        :math:`[\mathrm{low}, \mathrm{high}]` for ``d > 1``, so ``n`` must be an ``m**d``); an array is used as
        given.  ``inputs="gaussian"`` only applies to the random design.

    Returns
    -------
    Dataset
        ``X (R, n, d)``, ``y (R, n)``, ``z (R, n)`` for ``model="mixture"``.

    Examples
    --------
    >>> import moestat as ms
    >>> spec, truth = ms.presets.sigmoid_vs_softmax(regime=2, expert="relu", seed=0)
    >>> data = ms.simulate(spec, truth, n=1000, reps=20, seed=1)
    >>> data.X.shape, data.y.shape
    ((20, 1000, 32), (20, 1000))
    """
    if not isinstance(spec, MoE):
        raise TypeError(f"spec must be a moestat.MoE, got {type(spec).__name__}.")
    spec.check_params(params)
    n = check_int("n", n)
    check_choice("inputs", inputs, ("uniform", "gaussian"))
    check_choice("model", model, ("regression", "mixture"))
    if inputs == "uniform" and not high > low:
        raise ValueError(f"high must exceed low for uniform inputs, got low={low}, high={high}.")
    fixed = fixed_design(design, n, spec.d, low, high)
    if fixed is not None and inputs != "uniform":
        raise ValueError(f"inputs={inputs!r} draws random inputs, but design is fixed (the same inputs in every "
                         "replicate); use design='random' with inputs='gaussian', or drop inputs.")
    if reps is None and params.is_batched and not isinstance(seed, (list, tuple)):
        reps = params.n_reps
    seeds = replicate_seeds(seed, reps)
    R = len(seeds)
    if params.is_batched and params.n_reps != R:
        raise ValueError(f"params has R={params.n_reps} replicates but {R} are simulated; "
                         "pass unbatched params or reps=params.n_reps.")
    p = params.numpy().batched(R) if not params.is_batched else params.numpy()
    rngs = [np.random.default_rng(s) for s in seeds]
    if fixed is None:
        X = np.stack([draw_inputs(g, n, spec.d, inputs, low, high) for g in rngs])
    else:
        X = np.repeat(fixed[None], R, axis=0)
    Xt = to_tensor(X)
    pt = p.to_torch("cpu", torch.float64)
    noise = np.stack([g.standard_normal(n) for g in rngs])
    if model == "regression":
        sd = _regression_noise_sd(spec, p)
        y = to_numpy(spec.mean_torch(pt, Xt)) + sd[:, None] * noise
        return Dataset(X, y, None, seeds)
    gates = spec._gates(pt, Xt)
    weights = to_numpy(gates / gates.sum(-1, keepdim=True))
    u = np.stack([g.uniform(size=n) for g in rngs])
    cum = np.cumsum(weights, axis=-1)
    z = np.minimum((u[..., None] > cum).sum(-1), spec.k - 1)
    mu = to_numpy(spec._experts(pt, Xt))
    sd_k = to_numpy(spec._noise_sd(pt, Xt))
    mu_z = np.take_along_axis(mu, z[..., None], axis=-1)[..., 0]
    sd_z = np.take_along_axis(sd_k, z, axis=-1)
    return Dataset(X, mu_z + sd_z * noise, z, seeds)


def _regression_noise_sd(spec: MoE, p: Params) -> np.ndarray:
    if p.noise_sd is None:
        return np.full(p.n_reps or 1, spec.noise_sd)
    sd = np.asarray(p.noise_sd)
    if not np.allclose(sd, sd[:, :1]):
        raise ValueError("model='regression' has one noise level; params.noise_sd differs across experts. "
                         "Use model='mixture' for per-expert noise or drop params.noise_sd.")
    return sd[:, 0]
