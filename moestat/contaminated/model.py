r"""Contaminated mixture of experts: a frozen (known, pre-trained) component and one trainable prompt expert.

The conditional density is

.. math::

    p(y \mid x) = \bigl(1 - w(x)\bigr)\, f_0(y \mid x) + w(x)\, \mathcal N\bigl(y;\ \varphi(a^\top x + b),\ \nu\bigr),

with :math:`f_0` the frozen model (held fixed: never estimated), the prompt expert a Gaussian ridge expert with
mean :math:`\varphi(a^\top x + b)` (:mod:`moestat.experts`; ``"linear"`` by default) and variance :math:`\nu`, and
the mixing weight

* ``gate="constant"``: :math:`w(x) = \lambda \in (0, 1)` — Yan, Nguyen, Le, Akbarian & Ho (2025), "Understanding
  expert structures on minimax parameter estimation in contaminated mixture of experts", AISTATS 2025
  (arXiv:2410.12258);
* ``gate="softmax"``: :math:`w(x) = e^{\beta^\top x + \tau} / (1 + e^{\beta^\top x + \tau})`, the two-expert softmax
  with the frozen expert's score fixed at 0 — Yan, Nguyen, Le, Akbarian, Ho & Rinaldo (2025), "On minimax
  estimation of parameters in softmax-contaminated mixture of experts", NeurIPS 2025 (arXiv:2505.18455).

:class:`FrozenExpert` wraps :math:`f_0`: a known or fitted moestat Gaussian MoE (:meth:`FrozenExpert.from_moe`),
one Gaussian ridge expert (:meth:`FrozenExpert.gaussian`), or any callable log-density.  The prompt's parameters
are :math:`\theta = (a, b, \nu)` (:class:`ContaminatedParams`; ``var`` is the variance :math:`\nu`, as in both
papers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd

from .._validation import check_int
from ..experts import get_expert
from ..model import MoE
from ..params import Params

__all__ = ["GATES", "ContaminatedData", "ContaminatedMoE", "ContaminatedParams", "FrozenExpert"]

GATES = ("constant", "softmax")
"""The mixing weights: a constant :math:`\\lambda` (AISTATS 2025) or a softmax gate of :math:`x` (NeurIPS 2025)."""

_LOG_2PI = math.log(2.0 * math.pi)
LogDensity = Callable[[np.ndarray, np.ndarray], np.ndarray]
Sampler = Callable[[np.ndarray, np.random.Generator], np.ndarray]


def _array(name: str, value: Any, ndim: int) -> np.ndarray:
    """``value`` as a finite float array with ``ndim`` or ``ndim + 1`` (batched) dimensions."""
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a numeric array, got {type(value).__name__}.") from exc
    if arr.ndim not in (ndim, ndim + 1):
        raise ValueError(f"{name} must have {ndim} dimension(s) (or {ndim + 1} with a leading replicate axis R), "
                         f"got shape {arr.shape}.")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or infinite values; give finite parameters.")
    return arr


# ----------------------------------------------------------------------------- the frozen component
@dataclass(frozen=True)
class FrozenExpert:
    r"""The frozen (pre-trained, known) component :math:`f_0(y \mid x)` of a contaminated MoE.

    Parameters
    ----------
    log_density : callable
        ``log_density(X, y) -> array (n,)``: :math:`\log f_0(y_t \mid x_t)` for inputs ``X`` (n, d) and responses
        ``y`` (n,).
    sample : callable, optional
        ``sample(X, rng) -> array (n,)``: draws :math:`y_t \sim f_0(\cdot \mid x_t)` (needed to simulate).
    d : int, optional
        The input dimension :math:`f_0` expects (checked against the data when given).
    gaussian : dict, optional
        When :math:`f_0 = \mathcal N(y; \varphi_0(a_0^\top x + b_0), \nu_0)` is one Gaussian ridge expert: its
        ``expert`` family name, ``weight`` :math:`a_0` (d,), ``bias`` :math:`b_0` and ``var`` :math:`\nu_0`.  A
        prompt of the same family can then equal :math:`f_0`: the *non-distinguishable* setting of both papers.
    label : str
        A name for reports.

    Examples
    --------
    >>> import numpy as np
    >>> f0 = FrozenExpert.gaussian_expert(weight=[1.0], bias=0.0, var=0.25)
    >>> round(float(f0.log_density(np.zeros((1, 1)), np.zeros(1))[0]), 6)  # log N(0; 0, 0.25)
    -0.225791
    """

    log_density: LogDensity
    sample: Sampler | None = None
    d: int | None = None
    gaussian: dict[str, Any] | None = None
    label: str = "frozen"

    def __post_init__(self) -> None:
        if not callable(self.log_density):
            raise TypeError(f"log_density must be a callable (X, y) -> log f0(y | x), got "
                            f"{type(self.log_density).__name__}.")
        if self.sample is not None and not callable(self.sample):
            raise TypeError(f"sample must be None or a callable (X, rng) -> y, got {type(self.sample).__name__}.")
        if self.d is not None:
            check_int("d", self.d)

    @classmethod
    def gaussian_expert(cls, weight: Sequence[float] | np.ndarray, bias: float, var: float, *,
                        expert: str = "linear", label: str | None = None) -> FrozenExpert:
        r"""One Gaussian ridge expert :math:`f_0(y \mid x) = \mathcal N(y; \varphi(a_0^\top x + b_0), \nu_0)`.

        Parameters
        ----------
        weight : array, shape (d,)
            :math:`a_0`.
        bias : float
            :math:`b_0`.
        var : float
            :math:`\nu_0 > 0`, the variance.
        expert : str
            The ridge family of :math:`\varphi` (:data:`moestat.experts.EXPERTS`).
        """
        a0 = _array("weight", weight, 1)
        if a0.ndim != 1:
            raise ValueError(f"weight must be a vector (d,), got shape {a0.shape}.")
        b0, v0 = float(bias), float(var)
        if not np.isfinite(b0):
            raise ValueError(f"bias must be finite, got {bias!r}.")
        if not (np.isfinite(v0) and v0 > 0):
            raise ValueError(f"var must be a finite variance > 0, got {var!r}; e.g. var=0.25.")
        family = get_expert(expert)

        def log_density(X: np.ndarray, y: np.ndarray) -> np.ndarray:
            mean = family.numpy(np.asarray(X, float) @ a0 + b0)
            out: np.ndarray = -0.5 * (_LOG_2PI + math.log(v0)) - (np.asarray(y, float) - mean) ** 2 / (2.0 * v0)
            return out

        def sample(X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
            mean = family.numpy(np.asarray(X, float) @ a0 + b0)
            return mean + math.sqrt(v0) * rng.standard_normal(mean.shape)

        info = {"expert": family.name, "weight": a0.copy(), "bias": b0, "var": v0}
        return cls(log_density, sample, d=int(a0.shape[0]), gaussian=info,
                   label=label or f"N({family.name}({a0.tolist()} x + {b0:g}), {v0:g})")

    @classmethod
    def from_moe(cls, spec: MoE, params: Params, *, label: str | None = None) -> FrozenExpert:
        r"""A known or fitted Gaussian moestat MoE as the frozen model: :math:`f_0 = ` ``spec.loglik(params, ...)``.

        A one-expert MoE (``params.k == 1``) is a single Gaussian ridge expert and also records ``gaussian``.

        Parameters
        ----------
        spec : MoE
            Its specification (Gaussian experts: ``response="gaussian"``).
        params : Params
            Unbatched parameters (a fit's replicate: ``fit.params.select(0)``-style, or a truth's).
        """
        if not isinstance(spec, MoE):
            raise TypeError(f"spec must be a moestat.MoE, got {type(spec).__name__}.")
        if not isinstance(params, Params):
            raise TypeError(f"params must be a moestat.Params, got {type(params).__name__}.")
        if spec.response != "gaussian":
            raise ValueError(f"the frozen MoE must have Gaussian experts (response='gaussian'), got "
                             f"response={spec.response!r}.")
        spec.check_params(params)
        p = params.numpy()
        if p.is_batched:
            raise ValueError("params must be unbatched (one parameter set); select one replicate first.")
        sd = np.asarray(p.noise_sd, float) if p.noise_sd is not None else np.full(p.k, float(spec.noise_sd))
        if not (sd > 0).all():
            raise ValueError("the frozen MoE needs noise_sd > 0 for every expert.")

        def log_density(X: np.ndarray, y: np.ndarray) -> np.ndarray:
            return np.asarray(spec.loglik(p, np.asarray(X, float), np.asarray(y, float), reduce="none"), float)

        def sample(X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
            X = np.asarray(X, float)
            w = np.asarray(spec.gate_weights(p, X), float)
            means = np.asarray(spec.expert_means(p, X), float)
            u = rng.random((X.shape[0],))
            comp = np.minimum((np.cumsum(w, axis=1) < u[:, None]).sum(axis=1), int(p.k) - 1)
            rows = np.arange(X.shape[0])
            out: np.ndarray = means[rows, comp] + sd[comp] * rng.standard_normal(X.shape[0])
            return out

        gaussian = None
        if p.k == 1:
            gaussian = {"expert": spec.family.name, "weight": np.asarray(p.expert_weight[0], float).copy(),
                        "bias": float(p.expert_bias[0]), "var": float(sd[0] ** 2)}
        return cls(log_density, sample, d=spec.d, gaussian=gaussian,
                   label=label or f"MoE({spec.gate}, {spec.expert}, k={spec.k})")

    def theta0(self) -> np.ndarray:
        r""":math:`\theta_0 = (a_0, b_0, \nu_0)` of a Gaussian frozen expert (ValueError otherwise)."""
        if self.gaussian is None:
            raise ValueError(f"the frozen model {self.label!r} is not one Gaussian ridge expert, so it has no "
                             "parameters theta0 in the prompt's coordinates; build it with "
                             "FrozenExpert.gaussian_expert or from a one-expert MoE.")
        g = self.gaussian
        return np.concatenate([np.asarray(g["weight"], float), [g["bias"], g["var"]]])


# ----------------------------------------------------------------------------- parameters
@dataclass(frozen=True, eq=False)
class ContaminatedParams:
    r"""Parameters of a contaminated MoE (the frozen model's are not among them), optionally batched over R.

    Parameters
    ----------
    weight : array, shape (d,) or (R, d)
        Prompt slope :math:`a`.
    bias : array, shape () or (R,)
        Prompt intercept :math:`b`.
    var : array, shape () or (R,)
        Prompt variance :math:`\nu > 0`.
    lam : array, shape () or (R,), optional
        Constant mixing weight :math:`\lambda \in [0, 1]` (``gate="constant"``).
    gate_weight, gate_bias : arrays, shapes (d,) / () or (R, d) / (R,), optional
        Softmax gate :math:`\beta` and :math:`\tau` (``gate="softmax"``).

    Notes
    -----
    Exactly one of ``lam`` or (``gate_weight``, ``gate_bias``) must be given.
    """

    weight: Any
    bias: Any
    var: Any
    lam: Any = None
    gate_weight: Any = None
    gate_bias: Any = None
    batched: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        a = _array("weight", self.weight, 1)
        batched = a.ndim == 2
        R = a.shape[0] if batched else 1
        d = a.shape[-1]
        vals: dict[str, np.ndarray | None] = {"weight": a.reshape(R, d)}
        for name in ("bias", "var", "lam", "gate_bias"):
            value = getattr(self, name)
            if value is None:
                vals[name] = None
                continue
            arr = _array(name, value, 0)
            if (arr.ndim == 1) != batched or (batched and arr.shape[0] != R):
                raise ValueError(f"{name} has shape {arr.shape} but weight {a.shape} implies "
                                 f"{(R,) if batched else ()}; give every block the same replicate axis.")
            vals[name] = arr.reshape(R)
        if self.gate_weight is None:
            vals["gate_weight"] = None
        else:
            gw = _array("gate_weight", self.gate_weight, 1)
            if gw.shape != a.shape:
                raise ValueError(f"gate_weight has shape {gw.shape} but weight has {a.shape}; both are (d,) or "
                                 "(R, d).")
            vals["gate_weight"] = gw.reshape(R, d)
        if vals["bias"] is None or vals["var"] is None:
            raise ValueError("bias and var are required (the prompt's intercept and variance).")
        if not (vals["var"] > 0).all():
            raise ValueError(f"var must be > 0 (the prompt's variance), got {np.asarray(self.var).tolist()}.")
        has_lam, has_gate = vals["lam"] is not None, (vals["gate_weight"] is not None, vals["gate_bias"] is not None)
        if has_lam == any(has_gate) or (any(has_gate) and not all(has_gate)):
            raise ValueError("give either lam (a constant mixing weight) or both gate_weight and gate_bias (a "
                             "softmax gate), not both and not neither.")
        lam = vals["lam"]
        if lam is not None and not bool(((lam >= 0) & (lam <= 1)).all()):
            raise ValueError(f"lam must lie in [0, 1], got {np.asarray(self.lam).tolist()}.")
        for name, value in vals.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "batched", batched)

    # ------------------------------------------------------------------ shape and views
    @property
    def gate(self) -> str:
        """``"constant"`` or ``"softmax"``."""
        return "constant" if self.lam is not None else "softmax"

    @property
    def n_reps(self) -> int:
        return int(self.weight.shape[0])

    @property
    def d(self) -> int:
        return int(self.weight.shape[1])

    def theta(self) -> np.ndarray:
        r"""The prompt's parameters :math:`\theta = (a, b, \nu)`, shape (R, d + 2)."""
        return np.concatenate([self.weight, self.bias[:, None], self.var[:, None]], axis=1)

    def gate_vector(self) -> np.ndarray:
        r"""The gate's parameters: :math:`\lambda` (R, 1) or :math:`(\beta, \tau)` (R, d + 1)."""
        if self.lam is not None:
            out: np.ndarray = self.lam[:, None].copy()
            return out
        return np.concatenate([self.gate_weight, self.gate_bias[:, None]], axis=1)

    def select(self, rep: int | Sequence[int] | np.ndarray) -> ContaminatedParams:
        """Replicate(s) ``rep`` as batched parameters."""
        idx = np.atleast_1d(np.asarray(rep, dtype=np.int64))
        kw = {f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[idx])
              for f in fields(self) if f.init}
        return ContaminatedParams(**kw)

    def unbatched(self) -> ContaminatedParams:
        """The single parameter set of a one-replicate object, without the replicate axis."""
        if self.n_reps != 1:
            raise ValueError(f"unbatched() needs one replicate, these parameters have R={self.n_reps}; use "
                             "select(r) first.")
        kw = {f.name: (None if getattr(self, f.name) is None else getattr(self, f.name)[0])
              for f in fields(self) if f.init}
        return ContaminatedParams(**kw)

    def to_frame(self) -> pd.DataFrame:
        """Long frame: one row per replicate x block x coefficient (``block`` ``gate`` or ``prompt``)."""
        rows = []
        for r in range(self.n_reps):
            if self.lam is not None:
                rows.append((r, "gate", "lam", float(self.lam[r])))
            else:
                rows += [(r, "gate", f"x{j + 1}", float(self.gate_weight[r, j])) for j in range(self.d)]
                rows.append((r, "gate", "const", float(self.gate_bias[r])))
            rows += [(r, "prompt", f"x{j + 1}", float(self.weight[r, j])) for j in range(self.d)]
            rows += [(r, "prompt", "const", float(self.bias[r])), (r, "prompt", "var", float(self.var[r]))]
        return pd.DataFrame(rows, columns=["rep", "block", "coef", "estimate"])

    @classmethod
    def stack(cls, items: Sequence[ContaminatedParams]) -> ContaminatedParams:
        """Concatenate parameter sets along the replicate axis."""
        if not items:
            raise ValueError("stack() needs at least one ContaminatedParams.")
        kw = {}
        for f in fields(cls):
            if not f.init:
                continue
            parts = [getattr(p, f.name) for p in items]
            kw[f.name] = None if any(v is None for v in parts) else np.concatenate(parts, axis=0)
        return cls(**kw)


# ----------------------------------------------------------------------------- data
@dataclass(frozen=True)
class ContaminatedData:
    """Simulated data of R replicates: ``X`` (R, n, d), ``y`` (R, n), the latent prompt indicator ``z`` (R, n) and
    each replicate's seed."""

    X: np.ndarray
    y: np.ndarray
    z: np.ndarray
    seeds: list[np.random.SeedSequence]


# ----------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class ContaminatedMoE:
    r"""A contaminated MoE: the frozen model, the gate (``"constant"`` or ``"softmax"``) and the prompt's ridge
    family (see the module docstring for the density).

    Parameters
    ----------
    frozen : FrozenExpert
        :math:`f_0`, held fixed.
    gate : {"constant", "softmax"}
    expert : str
        The prompt's ridge family (``"linear"`` default; any :data:`moestat.experts.EXPERTS` with slope and intercept
        except ``"constant"``).
    d : int
        Input dimension.
    """

    frozen: FrozenExpert
    gate: str = "constant"
    expert: str = "linear"
    d: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.frozen, FrozenExpert):
            raise TypeError(f"frozen must be a FrozenExpert (FrozenExpert.from_moe, .gaussian_expert or a "
                            f"log-density), got {type(self.frozen).__name__}.")
        if self.gate not in GATES:
            raise ValueError(f"gate={self.gate!r} is not supported; valid values are {list(GATES)}.")
        family = get_expert(self.expert)
        if not family.input_dependent:
            raise ValueError(f"expert={self.expert!r} has no slope; the prompt needs a ridge expert such as "
                             "'linear', 'tanh' or 'gelu'.")
        check_int("d", self.d)
        if self.frozen.d is not None and self.frozen.d != self.d:
            raise ValueError(f"the frozen model takes d={self.frozen.d} inputs but the contaminated MoE has "
                             f"d={self.d}; build it with d={self.frozen.d}.")

    @property
    def distinguishable(self) -> bool:
        r"""Whether the prompt's family cannot reproduce :math:`f_0`: False when :math:`f_0` is one Gaussian ridge
        expert of the prompt's own family (then the prompt can converge to it: the papers' non-distinguishable
        setting), True otherwise (e.g. a frozen multi-expert MoE, or a frozen expert of another family)."""
        g = self.frozen.gaussian
        return g is None or g["expert"] != get_expert(self.expert).name

    @property
    def n_gate(self) -> int:
        """Number of gate parameters (1 or d + 1)."""
        return 1 if self.gate == "constant" else self.d + 1

    @property
    def n_params(self) -> int:
        """Free parameters: the gate's and the prompt's :math:`(a, b, \\nu)`."""
        return self.n_gate + self.d + 2

    # ------------------------------------------------------------------ checks
    def check_params(self, params: ContaminatedParams) -> None:
        if not isinstance(params, ContaminatedParams):
            raise TypeError(f"params must be a ContaminatedParams, got {type(params).__name__}.")
        if params.gate != self.gate:
            raise ValueError(f"params are for gate={params.gate!r} but the model has gate={self.gate!r}.")
        if params.d != self.d:
            raise ValueError(f"params have d={params.d} inputs but the model has d={self.d}.")

    def _data(self, X: Any, y: Any | None = None) -> tuple[np.ndarray, np.ndarray | None]:
        """X as (R, n, d) and y as (R, n), checked."""
        X = _array("X", X, 2)
        X = X[None] if X.ndim == 2 else X
        if X.shape[-1] != self.d:
            raise ValueError(f"X has {X.shape[-1]} columns but the model has d={self.d}.")
        if y is None:
            return X, None
        y = _array("y", y, 1)
        y = y[None] if y.ndim == 1 else y
        if y.shape != X.shape[:2]:
            raise ValueError(f"y has shape {y.shape} but X has {X.shape}; y must be (n,) or (R, n) matching X.")
        return X, y

    def frozen_log_density(self, X: Any, y: Any) -> np.ndarray:
        r""":math:`\log f_0(y_t \mid x_t)`, shape (R, n)."""
        X, y = self._data(X, y)
        assert y is not None
        out = np.stack([np.asarray(self.frozen.log_density(X[r], y[r]), float).reshape(-1) for r in range(len(X))])
        if out.shape != y.shape or not np.isfinite(out).all():
            raise ValueError(f"the frozen log-density returned shape {out.shape} (finite: "
                             f"{bool(np.isfinite(out).all())}); it must return finite values of shape (n,).")
        return out

    # ------------------------------------------------------------------ pieces of the density
    def prompt_weight(self, params: ContaminatedParams, X: Any) -> np.ndarray:
        """The mixing weight :math:`w(x)` of the prompt, shape (R, n)."""
        self.check_params(params)
        X, _ = self._data(X)
        log_w, _ = _log_weights(params, X)
        out: np.ndarray = np.exp(log_w)
        return out

    def prompt_mean(self, params: ContaminatedParams, X: Any) -> np.ndarray:
        r"""The prompt's mean :math:`\varphi(a^\top x + b)`, shape (R, n)."""
        self.check_params(params)
        X, _ = self._data(X)
        return get_expert(self.expert).numpy(_affine(X, params.weight, params.bias))

    def log_density(self, params: ContaminatedParams, X: Any, y: Any, *, log_f0: np.ndarray | None = None
                    ) -> np.ndarray:
        r"""Per-observation :math:`\log p(y_t \mid x_t)`, shape (R, n) (``log_f0``: the frozen log-density if known)."""
        comp = self.log_components(params, X, y, log_f0=log_f0)
        out: np.ndarray = np.logaddexp(comp[0], comp[1])
        return out

    def log_components(self, params: ContaminatedParams, X: Any, y: Any, *, log_f0: np.ndarray | None = None
                       ) -> np.ndarray:
        r""":math:`(\log[(1 - w) f_0],\ \log[w\, \mathcal N(y; \varphi(a^\top x + b), \nu)])`, shape (2, R, n)."""
        self.check_params(params)
        X, y = self._data(X, y)
        assert y is not None
        lf0 = self.frozen_log_density(X, y) if log_f0 is None else np.broadcast_to(log_f0, y.shape)
        log_w, log_1mw = _log_weights(params, X)
        mean = get_expert(self.expert).numpy(_affine(X, params.weight, params.bias))
        var = params.var[:, None]
        log_fp = -0.5 * (_LOG_2PI + np.log(var)) - (y - mean) ** 2 / (2.0 * var)
        return np.stack([log_1mw + lf0, log_w + log_fp])

    def loglik(self, params: ContaminatedParams, X: Any, y: Any) -> np.ndarray:
        """Log-likelihood per replicate, shape (R,)."""
        out: np.ndarray = self.log_density(params, X, y).sum(axis=-1)
        return out

    def responsibilities(self, params: ContaminatedParams, X: Any, y: Any) -> np.ndarray:
        r"""Posterior probability that :math:`y_t` came from the prompt, shape (R, n)."""
        comp = self.log_components(params, X, y)
        out: np.ndarray = 1.0 / (1.0 + np.exp(np.clip(comp[0] - comp[1], -700, 700)))
        return out

    # ------------------------------------------------------------------ simulation
    def simulate(self, params: ContaminatedParams, n: int | None = None, *, X: Any = None, reps: int = 1,
                 seed: int | np.random.SeedSequence | None = None, inputs: str = "uniform",
                 low: float = -1.0, high: float = 1.0) -> ContaminatedData:
        r"""Draw R replicate data sets: :math:`x \sim U[\mathrm{low}, \mathrm{high}]^d` (``inputs="uniform"``) or
        :math:`N(0, I_d)` (``"normal"``) unless ``X`` is given, then :math:`z \sim \mathrm{Bernoulli}(w(x))` and
        :math:`y \sim \mathcal N(\varphi(a^\top x + b), \nu)` if :math:`z = 1`, else :math:`y \sim f_0(\cdot\mid x)`.

        Replicate ``r`` uses child ``r`` of ``SeedSequence(seed)`` (adding replicates never changes earlier ones).
        Unbatched ``params`` are used for every replicate; batched ones need ``R == reps``.
        """
        self.check_params(params)
        if self.frozen.sample is None:
            raise ValueError(f"the frozen model {self.frozen.label!r} has no sampler; give FrozenExpert(sample=...) "
                             "to simulate from it.")
        reps = check_int("reps", reps)
        if inputs not in ("uniform", "normal"):
            raise ValueError(f"inputs={inputs!r} is not supported; valid values are ['normal', 'uniform'].")
        if X is None:
            n = check_int("n", n) if n is not None else None
            if n is None:
                raise ValueError("simulate() needs n (the sample size) or X (the inputs).")
        if params.n_reps not in (1, reps):
            raise ValueError(f"params have R={params.n_reps} replicates but reps={reps}; give one parameter set or "
                             "one per replicate.")
        root = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
        children = root.spawn(reps)
        Xs, ys, zs = [], [], []
        for r, child in enumerate(children):
            rng = np.random.default_rng(child)
            if X is None:
                assert n is not None
                Xr = rng.uniform(low, high, (n, self.d)) if inputs == "uniform" else rng.standard_normal((n, self.d))
            else:
                Xr = self._data(X)[0][0 if np.ndim(X) == 2 else r]
            p = params.select(r if params.n_reps > 1 else 0)
            w = self.prompt_weight(p, Xr)[0]
            z = rng.random(Xr.shape[0]) < w
            mean = self.prompt_mean(p, Xr)[0]
            y_prompt = mean + np.sqrt(p.var[0]) * rng.standard_normal(Xr.shape[0])
            y_frozen = np.asarray(self.frozen.sample(Xr, rng), float).reshape(-1)
            Xs.append(Xr)
            ys.append(np.where(z, y_prompt, y_frozen))
            zs.append(z)
        return ContaminatedData(np.stack(Xs), np.stack(ys), np.stack(zs), list(children))


def _log_weights(params: ContaminatedParams, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log w, log(1 - w)) of the prompt, shape (R, n) (stable for scores of either sign)."""
    if params.lam is not None:
        lam = params.lam[:, None]
        with np.errstate(divide="ignore"):
            log_w, log_1mw = np.log(lam), np.log1p(-lam)
        shape = (max(X.shape[0], lam.shape[0]), X.shape[1])
        return np.broadcast_to(log_w, shape).copy(), np.broadcast_to(log_1mw, shape).copy()
    s = _affine(X, params.gate_weight, params.gate_bias)
    return -np.logaddexp(0.0, -s), -np.logaddexp(0.0, s)


def _affine(X: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    r""":math:`w^\top x + b` for X (R, n, d) and R or 1 parameter sets (broadcast), shape (R, n)."""
    if weight.shape[0] not in (1, X.shape[0]):
        raise ValueError(f"the parameters have R={weight.shape[0]} replicates but X has R={X.shape[0]}; give one "
                         "parameter set or one per replicate.")
    out: np.ndarray = np.matmul(X, weight[..., None])[..., 0] + bias[:, None]
    return out
