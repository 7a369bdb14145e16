r"""Numerical checks of the strong and weak identifiability conditions of nguyen2024.

With :math:`F(x; \beta_1, \beta_0, \eta) = \sigma(\beta_1^\top x + \beta_0)\, h(x, \eta)` (sigmoid gate),
the conditions ask that a family of derivative functions be linearly independent in :math:`x`:

* **weak** (Definition 2): :math:`\{\partial F/\partial\beta_1, \partial F/\partial\beta_0,
  \partial F/\partial\eta\}` at every atom :math:`(\beta_{1i}, \beta_{0i}, \eta_i)`;
* **strong** (Definition 1): for the atoms that are over-specified (default: the atoms with zero gate
  slope) the class (S1) of derivatives of order 0, 1 and 2 in :math:`(\beta_1, \eta)` at
  :math:`\beta_1 = 0_d`; for the others the first-order class (S2), the same as the weak family.
  At :math:`\beta_1 = 0_d` the gate derivatives are constants times monomials
  (:math:`\partial^{\gamma_1}\sigma/\partial\beta_1^{\gamma_1} = \sigma^{(|\gamma_1|)}(\beta_0) x^{\gamma_1}`),
  so (S1) is the set :math:`\{x^{\gamma_1}\partial^{\gamma_2} h(x, \eta): |\gamma_1| + |\gamma_2| \le 2\}`.
  For ridge experts :math:`\partial h/\partial a = x\,\partial h/\partial b`, so
  :math:`x^{\gamma_1}\partial^{\gamma_2}h = x^{\gamma_1 + \gamma_{2,a}}\varphi^{(|\gamma_2|)}(a^\top x + b)`
  depends only on :math:`(\gamma_1 + \gamma_{2,a}, |\gamma_2|)`: the set holds each such function once.
  Second-order members that vanish identically on the sample (relu and linear have
  :math:`\varphi'' = 0`) do not occur in the Taylor expansion and are dropped (listed in ``columns``).

Each function is evaluated on the sample ``X`` with torch autograd (``torch.func``), the columns are
scaled to unit norm and the singular values of the :math:`m \times p` matrix are computed.  A relative
singular value below ``rtol`` flags a (numerical) linear dependence; the right singular vector is the
near-null combination, reported with the function labels.

Known failures: relu and linear ridge experts are positively 1-homogeneous, so
:math:`h = a^\top\partial_a h + b\,\partial_b h`; this breaks (S1) at every atom with zero gate slope
and the weak family too, through :math:`\partial F/\partial\beta_0 = (1 - \sigma(\beta_0))
(a^\top\partial_a F + b\,\partial_b F)` at :math:`\beta_1 = 0_d`.  GELU, tanh and sigmoid experts do not
have this identity.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import torch

from .._torch import to_numpy
from .._validation import Choice, Real, check_choice, validate_arguments
from ..model import MoE
from ..params import Params


@dataclass(frozen=True)
class IdentifiabilityResult:
    """Singular values of the column-normalised derivative family and its near-null combinations.

    Attributes
    ----------
    kind : str
        ``"strong"`` or ``"weak"``.
    identifiable : bool
        True when every relative singular value is at least ``rtol``.
    rank : int
        Number of relative singular values >= ``rtol``.
    singular_values : ndarray
        Singular values of the column-normalised family, descending.
    rtol : float
    columns : pandas.DataFrame
        One row per function: ``column`` (index in the matrix, -1 if dropped), ``atom``, ``class``
        (``"S1"``, ``"S2"`` or ``"weak"``), ``function`` (label), ``status`` and ``norm``.
    null_vectors : pandas.DataFrame
        For every deficient direction (or the weakest one if none is deficient): ``direction``,
        ``relative_singular_value``, ``atom``, ``function``, ``coefficient`` (on the unit-norm columns)
        and ``coefficient_raw`` (on the functions themselves: ``sum coefficient_raw * f = 0``).
    """

    kind: str
    identifiable: bool
    rank: int
    singular_values: np.ndarray
    rtol: float
    columns: pd.DataFrame
    null_vectors: pd.DataFrame

    @property
    def relative(self) -> np.ndarray:
        """Singular values divided by the largest."""
        return self.singular_values / self.singular_values[0]

    def to_frame(self) -> pd.DataFrame:
        """Tidy frame: one row per singular value with ``relative`` and ``deficient``."""
        rel = self.relative
        return pd.DataFrame({"kind": self.kind, "index": np.arange(len(rel)),
                             "singular_value": self.singular_values, "relative": rel,
                             "deficient": rel < self.rtol, "rtol": self.rtol})


def _eta_names(d: int, ridge: bool) -> list[str]:
    return ([f"a[{u}]" for u in range(d)] + ["b"]) if ridge else ["b"]


def _atom_functions(spec: MoE, X: torch.Tensor, b0: torch.Tensor, b1: torch.Tensor, a: torch.Tensor,
                    b: torch.Tensor):
    """Closures F(theta, x) and h(eta, x) for one atom; theta = (beta1, beta0, eta)."""
    fam = spec.family
    d = X.shape[-1]
    ridge = fam.input_dependent

    def h(eta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if ridge:
            return fam.activation(eta[:d] @ x + eta[d])
        return eta[0] + 0.0 * x.sum()

    def F(theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(theta[:d] @ x + theta[d])
        return gate * h(theta[d + 1:], x)

    eta = torch.cat([a, b.reshape(1)]) if ridge else b.reshape(1)
    theta = torch.cat([b1, b0.reshape(1), eta])
    return F, h, theta, eta, ridge


def _first_order(F, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    return torch.func.vmap(torch.func.jacrev(F), in_dims=(None, 0))(theta, X)      # (m, P)


def _s1_columns(h, eta: torch.Tensor, X: torch.Tensor, ridge: bool, d: int, eta_names: list[str]):
    """The set {x^g1 d^g2 h : |g1| + |g2| <= 2} at one atom, as (values, labels, keep flags)."""
    m, q = X.shape[0], eta.shape[0]
    h0 = torch.func.vmap(h, in_dims=(None, 0))(eta, X)                               # (m,)
    jac = torch.func.vmap(torch.func.jacrev(h), in_dims=(None, 0))(eta, X)          # (m, q)
    # reverse-over-reverse (torch.func.hessian is forward-over-reverse and loads deprecated jit decompositions)
    hess = torch.func.vmap(torch.func.jacrev(torch.func.jacrev(h)), in_dims=(None, 0))(eta, X)   # (m, q, q)
    # gamma_2 as a tuple of eta indices (order 0, 1 or 2); gamma_1 as a tuple of x indices.
    g2_list = [(), *[(i,) for i in range(q)], *itertools.combinations_with_replacement(range(q), 2)]
    seen: dict[tuple, int] = {}
    vals, labels, second = [], [], []
    for g2 in g2_list:
        for n1 in range(0, 3 - len(g2)):
            for g1 in itertools.combinations_with_replacement(range(d), n1):
                if ridge:   # x^g1 d^g2 h = x^(g1 + g2_a) phi^(|g2|): key on the monomial and the order
                    mono = tuple(sorted(g1 + tuple(i for i in g2 if i < d)))
                    key = (mono, len(g2))
                else:
                    key = (tuple(sorted(g1)), g2)
                if key in seen:
                    continue
                seen[key] = len(vals)
                base = h0 if not g2 else (jac[:, g2[0]] if len(g2) == 1 else hess[:, g2[0], g2[1]])
                col = base.clone()
                for u in g1:
                    col = col * X[:, u]
                vals.append(col)
                lab_x = "*".join(f"x[{u}]" for u in g1)
                lab_h = "h" if not g2 else "d^{}h/{}".format(len(g2), "".join(f"d{eta_names[i]}" for i in g2))
                labels.append(f"{lab_x}*{lab_h}" if lab_x else lab_h)
                second.append(len(g2) == 2)
    return torch.stack(vals, dim=1) if vals else torch.zeros(m, 0, dtype=X.dtype), labels, second


def _validate(spec: MoE, params: Params, kind: str, X: Any) -> tuple[Params, torch.Tensor]:
    if not isinstance(spec, MoE):
        raise TypeError(f"spec must be a moestat.MoE, got {type(spec).__name__}.")
    if not isinstance(params, Params):
        raise TypeError(f"params must be a moestat.Params, got {type(params).__name__}.")
    check_choice("kind", kind, ("strong", "weak"))
    if spec.gate != "sigmoid":
        raise ValueError(f"check_identifiability implements nguyen2024 Definitions 1-2 for sigmoid gates; "
                         f"got gate={spec.gate!r}. Use MoE(gate='sigmoid', ...).")
    if params.is_batched:
        raise ValueError("params must be unbatched (one set of atoms); use params.select(rep).")
    if params.d != spec.d:
        raise ValueError(f"params has d={params.d} but spec has d={spec.d}.")
    if X is None:
        raise ValueError("X, a sample of inputs of shape (m, d), is required.")
    Xt = torch.as_tensor(np.asarray(to_numpy(X), dtype=np.float64))
    if Xt.ndim != 2 or Xt.shape[1] != spec.d:
        raise ValueError(f"X must have shape (m, {spec.d}), got {tuple(Xt.shape)}.")
    if not bool(torch.isfinite(Xt).all()):
        raise ValueError("X contains NaN or infinite values.")
    return params.numpy(), Xt


def derivative_family(spec: MoE, params: Params, kind: str = "strong", X: Any = None, *,
                      over_specified: list[int] | None = None,
                      slope_tol: float = 0.0) -> tuple[np.ndarray, pd.DataFrame]:
    r"""The functions of nguyen2024 Definition 1 (``"strong"``) or 2 (``"weak"``) evaluated on ``X``.

    Parameters are those of :func:`check_identifiability`.

    Returns
    -------
    matrix : ndarray, shape (m, p)
        One column per kept function, unscaled, computed with torch autograd.
    columns : pandas.DataFrame
        One row per function (kept or dropped): ``column`` (-1 if dropped), ``atom``, ``class``
        (``"S1"``, ``"S2"``, ``"weak"``), ``function`` (label such as ``dF/dbeta0`` or
        ``x[0]*d^1h/db``), ``status``, ``norm``.
    """
    p, Xt = _validate(spec, params, kind, X)
    k, d = p.k, p.d
    if over_specified is None:
        over = [i for i in range(k) if np.linalg.norm(p.gate_weight[i]) <= slope_tol]
    else:
        over = sorted({int(i) for i in over_specified})
        if any(not 0 <= i < k for i in over):
            raise ValueError(f"over_specified must hold atom indices in range({k}), got {over_specified}.")
    if kind == "weak":
        over = []
    ridge = spec.family.input_dependent
    eta_names = _eta_names(d, ridge)
    theta_names = [f"beta1[{u}]" for u in range(d)] + ["beta0"] + eta_names

    cols, rows = [], []
    for i in range(k):
        t = {name: torch.as_tensor(np.asarray(getattr(p, name)[i], dtype=np.float64))
             for name in ("gate_bias", "gate_weight", "expert_weight", "expert_bias")}
        b1 = torch.zeros(d, dtype=torch.float64) if i in over else t["gate_weight"]
        F, h, theta, eta, _ = _atom_functions(spec, Xt, t["gate_bias"], b1, t["expert_weight"], t["expert_bias"])
        if i in over:
            vals, labels, second = _s1_columns(h, eta, Xt, ridge, d, eta_names)
            klass = "S1"
        else:
            vals = _first_order(F, theta, Xt)
            labels = [f"dF/d{n}" for n in theta_names]
            second = [False] * len(labels)
            klass = "S2" if kind == "strong" else "weak"
        norms = torch.linalg.vector_norm(vals, dim=0)
        for c in range(vals.shape[1]):
            dropped = second[c] and bool(norms[c] == 0)
            rows.append({"atom": i, "class": klass, "function": labels[c], "norm": float(norms[c]),
                         "status": "dropped: vanishes on X (not in the expansion)" if dropped else "kept"})
            if not dropped:
                cols.append(vals[:, c])
    columns = pd.DataFrame(rows)
    kept = columns["status"] == "kept"
    columns["column"] = -1
    columns.loc[kept, "column"] = np.arange(int(kept.sum()))
    matrix = to_numpy(torch.stack(cols, dim=1)) if cols else np.zeros((Xt.shape[0], 0))
    return matrix, columns[["column", "atom", "class", "function", "status", "norm"]]


@validate_arguments(kind=Choice("strong", "weak"), rtol=Real(0, 1, open_low=True, open_high=True), slope_tol=Real(0))
def check_identifiability(spec: MoE, params: Params, kind: str = "strong", X: Any = None, *,
                          over_specified: list[int] | None = None, rtol: float = 1e-10,
                          slope_tol: float = 0.0) -> IdentifiabilityResult:
    r"""Build the derivative family of nguyen2024 Definition 1 or 2 and test its linear independence.

    Parameters
    ----------
    spec : MoE
        Specification with ``gate="sigmoid"`` (the definitions are stated for sigmoid gates) and the
        expert family to test.
    params : Params
        Unbatched atoms :math:`(\beta_{0i}, \beta_{1i}, \eta_i)` at which the family is built (e.g. the
        truth).
    kind : {"strong", "weak"}
        Definition 1 (classes S1 and S2) or Definition 2.
    X : array, shape (m, d)
        Sample from :math:`\mu` on which the functions are evaluated; ``m`` must be at least the number
        of functions (a few times more is better).
    over_specified : list of int, optional
        ``kind="strong"``: atoms that get class (S1); default: atoms with
        :math:`\|\beta_{1i}\| \le` ``slope_tol`` (zero gate slope).
    rtol : float
        Relative singular value below which the family is declared linearly dependent.
    slope_tol : float
        Threshold on :math:`\|\beta_{1i}\|` for the default ``over_specified``.

    Returns
    -------
    IdentifiabilityResult
        ``.identifiable``, ``.singular_values``, ``.to_frame()`` (tidy singular values),
        ``.null_vectors`` (near-null combinations with function labels), ``.columns``.

    Examples
    --------
    >>> import numpy as np, moestat as ms
    >>> spec = ms.MoE(gate="sigmoid", expert="relu", k=1, d=1)
    >>> atom = ms.Params([0.3], [[0.0]], [[1.0]], [0.2])
    >>> X = np.random.default_rng(0).uniform(-1, 1, size=(400, 1))
    >>> ms.check_identifiability(spec, atom, "strong", X).identifiable
    False
    """
    if not (0 < rtol < 1):
        raise ValueError(f"rtol must lie in (0, 1), got {rtol}.")
    matrix, columns = derivative_family(spec, params, kind, X, over_specified=over_specified, slope_tol=slope_tol)
    kept = columns["status"] == "kept"
    M = torch.as_tensor(matrix)
    if M.shape[0] < M.shape[1]:
        raise ValueError(f"X has m={M.shape[0]} rows but the family has {M.shape[1]} functions; "
                         f"pass at least {M.shape[1]} (preferably several times more) input points.")
    norms = torch.linalg.vector_norm(M, dim=0)
    Mn = M / torch.where(norms > 0, norms, torch.ones_like(norms))
    _, s, vh = torch.linalg.svd(Mn, full_matrices=False)
    s_np = to_numpy(s)
    rel = s_np / s_np[0] if s_np[0] > 0 else np.zeros_like(s_np)
    deficient = np.flatnonzero(rel < rtol)
    show = deficient if deficient.size else np.array([len(s_np) - 1])
    kept_rows = columns[kept].reset_index(drop=True)
    v = to_numpy(vh)
    nn = []
    for n_dir, idx in enumerate(show):
        coef = v[idx]
        raw = coef / np.where(to_numpy(norms) > 0, to_numpy(norms), 1.0)
        nn.append(pd.DataFrame({"direction": n_dir, "relative_singular_value": rel[idx],
                                "atom": kept_rows["atom"], "class": kept_rows["class"],
                                "function": kept_rows["function"], "coefficient": coef,
                                "coefficient_raw": raw}))
    null_vectors = pd.concat(nn, ignore_index=True)
    rank = int((rel >= rtol).sum())
    return IdentifiabilityResult(kind=kind, identifiable=deficient.size == 0, rank=rank, singular_values=s_np,
                                 rtol=rtol, columns=columns, null_vectors=null_vectors)


def homogeneity_orbit(params: Params, atom: int, t: float) -> Params:
    r"""Exact reparametrisation of a positively 1-homogeneous expert with a constant gate.

    For an atom with :math:`\beta_1 = 0_d` and :math:`\varphi(tz) = t\varphi(z)` (relu, linear),

    .. math:: \sigma(\beta_0')\,\varphi(t(a^\top x + b)) \equiv \sigma(\beta_0)\,\varphi(a^\top x + b),
              \qquad \sigma(\beta_0') = \sigma(\beta_0)/t,

    for any :math:`t > \sigma(\beta_0)`.  Returns ``params`` with atom ``atom`` replaced by
    :math:`(\beta_0', 0_d, t a, t b)`: the same regression function, a different mixing measure.

    Raises
    ------
    ValueError
        If the atom's gate slope is not zero or ``t <= sigma(beta_0)``.
    """
    if not isinstance(params, Params) or params.is_batched:
        raise TypeError("params must be an unbatched moestat.Params.")
    p = params.numpy()
    if not 0 <= atom < p.k:
        raise ValueError(f"atom must be in range({p.k}), got {atom}.")
    if np.any(p.gate_weight[atom] != 0):
        raise ValueError("the orbit needs a constant gate: atom's gate_weight must be exactly 0.")
    w = 1.0 / (1.0 + np.exp(-p.gate_bias[atom]))
    if not t > w:
        raise ValueError(f"t must exceed sigma(beta0) = {w:.6g} so that sigma(beta0') = sigma(beta0)/t < 1.")
    new_w = w / t
    gb, ew, eb = p.gate_bias.copy(), p.expert_weight.copy(), p.expert_bias.copy()
    gb[atom] = np.log(new_w) - np.log1p(-new_w)
    ew[atom] = t * ew[atom]
    eb[atom] = t * eb[atom]
    return replace(p, gate_bias=gb, expert_weight=ew, expert_bias=eb)
