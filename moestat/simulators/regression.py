r"""Simulation from a true mixture of experts.

Two generative models share one regression function :math:`f_G` (:class:`moestat.MoE`):

* ``model="regression"`` — the least-squares papers (nguyen2024 eq. 1):
  :math:`Y = f_G(X) + \varepsilon`, :math:`\varepsilon \sim \mathcal N(0, \nu)`;
* ``model="mixture"`` — the Gaussian MoE (Jordan & Jacobs 1994): draw the expert
  :math:`Z \mid X \sim \mathrm{Categorical}(\tilde\pi(X))`, then
  :math:`Y \mid X, Z=i \sim \mathcal N(h(X;\eta_i), \sigma_i^2)`.

Inputs are :math:`X \sim U[\mathrm{low}, \mathrm{high}]^d` (the papers' default,
:math:`U[-1,1]^d`) or :math:`N(0, I_d)`.  Replicate ``r`` draws from its own
stream ``numpy.random.default_rng(SeedSequence(seed).spawn(R)[r])``: adding
replicates never changes earlier ones, and one replicate can be re-drawn alone by
passing its child sequence as ``seed=[child]``.
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


@validate_arguments(n=Integer(1), reps=Optional(Integer(1)), seed=Seed(), inputs=Choice("uniform", "gaussian"),
                    low=Real(), high=Real(), model=Choice("regression", "mixture"))
def simulate(spec: MoE, params: Params, n: int, reps: int | None = None, seed: SeedLike = None, *,
             inputs: str = "uniform", low: float = -1.0, high: float = 1.0,
             model: str = "regression") -> Dataset:
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
    if reps is None and params.is_batched and not isinstance(seed, (list, tuple)):
        reps = params.n_reps
    seeds = replicate_seeds(seed, reps)
    R = len(seeds)
    if params.is_batched and params.n_reps != R:
        raise ValueError(f"params has R={params.n_reps} replicates but {R} are simulated; "
                         "pass unbatched params or reps=params.n_reps.")
    p = params.numpy().batched(R) if not params.is_batched else params.numpy()
    rngs = [np.random.default_rng(s) for s in seeds]
    X = np.stack([draw_inputs(g, n, spec.d, inputs, low, high) for g in rngs])
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
