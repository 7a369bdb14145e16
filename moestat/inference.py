r"""Inference beyond the information matrix: bootstrap, the bootstrap LRT for k, and choice of k.

* :func:`bootstrap` — parametric (:math:`y^*_t \sim \hat p(\cdot\mid x_t)` at the observed inputs) or
  nonparametric (resampled :math:`(x_t, y_t)` pairs) bootstrap of :math:`\hat\theta`.  All B refits run
  as one batched :func:`moestat.fit_mle` call, each started from the original estimate plus random
  starts.  Mixture labels are arbitrary, so every replicate is **aligned to the original fit** by the
  Hungarian algorithm (:func:`moestat.metrics.matching.optimal_assignment`) on the standardised distance between
  expert atoms :math:`(b_i, a_i, \log\sigma_i)`; softmax gates are then re-expressed relative to the
  (aligned) last expert.  Replicates whose refit failed (non-finite or not converged) are **reported and
  excluded, never silently redrawn** (contrast mixtools' ``boot.se``).
* :func:`test_n_experts` — parametric bootstrap likelihood-ratio test of :math:`k_0` against
  :math:`k_1 > k_0` experts (McLachlan 1987; flexmix ``LR_test``): the LR statistic
  :math:`2(\hat\ell_{k_1} - \hat\ell_{k_0})` has no :math:`\chi^2` limit (the null is on the boundary and
  non-identified), so its null distribution is simulated from the fitted :math:`k_0` model;
  :math:`p = (1 + \#\{LR^*_b \ge LR\})/(B_{ok} + 1)`.  The :math:`k_1` fit is started from the
  :math:`k_0` fit with its heaviest expert split in two (so :math:`\hat\ell_{k_1} \ge \hat\ell_{k_0}` up
  to the optimiser) plus random starts.  Batched: X of shape (R, n, d) tests R data sets at once.
* :func:`select_k` — information criteria (AIC/BIC/ICL) over a range of k.

All three take :func:`moestat.fit_mle`'s coefficients shared by every expert (``shared="~ z"`` with a formula,
``shared_columns=`` with arrays) and binomial trials (``trials=``): every refit keeps the shared-coefficient layout,
and resampled or simulated rows keep their numbers of trials.
"""

from __future__ import annotations

import difflib
import inspect
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy import stats

from ._progress import PROGRESS_AFTER_S, _expected_seconds, _interactive
from ._torch import to_numpy
from ._validation import (
    Boolean,
    Choice,
    Integer,
    Optional,
    Seed,
    as_numeric,
    check_choice,
    check_int,
    renamed_arguments,
    validate_arguments,
)
from .exceptions import DegenerateFitWarning, warn_user
from .fit._layout import ParamLayout
from .fit.formula_fit import formula_inputs
from .fit.mle import _check_data, _check_no_offset, _check_trials, fit_mle
from .fit.results import MLEConvergenceWarning, MLEFit, SingularInformationWarning, sample_mixture
from .gates import log_mixture_weights
from .metrics.matching import optimal_assignment
from .model import MoE
from .params import Params
from .report import Result

__all__ = ["BootstrapResult", "LRTResult", "SelectKResult", "bootstrap", "select_k", "split_start",
           "test_n_experts"]


# ------------------------------------------------------------------------------------------ progress
class _Stages:
    """Progress of a batched computation, one step per stage (a batched refit cannot report inside its batch).

    ``progress=True`` shows a tqdm bar at once, ``False`` never; ``None`` shows it in interactive sessions, when
    ``expected_s`` exceeds :data:`PROGRESS_AFTER_S`, or from the first stage boundary at which the time so far,
    extrapolated by the stages' ``weights`` (their relative cost), predicts a run longer than that."""

    def __init__(self, desc: str, stages: Sequence[str], progress: bool | None, *,
                 weights: Sequence[float] | None = None, expected_s: float | None = None) -> None:
        if progress is not None and not isinstance(progress, (bool, np.bool_)):
            raise TypeError(f"progress must be None (a bar for long or interactive runs), True or False, got "
                            f"{progress!r}.")
        self.desc, self.stages = desc, list(stages)
        self.weights = np.asarray(weights if weights is not None else np.ones(len(self.stages)), dtype=float)
        self.auto = progress is None
        self.done, self.t0, self.bar = 0, time.perf_counter(), None
        if progress or (self.auto and (_interactive() or (expected_s or 0.0) > PROGRESS_AFTER_S)):
            self._open()

    def _open(self) -> None:
        from tqdm.auto import tqdm

        # no rate or remaining time: stages differ in cost, so tqdm's extrapolation would mislead
        self.bar = tqdm(total=len(self.stages), initial=self.done, desc=self.desc, leave=False,
                        bar_format="{desc}: stage {n_fmt}/{total_fmt} done |{bar:10}| {elapsed} elapsed{postfix}")
        self._describe()

    def _describe(self) -> None:
        if self.bar is not None and self.done < len(self.stages):
            self.bar.set_postfix_str(f"now: {self.stages[self.done]}")

    def step(self) -> None:
        """The current stage is done: advance (and, under ``progress=None``, open the bar if the run looks long)."""
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            self._describe()
            return
        spent = float(self.weights[:self.done].sum())
        if self.auto and self.done < len(self.stages) and spent > 0:
            predicted = (time.perf_counter() - self.t0) * float(self.weights.sum()) / spent
            if predicted > PROGRESS_AFTER_S:
                self._open()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> _Stages:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fitted_components(spec: MoE, p: Params, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mixture weights (R, n, k), expert means (R, n, k) and sds (R, k) of batched params at X (R, n, d)."""
    pt = p.to_torch("cpu", torch.float64)
    Xt = torch.as_tensor(X, dtype=torch.float64)
    logits = Xt @ pt.gate_weight.transpose(-1, -2) + pt.gate_bias.unsqueeze(-2)
    w = log_mixture_weights(spec.gate, logits, top_k=spec.top_k, temperature=spec.temperature,
                            n_shared=spec.n_shared).exp()
    mu = spec.family.evaluate(Xt, pt.expert_weight, pt.expert_bias)
    if not spec.has_noise_sd:
        mu = spec.glm.inverse_link(mu)
    sd = pt.noise_sd if pt.noise_sd is not None else torch.ones_like(pt.gate_bias)
    return to_numpy(w), to_numpy(mu), to_numpy(sd)


def _draw(spec: MoE, p: Params, X: np.ndarray, B: int, seeds: Sequence[np.random.SeedSequence],
          trials: np.ndarray | None = None) -> np.ndarray:
    """B responses per replicate from the fitted conditional density at fixed X: (R, B, n) (replicate r draws
    from ``seeds[r]`` with :func:`moestat.fit.results.sample_mixture`, the sampler of ``MLEFit.simulate``).
    ``trials`` (n,) or (R, n): binomial trials of the rows, so a draw is a proportion of successes out of them."""
    w, mu, sd = _fitted_components(spec, p, X)
    m = None if trials is None else np.broadcast_to(np.asarray(trials, dtype=float), w.shape[:2])
    return np.stack([sample_mixture(spec.response, w[r], mu[r], sd[r], B, np.random.default_rng(seeds[r]),
                                    None if m is None else m[r])
                     for r in range(w.shape[0])])


def split_start(spec_small: MoE, p: Params, X: np.ndarray, k_new: int, *, shift: float = 0.5) -> Params:
    r"""Embed a k-expert fit in ``k_new`` experts by splitting the heaviest expert repeatedly.

    For softmax gates the two halves get gate intercepts :math:`\beta_0 - \log 2`, which leaves the
    density unchanged; their expert intercepts are moved by :math:`\pm` ``shift`` :math:`\sigma` so the
    optimiser can separate them.  Batched params (R, ...) with X (R, n, d).
    """
    pb = p.numpy().batched()
    w, _, _ = _fitted_components(spec_small, pb, X)
    blocks = {name: np.array(a) for name, a in pb.blocks()}
    glm = "noise_sd" not in blocks  # GLM experts: split on the linear predictor's scale (a unit "sd")
    if glm:
        blocks["noise_sd"] = np.ones_like(blocks["gate_bias"])
    weights = w.mean(1)  # (R, k)
    R = weights.shape[0]
    rows = np.arange(R)
    for _ in range(k_new - p.k):
        j = weights.argmax(1)
        gb = blocks["gate_bias"][rows, j] - np.log(2.0)
        blocks["gate_bias"][rows, j] = gb
        sd = blocks["noise_sd"][rows, j]
        new_eb = blocks["expert_bias"][rows, j] - shift * sd
        blocks["expert_bias"][rows, j] += shift * sd
        blocks["gate_bias"] = np.concatenate([blocks["gate_bias"], gb[:, None]], 1)
        blocks["gate_weight"] = np.concatenate([blocks["gate_weight"], blocks["gate_weight"][rows, j][:, None]], 1)
        blocks["expert_weight"] = np.concatenate([blocks["expert_weight"],
                                                  blocks["expert_weight"][rows, j][:, None]], 1)
        blocks["expert_bias"] = np.concatenate([blocks["expert_bias"], new_eb[:, None]], 1)
        blocks["noise_sd"] = np.concatenate([blocks["noise_sd"], sd[:, None]], 1)
        weights[rows, j] /= 2
        weights = np.concatenate([weights, weights[rows, j][:, None]], 1)
    if glm:
        del blocks["noise_sd"]
    out = Params(**blocks)
    return out if p.is_batched else out.select(0)


# ----------------------------------------------------------------------------------------- bootstrap
@dataclass
class BootstrapResult(Result):
    """Aligned bootstrap draws of :math:`\\hat\\theta` (see :func:`bootstrap`); a :class:`moestat.report.Result`.

    Attributes
    ----------
    estimate : ndarray (P,)
        The original estimate.
    draws : ndarray (B, P)
        Aligned bootstrap estimates; rows of failed replicates are NaN.
    failed : ndarray of bool (B,)
        Refits that did not converge or gave a non-finite log-likelihood (excluded, not redrawn).
    names : list of str
    kind : str
    config : dict
    """

    estimate: np.ndarray
    draws: np.ndarray
    failed: np.ndarray
    names: list
    kind: str
    config: dict = field(default_factory=dict)

    @property
    def n_failed(self) -> int:
        return int(self.failed.sum())

    @property
    def ok(self) -> np.ndarray:
        return self.draws[~self.failed]

    def se(self) -> np.ndarray:
        """Bootstrap standard errors (sd of the successful draws, ddof=1)."""
        return self.ok.std(axis=0, ddof=1)

    def cov(self) -> np.ndarray:
        return np.cov(self.ok, rowvar=False)

    def conf_int(self, alpha: float = 0.05, method: str = "percentile") -> np.ndarray:
        """(P, 2) intervals: ``"percentile"``, ``"basic"`` (2θ̂ − quantiles) or ``"normal"`` (θ̂ ± z·se)."""
        check_choice("method", method, ("percentile", "basic", "normal"))
        if method == "normal":
            z = stats.norm.ppf(1 - alpha / 2)
            se = self.se()
            return np.stack([self.estimate - z * se, self.estimate + z * se], -1)
        lo, hi = np.quantile(self.ok, [alpha / 2, 1 - alpha / 2], axis=0)
        if method == "basic":
            return np.stack([2 * self.estimate - hi, 2 * self.estimate - lo], -1)
        return np.stack([lo, hi], -1)

    def to_frame(self, alpha: float = 0.05, method: str = "percentile") -> pd.DataFrame:
        """One row per term: estimate, bootstrap SE, interval, successes and failures, settings."""
        ci = self.conf_int(alpha, method)
        frame = pd.DataFrame({"term": self.names, "estimate": self.estimate, "boot_se": self.se(),
                              "conf_low": ci[:, 0], "conf_high": ci[:, 1], "ci_method": method,
                              "n_ok": int((~self.failed).sum()), "n_failed": self.n_failed, "kind": self.kind})
        for key, value in self.config.items():
            if np.isscalar(value) or value is None:
                frame[key] = value
        return frame

    def tidy(self, confidence_level: float = 0.95, method: str = "percentile") -> pd.DataFrame:
        """One row per term: ``term, estimate, std_error`` (bootstrap sd) ``, conf_low, conf_high``."""
        ci = self.conf_int(1 - confidence_level, method)
        return pd.DataFrame({"term": self.names, "estimate": self.estimate, "std_error": self.se(),
                             "conf_low": ci[:, 0], "conf_high": ci[:, 1]})

    def glance(self) -> pd.DataFrame:
        """One row: the kind of bootstrap, draws asked for, succeeded and failed, and the settings."""
        row = {"kind": self.kind, "n_resamples": len(self.failed), "n_ok": int((~self.failed).sum()),
               "n_failed": self.n_failed}
        row.update({k: v for k, v in self.config.items() if (np.isscalar(v) or v is None) and k not in row})
        return pd.DataFrame([row])

    def __repr__(self) -> str:
        return (f"BootstrapResult(kind={self.kind!r}, B={len(self.failed)}, n_failed={self.n_failed}, "
                f"P={len(self.names)})")


def _align(spec: MoE, fit: MLEFit, boot: MLEFit) -> np.ndarray:
    """Permute each bootstrap fit's experts to the original's labels; return aligned theta (B, P)."""
    ref = fit.params.numpy()
    bp = boot.params.numpy().batched()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingularInformationWarning)
        se = np.asarray(fit.bse())
    lay = fit.layout

    def atoms(p_ew: np.ndarray, p_eb: np.ndarray, p_sd: np.ndarray) -> np.ndarray:
        parts = [p_eb[..., None]]
        if lay.expert_slopes:
            parts.append(p_ew[..., list(lay.expert_columns)])
        if lay.dispersion:
            parts.append(np.log(p_sd)[..., None])
        return np.concatenate(parts, -1)

    a0 = atoms(ref.expert_weight, ref.expert_bias, ref.noise_sd)  # (k, c)
    ab = atoms(bp.expert_weight, bp.expert_bias, bp.noise_sd)  # (B, k, c)
    coef_se = se[lay.n_gate:lay.n_gate + lay.n_expert].reshape(spec.k, lay.pe)  # (const, x1..xd) per expert
    sig_se = se[lay.n_gate + lay.n_expert + lay.n_shared:][:, None]  # after the shared terms (if any)
    scale = np.concatenate([coef_se, sig_se], -1) if lay.dispersion else coef_se
    scale = scale if np.isfinite(scale).all() else np.ones_like(a0)
    scale = np.maximum(scale, 1e-8)
    perms = optimal_assignment((((ab[:, None, :, :] - a0[None, :, None, :]) / scale[None, :, None, :]) ** 2)
                               .sum(-1))  # (B, orig, boot)
    aligned = bp.permute(perms)
    return to_numpy(lay.pack(_blocks_from_params(aligned)))


def _blocks_from_params(p: Params):
    from .fit._layout import BlockParams

    if p.noise_sd is None:  # GLM experts: the layout carries no noise sd
        p = Params(p.gate_bias, p.gate_weight, p.expert_weight, p.expert_bias, noise_sd=np.ones(np.shape(p.gate_bias)))
    return BlockParams.from_params(p.to_torch("cpu", torch.float64))


#: The options of :func:`moestat.fit_mle` that the inference functions pass on through their ``**fit_kwargs``.
_FIT_MLE_OPTIONS = tuple(p for p in inspect.signature(fit_mle).parameters if p not in ("spec", "X", "y"))


def _check_fit_kwargs(caller: Callable[..., Any], fit_kwargs: dict[str, Any]) -> None:
    """Extra keywords of ``caller`` go to :func:`moestat.fit_mle`: one that neither takes raises a TypeError naming
    ``caller`` and the closest names of both (not fit_mle's bare 'unexpected keyword' from inside the first fit)."""
    own = [p for p in inspect.signature(caller).parameters if p != "fit_kwargs"]
    fit = list(_FIT_MLE_OPTIONS)
    for name in fit_kwargs:
        if name in fit:
            continue
        close = difflib.get_close_matches(name, list(dict.fromkeys(own + fit)), n=3, cutoff=0.6)
        if "n_resamples" in own and ("boot" in name.lower() or "resample" in name.lower()):
            close = ["n_resamples", *[c for c in close if c != "n_resamples"]]
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise TypeError(f"{caller.__name__}() got an unexpected keyword argument {name!r}: its extra keywords go to "
                        f"fit_mle, which has no such option either.{hint}")


@renamed_arguments(B="n_resamples")
@validate_arguments(n_resamples=Integer(1), kind=Choice("parametric", "nonparametric"), restarts=Integer(1),
                    seed=Seed(), progress=Optional(Boolean()))
def bootstrap(fit: MLEFit, X=None, y=None, n_resamples: int = 200, *, kind: str = "parametric", restarts: int = 2,
              seed=None, progress: bool | None = None, trials=None, **fit_kwargs) -> BootstrapResult:
    r"""Bootstrap distribution of :math:`\hat\theta` with label alignment (module docstring).

    Parameters
    ----------
    fit : MLEFit
        A fit to one data set (``X`` of shape (n, d)).
    X, y : optional
        The data the fit was computed on (default: the fit's own data; a formula fit's inputs are the union of its
        expert and gate covariates).  Case weights travel with their rows: a nonparametric resample of a weighted
        fit draws multinomial counts of the :math:`\sum_t c_t` observations (the bootstrap of the data with each row
        repeated :math:`c_t` times); a parametric one keeps the weights.  Binomial trials :math:`m_t` (a fit with
        ``trials=``) also stay with their rows: a nonparametric resample draws the triples
        :math:`(x_t, y_t, m_t)` together, and a parametric one draws :math:`y^*_t = \mathrm{Bin}(m_t,
        \hat\mu_{tz})/m_t` with the observed :math:`m_t` (the sampler of ``MLEFit.simulate``).
    n_resamples : int
        Number of bootstrap replicates B (all refitted in one batched call; formerly ``B=``).
    kind : {"parametric", "nonparametric"}
    restarts : int
        Random starts per refit, in addition to the warm start at :math:`\hat\theta`.
    trials : array (n,), optional
        The binomial trials of the rows of ``X`` (default: the fit's own); only for a fit made with ``trials=``.
    seed : int or SeedSequence
        Replicate b draws from ``SeedSequence(seed).spawn(B)[b]``.
    progress : bool or None
        A tqdm bar over the stages (draw the resamples, refit them, align the labels): the B refits are one
        batched fit, so the bar advances per stage, not per resample.  ``None`` (default) shows it in interactive
        sessions or when the refits are expected to take more than :data:`PROGRESS_AFTER_S` seconds; ``False``
        never.
    **fit_kwargs
        Passed to :func:`moestat.fit_mle` (default: the original fit's method, tol, max_iter, sd_floor).

    Returns
    -------
    BootstrapResult
    """
    if not isinstance(fit, MLEFit):
        raise TypeError(f"fit must be an MLEFit, got {type(fit).__name__}.")
    if not fit.single:
        raise ValueError("bootstrap needs a fit to a single data set; select one replicate's data and refit.")
    check_choice("kind", kind, ("parametric", "nonparametric"))
    _check_fit_kwargs(bootstrap, fit_kwargs)
    B = check_int("n_resamples", n_resamples, minimum=2)
    spec = fit.spec
    if X is None and y is None:
        X, y = to_numpy(fit._X[0]), to_numpy(fit._y[0])
    m0 = _bootstrap_trials(fit, trials)
    Xn, yn, single = _check_data(spec, X, y, layout=fit.layout, trials=m0)
    n = int(fit._X.shape[1])
    if not single or Xn.shape[1] != n:
        raise ValueError(f"X must be the (n, d) data of the fit (n={n}), got shape {np.shape(X)}.")
    w0 = to_numpy(fit._w[0]) if fit.weighted else None
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    draw_seeds, fit_seed = ss.spawn(2)
    seeds = draw_seeds.spawn(B)
    bar = _Stages("bootstrap", [f"draw {B} {kind} resamples", f"refit {B} resamples (one batched fit)",
                                "align expert labels"], progress,
                  expected_s=_expected_seconds(B, restarts + 1, n, spec.k, spec.d))
    with bar:
        Xb, yb, wb, mb = _resamples(fit, Xn, yn, B, kind, w0, draw_seeds, seeds, m0)
        bar.step()
        opts = {"method": fit.settings["method"], "tol": fit.settings["tol"], "max_iter": fit.settings["max_iter"],
                "sd_floor": fit.settings["sd_floor"], "device": fit.settings["device"],
                "gate_columns": fit.layout.gate_columns, "expert_columns": fit.layout.expert_columns,
                "shared_columns": fit.layout.shared_columns or None, "offset_column": fit.layout.offset_column}
        if fit.settings.get("learn_temperature"):
            opts["learn_temperature"] = True
        if fit.settings.get("em_kernel") == "native":  # the refits run the EM loop the fit ran
            opts["compile"] = True
        opts.update(fit_kwargs)
        failed_data = np.zeros(B, dtype=bool)
        if kind == "nonparametric":  # a resample can be degenerate (e.g. too few distinct x); report it as failed
            for b in range(B):
                try:
                    _check_data(spec, Xb[b], yb[b], layout=fit.layout, trials=None if mb is None else mb[b])
                except ValueError:
                    failed_data[b] = True
            keep = ~failed_data
            Xb, yb = Xb[keep], yb[keep]
            wb = None if wb is None else wb[keep]
            mb = None if mb is None else mb[keep]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MLEConvergenceWarning)
            warnings.simplefilter("ignore", DegenerateFitWarning)
            bfit = fit_mle(spec, Xb, yb, init=fit.params, restarts=restarts, seed=fit_seed, weights=wb, trials=mb,
                           feature_names=fit.layout.feature_names, **{"progress": False, **opts})
        bar.step()
        _warn_degenerate_refits(bfit, "bootstrap refits")
        th = _align(spec, fit, bfit)
        bar.step()
    ok = np.asarray(bfit._converged) & np.isfinite(bfit._loglik) & np.isfinite(th).all(-1)
    draws = np.full((B, fit.layout.size), np.nan)
    failed = np.ones(B, dtype=bool)
    pos = np.flatnonzero(~failed_data)
    draws[pos[ok]] = th[ok]
    failed[pos[ok]] = False
    if failed.any():
        warn_user(f"{int(failed.sum())} of {B} bootstrap refits failed (non-converged, non-finite or degenerate "
                      "resample); they are excluded from the bootstrap summaries and not redrawn.",
                      MLEConvergenceWarning)
    config = {"n_resamples": B, "restarts": restarts, "seed_entropy": ss.entropy, "trials": m0 is not None,
              **{key: v for key, v in opts.items()
                 if key not in ("gate_columns", "expert_columns", "shared_columns", "offset_column")}}
    return BootstrapResult(np.asarray(fit.theta), draws, failed, fit.param_names, kind, config)


def _bootstrap_trials(fit: MLEFit, trials: Any) -> np.ndarray | None:
    """The binomial trials (n,) of a bootstrap: ``trials`` if given (a fit with trials only), else the fit's."""
    if trials is None:
        return None if fit._m is None else to_numpy(fit._m[0])
    if fit._m is None:
        raise TypeError(f"trials= is for fits with binomial trials; this fit has none (fit_mle(..., family='binomial', "
                        f"trials=m) makes one), got trials of shape {np.shape(trials)}. Drop trials=.")
    m = np.asarray(as_numeric("trials", trials), dtype=float)
    n = int(fit._X.shape[1])
    if m.shape != (n,):
        raise ValueError(f"trials has shape {m.shape} but the fit has n={n} rows; pass one number of trials per row.")
    return m


def _resamples(fit: MLEFit, Xn: np.ndarray, yn: np.ndarray, B: int, kind: str, w0: np.ndarray | None,
               draw_seeds: np.random.SeedSequence, seeds: list, m0: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The B bootstrap data sets ``(X, y, case weights or None, binomial trials or None)`` of :func:`bootstrap`;
    each row keeps its trials ``m0`` (n,)."""
    n = Xn.shape[1]
    wb = None if w0 is None else np.broadcast_to(w0, (B, n)).copy()
    mb = None if m0 is None else np.broadcast_to(m0, (B, n)).copy()
    if kind == "parametric":
        Xb = np.broadcast_to(Xn[0], (B, *Xn.shape[1:])).copy()
        yb = _draw(fit.spec, fit.params.batched(), Xn, B, [draw_seeds], m0)[0]
    elif w0 is None:
        idx = np.stack([np.random.default_rng(s).integers(0, n, n) for s in seeds])
        Xb, yb = Xn[0][idx], yn[0][idx]
        mb = None if m0 is None else m0[idx]
    else:
        total = max(int(np.rint(w0.sum())), 1)
        wb = np.stack([np.random.default_rng(s).multinomial(total, w0 / w0.sum()) for s in seeds]).astype(float)
        Xb, yb = np.broadcast_to(Xn[0], (B, *Xn.shape[1:])).copy(), np.broadcast_to(yn[0], (B, n)).copy()
    return Xb, yb, wb, mb


# ---------------------------------------------------------------------------------------- LRT for k
@dataclass
class LRTResult(Result):
    """Bootstrap likelihood-ratio test of k0 vs k1 experts (arrays over replicates if X was batched); a
    :class:`moestat.report.Result` (:meth:`tidy`: statistic and p-value per data set; :meth:`glance`: with the
    bootstrap's bookkeeping and settings)."""

    statistic: np.ndarray | float
    p_value: np.ndarray | float
    null_distribution: np.ndarray
    n_failed: np.ndarray | int
    k0: int
    k1: int
    fit0: MLEFit
    fit1: MLEFit
    config: dict = field(default_factory=dict)
    n_not_converged: np.ndarray | int = 0

    def to_frame(self) -> pd.DataFrame:
        """One row per data set: statistic, p-value, B used, failures, settings."""
        stat = np.atleast_1d(self.statistic)
        null = self.null_distribution.reshape(len(stat), -1)
        frame = pd.DataFrame({"rep": np.arange(len(stat)), "k0": self.k0, "k1": self.k1, "statistic": stat,
                              "p_value": np.atleast_1d(self.p_value), "B_ok": np.isfinite(null).sum(1),
                              "n_failed": np.atleast_1d(self.n_failed),
                              "n_not_converged": np.atleast_1d(self.n_not_converged)})
        for key, value in self.config.items():
            if np.isscalar(value) or value is None:
                frame[key] = value
        return frame

    def tidy(self) -> pd.DataFrame:
        """One row per data set: ``rep, term`` (``"k{k0} vs k{k1}"``) ``, statistic, p_value``."""
        stat = np.atleast_1d(self.statistic)
        return pd.DataFrame({"rep": np.arange(len(stat)), "term": f"k{self.k0} vs k{self.k1}", "statistic": stat,
                             "p_value": np.atleast_1d(self.p_value)})

    def glance(self) -> pd.DataFrame:
        """One row per data set: statistic, p-value, draws used, failures and the settings (:meth:`to_frame`)."""
        return self.to_frame()

    def __repr__(self) -> str:
        return (f"LRTResult(k0={self.k0}, k1={self.k1}, statistic={np.round(self.statistic, 4)}, "
                f"p_value={np.round(self.p_value, 4)}, n_failed={self.n_failed})")


def _resolve_data(X, y, *, formula: str | None, data, gate_formula: str | None, weights, fit_kwargs: dict[str, Any],
                  shared: str | None = None, trials: Any = None) -> tuple[np.ndarray, np.ndarray, dict[str, Any], Any]:
    """Arrays, fit options and the formula design (None for arrays) from either interface: ``(X, y)`` or a formula
    on ``data`` (its union design, column restrictions, shared columns, names, case weights and binomial trials
    become :func:`moestat.fit_mle` options)."""
    kw = dict(fit_kwargs)
    offset = kw.pop("offset", None)
    if formula is None:
        _check_no_offset(offset)
        for name, value in (("data", data), ("gate_formula", gate_formula), ("shared", shared)):
            if value is not None:
                hint = " (with arrays, shared_columns=[...] names the shared columns of X)" if name == "shared" else ""
                raise TypeError(f"{name}= needs formula=; with arrays pass X and y{hint}.")
        if isinstance(trials, str):
            raise TypeError(f"trials={trials!r} names a column, which needs formula= and data=; with arrays pass the "
                            "numbers of trials as an array.")
        if X is None or y is None:
            raise TypeError("pass the data as X and y, or as formula= and data=.")
        if isinstance(X, pd.DataFrame) and "feature_names" not in kw:
            kw["feature_names"] = [str(c) for c in X.columns]
        if weights is not None:
            kw["weights"] = weights
        if trials is not None:
            kw["trials"] = np.asarray(as_numeric("trials", trials), dtype=float)
        return (np.asarray(as_numeric("X", X), dtype=float).copy(), np.asarray(as_numeric("y", y), dtype=float).copy(),
                kw, None)
    if X is not None or y is not None:
        raise TypeError("pass either formula= and data= or arrays X and y, not both.")
    if data is None:
        raise TypeError("formula= needs data=, the frame its columns come from.")
    for name in ("gate_columns", "expert_columns", "shared_columns", "offset_column"):
        if kw.get(name) is not None:
            raise TypeError(f"{name}= is for arrays; a formula fit sets the columns with gate_formula=, shared= and "
                            "offset=.")
    inputs = formula_inputs(formula, data, gate_formula=gate_formula, weights=weights,
                            missing=kw.pop("missing", "raise"), shared=shared, trials=trials, offset=offset)
    kw.update(feature_names=inputs.names, gate_columns=inputs.gate_columns, expert_columns=inputs.expert_columns,
              shared_columns=inputs.shared_columns or None, offset_column=inputs.offset_column)
    if inputs.weights is not None:
        kw["weights"] = inputs.weights
    if inputs.trials is not None:
        kw["trials"] = inputs.trials
    return inputs.X, inputs.y, kw, inputs.design


def _keep_design(fit: MLEFit, design: Any) -> MLEFit:
    """A fit of a formula's arrays, given the formula's design back: frames are then read by name and the summary
    names the response."""
    if design is not None:
        fit.design, fit.response_name = design, design.response_name
    return fit


def _warn_degenerate_refits(batch: MLEFit, what: str) -> None:
    """One warning for a batch of refits whose per-fit degeneracy warnings were held back: how many degenerated and
    of which kinds (they are kept, not redrawn)."""
    found = batch.degeneracy()
    if found.empty:
        return
    kinds = ", ".join(sorted(set(found["kind"].str.replace("_", " "))))
    warn_user(f"{found['rep'].nunique()} of {batch.n_reps} {what} degenerated ({kinds}); they are kept, not "
              "redrawn. A large share means the fitted model sits near a degenerate maximum (see fit.degeneracy()).",
              DegenerateFitWarning)


def _fit_pair(spec0: MoE, spec1: MoE, X: np.ndarray, y: np.ndarray, *, init0, restarts: int, seed,
              opts: dict, step: Callable[[], None] = lambda: None) -> tuple[MLEFit, MLEFit]:
    """The k0 fit, then the k1 fit started from it split (:func:`split_start`); ``step`` is called after each.

    The k1 fit also starts at the exact embedding of the k0 fit (``shift=0``: the same density, so the same
    log-likelihood), a point of the k1 model that EM and L-BFGS keep.  The k1 fit's log-likelihood is then never
    below the k0 fit's, as the k1 maximum is not: the statistic cannot come out negative because a split start
    stopped short of the k0 value on a flat likelihood (an over-fitted k1 on k0 data)."""
    s0, s1 = seed.spawn(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MLEConvergenceWarning)
        warnings.simplefilter("ignore", DegenerateFitWarning)
        f0 = fit_mle(spec0, X, y, init=init0, restarts=restarts, seed=s0, **{"progress": False, **opts})
        step()
        start1 = split_start(spec0, f0.params.batched(), X, spec1.k)
        embedded = split_start(spec0, f0.params.batched(), X, spec1.k, shift=0.0)
        f1 = fit_mle(spec1, X, y, init=[start1, embedded], restarts=restarts, seed=s1, **{"progress": False, **opts})
        step()
    return f0, f1


def _repeat_rows(opts: dict[str, Any], B: int) -> dict[str, Any]:
    """Fit options for the R x B null resamples (replicate r's B resamples are rows r*B .. r*B + B - 1): per-row
    arrays given per replicate, (R, n) case weights and binomial trials, are repeated B times so every resample keeps
    its data set's rows' weights and trials; the column layout (``shared_columns`` and the rest) is kept as is."""
    out = dict(opts)
    for key in ("weights", "trials"):
        value = out.get(key)
        if value is not None and np.ndim(value) == 2:
            out[key] = np.repeat(np.asarray(value, dtype=float), B, axis=0)
    return out


def _lrt_fits(spec0: MoE, spec1: MoE, Xn: np.ndarray, yn: np.ndarray, B: int, restarts: int,
              s_data: np.random.SeedSequence, s_draw: np.random.SeedSequence, s_boot: np.random.SeedSequence,
              opts: dict, bar: _Stages) -> tuple[MLEFit, MLEFit, np.ndarray, tuple[MLEFit, MLEFit]]:
    """The k0 and k1 fits to the data, the statistic, and the fits to the R x B null resamples."""
    k0, k1 = spec0.k, spec1.k
    R, n, _ = Xn.shape
    f0, f1 = _fit_pair(spec0, spec1, Xn, yn, init0="random", restarts=restarts, seed=s_data, opts=opts,
                       step=bar.step)
    for kk, f in ((k0, f0), (k1, f1)):
        found = f.degeneracy()
        if not found.empty:
            kinds = ", ".join(sorted(set(found["kind"].str.replace("_", " "))))
            warn_user(f"the k={kk} fit to the data is degenerate ({kinds}; fit{0 if kk == k0 else 1}.degeneracy() "
                      "lists it): the likelihood-ratio statistic compares a degenerate maximum and its p-value is not "
                      "trustworthy; raise sd_floor, drop k, or use a family that fits the data.", DegenerateFitWarning)
    lr = 2 * (np.asarray(f1._loglik) - np.asarray(f0._loglik))
    ystar = _draw(spec0, f0.params.batched(), Xn, B, s_draw.spawn(R), opts.get("trials"))  # (R, B, n)
    Xs = np.repeat(Xn, B, axis=0)
    ys = ystar.reshape(R * B, n)
    p0 = f0.params.batched().numpy()
    init0 = Params(**{name: np.repeat(a, B, axis=0) for name, a in p0.blocks()})
    g0, g1 = _fit_pair(spec0, spec1, Xs, ys, init0=init0, restarts=restarts, seed=s_boot,
                       opts=_repeat_rows(opts, B), step=bar.step)
    _warn_degenerate_refits(g1, f"k={k1} refits to the null resamples")
    return f0, f1, lr, (g0, g1)


def _checked_inputs(spec: MoE, X: np.ndarray, y: np.ndarray, fit_kwargs: dict[str, Any]
                    ) -> tuple[np.ndarray, np.ndarray, bool, np.ndarray | None]:
    """``(X, y, single, trials)`` of :func:`test_n_experts`, checked with the fit's column layout (so shared columns
    count once among the free parameters) and its binomial trials, which come back as an (R, n) array or None."""
    layout = ParamLayout(spec, fit_kwargs.get("feature_names"), gate_columns=fit_kwargs.get("gate_columns"),
                         expert_columns=fit_kwargs.get("expert_columns"),
                         shared_columns=fit_kwargs.get("shared_columns"), offset_column=fit_kwargs.get("offset_column"))
    m = _check_trials(fit_kwargs.get("trials"), spec, X)
    Xn, yn, single = _check_data(spec, X, y, layout=layout, trials=m)
    if m is not None:
        m = np.array(np.broadcast_to(m, yn.shape), dtype=float)
    return Xn, yn, single, m


@renamed_arguments(B="n_resamples")
@validate_arguments(k0=Integer(1), k1=Integer(2), n_resamples=Integer(1), restarts=Integer(1), seed=Seed(),
                    progress=Optional(Boolean()))
def test_n_experts(X=None, y=None, k0: int = 1, k1: int = 2, n_resamples: int = 99, *, formula: str | None = None,
                   data=None, gate_formula: str | None = None, weights=None, shared: str | None = None, trials=None,
                   gate: str = "softmax", expert: str = "linear", method: str = "em", restarts: int = 3, seed=None,
                   progress: bool | None = None, **fit_kwargs) -> LRTResult:
    r"""Parametric bootstrap LRT of :math:`H_0: k = k_0` against :math:`k = k_1` (module docstring).

    Parameters
    ----------
    X : array (n, d) or (R, n, d); y : array (n,) or (R, n)
        One data set, or R data sets tested at once (all R x B refits are batched).
    formula, data, gate_formula, weights
        Or the data as a formula fit (:func:`moestat.fit_mle`); case weights stay with their rows in the
        parametric bootstrap.
    shared : str, optional
        Formula interface: covariates with one coefficient common to every expert (``"~ z"``; with arrays pass
        ``shared_columns=[...]``), as in :func:`moestat.fit_mle`.  Both hypotheses keep the constraint: the
        :math:`k_0` and :math:`k_1` fits to the data and to every null resample share :math:`\gamma`, so the
        test compares :math:`k_0` against :math:`k_1` experts within the shared-coefficient model.
    trials : array (n,) or (R, n), or a column name with ``formula``, optional
        Binomial experts (``family="binomial"``): the rows' numbers of trials, ``y`` their proportions of
        successes.  The null resamples are drawn as :math:`\mathrm{Bin}(m_t, \hat\mu_{tz})/m_t` with the observed
        :math:`m_t`, which every refit keeps.
    k0, k1 : int
        Numbers of experts, ``k0 < k1``.
    n_resamples : int
        Bootstrap replicates B per data set (formerly ``B=``).
    gate, expert, method, restarts, **fit_kwargs
        Model and fitting options (:func:`moestat.fit_mle`).  Defaults here are ``tol=1e-6`` and
        ``max_iter=1000``: the statistic needs the maximised log-likelihoods, not precise parameters, and
        over-fitted k1 models converge slowly (EM is sublinear at singular points).  Refits with a
        non-finite statistic are failures (excluded, not redrawn); refits that hit ``max_iter`` are kept
        and counted in ``n_not_converged``.
    seed : int or SeedSequence
    progress : bool or None
        A tqdm bar over the four stages (fit k0, fit k1 to the data; refit k0, refit k1 to the R x B null
        resamples, each one batched fit).  ``None`` (default) shows it in interactive sessions, or once the time
        of the data fits, extrapolated to the bootstrap refits, predicts more than :data:`PROGRESS_AFTER_S`
        seconds; ``False`` never.

    Returns
    -------
    LRTResult
        ``statistic`` :math:`2(\hat\ell_{k_1}-\hat\ell_{k_0})`, ``p_value``, the simulated null distribution
        (R, B) with NaN for failed replicates, and their count.
    """
    k0, k1 = check_int("k0", k0), check_int("k1", k1)
    if k1 <= k0:
        raise ValueError(f"k1 must exceed k0, got k0={k0}, k1={k1}.")
    _check_fit_kwargs(test_n_experts, fit_kwargs)
    B = check_int("n_resamples", n_resamples, minimum=2)
    X, y, fit_kwargs, design = _resolve_data(X, y, formula=formula, data=data, gate_formula=gate_formula,
                                             weights=weights, fit_kwargs=fit_kwargs, shared=shared, trials=trials)
    d = X.shape[-1] if X.ndim >= 2 else 1
    spec0 = MoE(gate=gate, expert=expert, k=k0, d=d, response=fit_kwargs.pop("family", None) or "gaussian")
    spec1 = spec0.with_k(k1)
    Xn, yn, single, m = _checked_inputs(spec1, X, y, fit_kwargs)
    if m is not None:
        fit_kwargs["trials"] = m
    R, n, _ = Xn.shape
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    s_data, s_draw, s_boot = ss.spawn(3)
    opts = {"method": method, "tol": 1e-6, "max_iter": 1000, **fit_kwargs}
    # stage weights: a batched refit of R x B data sets from a warm start costs about as much as R x B / 4 fits
    # from random starts (a rough guide for when to show the bar, never a promise of the remaining time)
    resamples = f"{R * B} null resamples"
    with _Stages("test_n_experts", [f"fit k={k0} to the data", f"fit k={k1} to the data",
                                    f"refit k={k0} to {resamples}", f"refit k={k1} to {resamples}"], progress,
                 weights=[1.0, 1.0, max(R * B / 4, 1.0), max(R * B / 4, 1.0)]) as bar:
        f0, f1, lr, null_fits = _lrt_fits(spec0, spec1, Xn, yn, B, restarts, s_data, s_draw, s_boot, opts, bar)
    g0, g1 = null_fits
    lr_star = 2 * (np.asarray(g1._loglik) - np.asarray(g0._loglik))
    ok = np.isfinite(lr_star)
    not_conv = (~(np.asarray(g0._converged) & np.asarray(g1._converged))).reshape(R, B).sum(1)
    null = np.where(ok, lr_star, np.nan).reshape(R, B)
    n_ok = np.isfinite(null).sum(1)
    exceed = np.nansum(null >= lr[:, None], axis=1)
    pval = (1 + exceed) / (n_ok + 1)
    n_failed = B - n_ok
    if n_failed.sum():
        warn_user(f"{int(n_failed.sum())} of {R * B} bootstrap refits failed; they are excluded (not redrawn) "
                      "and the p-value uses the remaining ones.", MLEConvergenceWarning)

    def out(a):
        return a[0].item() if single else a

    config = {"n_resamples": B, "gate": gate, "expert": expert, "restarts": restarts, "seed_entropy": ss.entropy,
              "n": n, "shared": ", ".join(f0.layout.feature_names[j] for j in f0.layout.shared_columns) or None,
              "trials": m is not None, **{key: v for key, v in opts.items() if np.isscalar(v)}}
    return LRTResult(out(lr), out(pval), null[0] if single else null, out(n_failed), k0, k1, _keep_design(f0, design),
                     _keep_design(f1, design), config,
                     out(not_conv))


test_n_experts.__test__ = False  # not a pytest test despite its name


# ------------------------------------------------------------------------------------------ select k
@dataclass
class SelectKResult(Result):
    """Information criteria over k (see :func:`select_k`); a :class:`moestat.report.Result`."""

    table: pd.DataFrame
    best_k: int
    criterion: str
    fits: dict

    def to_frame(self) -> pd.DataFrame:
        return self.table

    def tidy(self) -> pd.DataFrame:
        """One row per k: the criteria (``table``)."""
        return self.table.copy()

    def glance(self) -> pd.DataFrame:
        """One row: the criterion and the k it selects."""
        return pd.DataFrame([{"criterion": self.criterion, "best_k": self.best_k}])

    def __repr__(self) -> str:
        """The choice and the whole comparison: every k's criteria and degeneracy flags, never cut to the width of a
        console (the settings columns, the same in every row, are in :attr:`table`)."""
        shown = [c for c in self.table.columns if c not in ("criterion", "gate", "expert", "method")]
        return (f"SelectKResult(criterion={self.criterion!r}, best_k={self.best_k})\n"
                + self.table[shown].to_string(index=False))


_SPURIOUS = {"vanishing_component", "sigma_at_floor", "collapsed_variance", "tied_responses"}


def _select_by_dsc(table: pd.DataFrame, fits: dict, X: np.ndarray, y: np.ndarray, *, gate: str, expert: str,
                   method: str) -> SelectKResult:
    """The dendrogram selection criterion (:mod:`moestat.dendrogram`): merge the atoms of the largest fit, read
    DSC at every level, choose the smallest DSC among the listed k >= 2.  The over-specified fit is degenerate by
    design (extra atoms vanish or duplicate), so no fit is skipped."""
    from .dendrogram import dsc, mixing_dendrogram

    K = int(table["k"].max())
    big = fits[K]
    tree = mixing_dendrogram(big.params, big.spec)
    levels = dsc(tree, X, y, big.spec).set_index("k")
    table = table.copy()
    table["dsc"] = table["k"].map(levels["dsc"])
    table["dsc_height"] = table["k"].map(levels["height"])
    usable = table[(table["k"] >= 2) & np.isfinite(table["dsc"])]
    best = int(usable.loc[usable["dsc"].idxmin(), "k"])
    table["best"] = table["k"] == best
    table["criterion"], table["gate"], table["expert"], table["method"] = "dsc", gate, expert, method
    return SelectKResult(table, best, "dsc", fits)


def _fit_one_k(spec: MoE, X: np.ndarray, y: np.ndarray, *, method: str, restarts: int,
               seed: np.random.SeedSequence, fit_kwargs: dict) -> MLEFit:
    """One fit of :func:`select_k` (its degeneracy is reported in the table, not warned per fit)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateFitWarning)
        return fit_mle(spec, X, y, method=method, restarts=restarts, seed=seed, **{"progress": False, **fit_kwargs})


@validate_arguments(criterion=Choice("bic", "icl", "aic", "dsc"), restarts=Integer(1), seed=Seed(),
                    progress=Optional(Boolean()))
def select_k(X=None, y=None, ks: Sequence[int] = (1, 2, 3, 4), *, formula: str | None = None, data=None,
             gate_formula: str | None = None, weights=None, shared: str | None = None, trials=None,
             criterion: str = "bic", gate: str = "softmax",
             expert: str = "linear", method: str = "em", restarts: int = 5, seed=None, progress: bool | None = None,
             **fit_kwargs) -> SelectKResult:
    r"""Fit each k in ``ks`` and choose the one minimising ``criterion`` (``"bic"``, ``"icl"``, ``"aic"`` or
    ``"dsc"``: the dendrogram selection criterion of the largest fit's mixing measure, :mod:`moestat.dendrogram`,
    chosen among k >= 2).

    Returns a :class:`SelectKResult` whose ``table`` has one row per k with loglik, df, AIC, BIC, ICL,
    convergence, the number of small experts (mean weight < 0.05), of experts whose sigma sits at the
    variance floor, and ``degenerate`` (the kinds :meth:`moestat.MLEFit.degeneracy` found, empty when none);
    ``fits`` maps k to its :class:`moestat.MLEFit`.  **Fits at a spurious maximum are skipped** when choosing k
    (a vanishing component, a variance at the floor, collapsed, or collapsed onto tied responses; a
    :class:`moestat.DegenerateFitWarning` names them), unless every fit is; a separating (step-like) gate is only
    marked, since a sharp regime switch is a legitimate model.
    One data set: ``X`` of shape (n, d) and ``y``, or ``formula`` and ``data`` (with
    ``gate_formula`` and ``weights`` as in :func:`moestat.fit_mle`).

    ``shared`` (a formula, ``"~ z"``; with arrays ``shared_columns=[...]``) gives every fit the covariates whose
    coefficient :math:`\gamma` is common to all experts, so the table's ``df`` counts :math:`\gamma` once,
    :math:`(k-1)(p_g + 1) + k(p_e + 1) + q + k` for Gaussian experts with :math:`p_g` gate covariates, :math:`p_e`
    expert-specific and :math:`q` shared covariates (the last :math:`k`: the noise sds), and the criteria choose k
    within that model.  ``trials`` (an array, or a column name with ``formula``): binomial experts' numbers of
    trials per row, ``y`` their proportions of successes (:func:`moestat.fit_mle`).

    ``progress``: a tqdm bar advancing once per k (each k is one fit with all its restarts batched).  ``None``
    (default) shows it in interactive sessions, or once the fits so far, extrapolated to the remaining k (a fit's
    cost taken proportional to k), predict more than :data:`PROGRESS_AFTER_S` seconds; ``False`` never.
    """
    _check_fit_kwargs(select_k, fit_kwargs)
    check_choice("criterion", criterion, ("bic", "icl", "aic", "dsc"))
    ks = [check_int("ks", k) for k in ks]
    family = fit_kwargs.pop("family", None) or "gaussian"
    if criterion == "dsc" and (gate != "softmax" or expert != "linear" or family != "gaussian" or max(ks) < 3):
        raise ValueError("criterion='dsc' merges the atoms of the largest fit, a softmax-gated Gaussian MoE of linear "
                         f"experts, and needs max(ks) >= 3; got gate={gate!r}, expert={expert!r}, family={family!r}, "
                         f"ks={list(ks)}.")
    if not ks:
        raise ValueError("ks must list at least one number of experts.")
    Xa, y, fit_kwargs, design = _resolve_data(X, y, formula=formula, data=data, gate_formula=gate_formula,
                                              weights=weights, fit_kwargs=fit_kwargs, shared=shared, trials=trials)
    if Xa.ndim != 2:
        raise ValueError(f"select_k needs X of shape (n, d), got shape {Xa.shape}.")
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    fits, rows = {}, []
    with _Stages("select_k", [f"k={k}" for k in ks], progress, weights=[float(k) for k in ks]) as bar:
        for k, s in zip(ks, ss.spawn(len(ks)), strict=True):
            fits[k] = f = _keep_design(_fit_one_k(MoE(gate=gate, expert=expert, k=k, d=Xa.shape[1], response=family),
                                                  Xa, y, method=method, restarts=restarts, seed=s,
                                                  fit_kwargs=fit_kwargs), design)
            bar.step()
            g = f.glance().iloc[0]
            found = f.degeneracy()
            rows.append({"k": k, "loglik": g["loglik"], "df": g["df"], "aic": g["aic"], "bic": g["bic"],
                         "icl": g["icl"], "converged": g["converged"], "n_small": g["n_small"],
                         "n_at_floor": int(np.asarray(f.at_floor).sum()),
                         "degenerate": ", ".join(sorted(set(found["kind"]))) if not found.empty else ""})
    table = pd.DataFrame(rows)
    if criterion == "dsc":
        return _select_by_dsc(table, fits, Xa, y, gate=gate, expert=expert, method=method)
    # a step-like gate is marked but kept: a sharp regime switch is a legitimate model; the kinds that skip a fit are
    # those whose likelihood maximum is spurious (a component with no data or a variance chasing zero)
    skip = table["degenerate"].map(lambda kinds: bool(set(kinds.split(", ")) & _SPURIOUS))
    usable = table[~skip]
    if usable.empty:
        usable = table
        warn_user(f"every fit in ks={ks} is degenerate; the best {criterion} is reported but none is trustworthy "
                  "(see the 'degenerate' column).", DegenerateFitWarning)
    elif len(usable) < len(table):
        bad = table[skip]
        warn_user("select_k skipped degenerate fit(s): " + "; ".join(f"k={r.k} ({r.degenerate})"
                                                                     for r in bad.itertuples())
                  + f" (their fits[k].degeneracy() says which expert and why); the choice is among k in "
                  f"{usable['k'].tolist()}.", DegenerateFitWarning)
    marked = table[~skip & (table["degenerate"] != "")]
    if len(marked):
        warn_user("select_k kept fit(s) marked degenerate but not spurious: " + "; ".join(
            f"k={r.k} ({r.degenerate})" for r in marked.itertuples()) + " (see the 'degenerate' column).",
            DegenerateFitWarning)
    best = int(usable.loc[usable[criterion].idxmin(), "k"])
    table["best"] = table["k"] == best
    table["criterion"], table["gate"], table["expert"], table["method"] = criterion, gate, expert, method
    return SelectKResult(table, best, criterion, fits)
