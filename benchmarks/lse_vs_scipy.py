"""Converged least-squares fits per second: ``moestat.fit_lse`` against a loop of ``scipy.optimize.least_squares``.

What a user without moestat would write: a residual function of the MoE mean, its Jacobian, and
``scipy.optimize.least_squares(method="trf")`` run once per replicate and restart.  Both fitters get the same
data, the same starting values (moestat's k-means starts, or random starts with ``--init random``), the same
stopping rule and the same iteration cap:

* moestat: ``fit_lse(spec, X, y, init=starts, restarts=S, gtol=G, max_iter=M, condition=False)`` — one
  batched call over R replicates x S restarts (``optimizer="auto"``: trust-region Newton with the exact
  Hessian for these sizes); it stops a problem when the sup-norm of the gradient of
  :math:`L(\\theta) = \\frac1n\\sum_t r_t^2` is at most G.  The same call with ``compile=True`` (the same
  Newton method with each problem's whole run in C++) is timed beside it unless ``--no-compile``.
* scipy: ``least_squares(fun, x0, jac=..., method="trf", gtol=G n / 2, ftol=None, xtol=None, max_nfev=M)``:
  trf minimises :math:`\\frac12\\sum_t r_t^2` and stops on :math:`\\|J^\\top r\\|_\\infty \\le` gtol, which is the
  same test (:math:`\\nabla L = \\frac2n J^\\top r`); ftol and xtol are switched off so that no looser test
  ends it early.  ``--jac`` picks the Jacobian: ``analytic`` (hand-derived, numpy, the fastest baseline and the
  default), ``autograd`` (``torch.func.jacfwd`` of a torch residual) or ``2-point`` (scipy's finite
  differences).

Both ends are judged by one independent computation (numpy, this file): a fit is *converged* when the
sup-norm of :math:`\\nabla L` over the free coordinates at its end point is at most ``1.05 G`` (5% for the
round-off between two implementations of the same gradient).  Printed per cell (``cells``), then for the
smallest cell as R x S grows from 1 to 80 (``scaling``), and for scipy's three Jacobians on one small problem
(``jac``): converged fits per second for each fitter (converged restarts / wall time of all R x S fits), the
speed-up, and the objectives: how many restarts both fitters brought to the same minimum (relative difference
at most 1e-8), how many ended lower with each, and the best-of-restarts objective per replicate (the estimate a
user keeps), moestat against scipy.
Before timing, the script checks that its own objective equals moestat's at moestat's end points and that the
analytic Jacobian equals the autograd one.

The baseline implements linear experts only (the MoE of the table: softmax or sigmoid gate, k linear experts,
inputs N(0, I), responses from a fixed true MoE with noise sd 0.1).  Timings: one torch thread and one BLAS
thread; min and max over ``--repeat`` runs (runs alternate between the fitters).  Run::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=. python benchmarks/lse_vs_scipy.py --quick
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np
import torch
from scipy.optimize import least_squares

import moestat as ms
from moestat.fit.init import kmeans_init, random_init

GTOL_SLACK = 1.05  # converged: independent gradient sup-norm <= 1.05 gtol (round-off between implementations)
SAME_MIN = 1e-8  # two end points are the same minimum when their objectives agree to this relative tolerance
QUICK_CELLS = [(1, 2, 500), (4, 3, 2000), (8, 4, 5000)]
SCALING = [(1, 1), (2, 3), (5, 4), (20, 4)]  # (R, S) of the batch-size sweep at the smallest cell
SCALING_COLUMNS = ["gate", "fits", "moestat s (min-max)", "scipy s (min-max)", "converged moestat", "converged scipy",
                   "conv. fits/s moestat", "conv. fits/s scipy", "speed-up", "same minimum", "compile=True s (min-max)",
                   "converged compiled", "speed-up compiled"]
FULL_CELLS = [(1, 2, 500), (2, 2, 1000), (2, 3, 1000), (4, 3, 2000), (1, 4, 2000), (4, 4, 5000), (8, 4, 5000)]


def truth_params(gate: str, k: int, d: int, seed: int = 0) -> ms.Params:
    """A fixed true MoE: gate slopes N(0, 4), expert slopes N(0, 4), expert intercepts spread on [-2, 2].

    Softmax truths are put in the normalisation of the fits (last gate row zero)."""
    rng = np.random.default_rng(seed)
    p = ms.Params(gate_bias=rng.normal(size=k), gate_weight=2.0 * rng.normal(size=(k, d)),
                  expert_weight=2.0 * rng.normal(size=(k, d)), expert_bias=np.linspace(-2.0, 2.0, k))
    return p.normalize_softmax(-1) if gate == "softmax" else p


def md_table(rows: list[dict]) -> str:
    """Markdown table of a list of dicts (floats to 4 significant digits)."""
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return "\n".join(out)


def theta_rows(p: ms.Params) -> np.ndarray:
    """Batched Params (B, ...) -> (B, 2k, d+1): gate rows [b0, w], then expert rows [b, a]."""
    gb, gw, ew, eb = (np.asarray(a, dtype=np.float64) for a in (p.gate_bias, p.gate_weight, p.expert_weight,
                                                                  p.expert_bias))
    return np.concatenate([np.concatenate([gb[..., None], gw], -1), np.concatenate([eb[..., None], ew], -1)], -2)


class PlainMoE:
    r"""The least-squares problem of one data set, written the way a scipy user would (linear experts).

    :math:`Z = \tilde X\Theta^\top` (n, 2k); gate weights :math:`\pi = \mathrm{softmax}(Z_{gate})` or
    :math:`\sigma(Z_{gate})`; :math:`f = \sum_i \pi_i Z_{exp,i}`; residuals :math:`r = f - y`.  Jacobian rows
    :math:`u_t \otimes \tilde x_t` with :math:`u = \partial f/\partial Z`: :math:`\pi_i` for expert columns,
    :math:`\pi_i(1-\pi_i) h_i` (sigmoid) or :math:`\pi_i(h_i - f)` (softmax) for gate columns.  Softmax
    problems hold the last gate row at zero (the fits' normalisation); the free coordinates are the rest."""

    def __init__(self, gate: str, k: int, X: np.ndarray, y: np.ndarray) -> None:
        n, d = X.shape
        self.gate, self.k, self.n, self.p = gate, k, n, d + 1
        self.Xa = np.concatenate([np.ones((n, 1)), X], 1)
        self.y = np.asarray(y, dtype=np.float64)
        free = np.ones((2 * k, d + 1), dtype=bool)
        if gate == "softmax":
            free[k - 1] = False
        self.free = np.flatnonzero(free.ravel())
        self.base = np.zeros(2 * k * (d + 1))
        self.Xt, self.yt = torch.as_tensor(self.Xa), torch.as_tensor(self.y)
        self.free_t = torch.as_tensor(self.free)

    def theta(self, v: np.ndarray) -> np.ndarray:
        th = self.base.copy()
        th[self.free] = v
        return th.reshape(2 * self.k, self.p)

    def _forward(self, v: np.ndarray):
        Z = self.Xa @ self.theta(v).T
        zg, h = Z[:, : self.k], Z[:, self.k :]
        if self.gate == "softmax":
            e = np.exp(zg - zg.max(1, keepdims=True))
            pi = e / e.sum(1, keepdims=True)
        else:
            pi = 1.0 / (1.0 + np.exp(-zg))
        f = (pi * h).sum(1)
        return pi, h, f

    def residual(self, v: np.ndarray) -> np.ndarray:
        return self._forward(v)[2] - self.y

    def jac_analytic(self, v: np.ndarray) -> np.ndarray:
        pi, h, f = self._forward(v)
        ug = pi * (1.0 - pi) * h if self.gate == "sigmoid" else pi * (h - f[:, None])
        u = np.concatenate([ug, pi], 1)  # (n, 2k)
        return (u[:, :, None] * self.Xa[:, None, :]).reshape(self.n, -1)[:, self.free]

    def residual_torch(self, v: torch.Tensor) -> torch.Tensor:
        th = torch.zeros(2 * self.k * self.p, dtype=v.dtype).index_put((self.free_t,), v).reshape(2 * self.k, self.p)
        Z = self.Xt @ th.T
        zg, h = Z[:, : self.k], Z[:, self.k :]
        pi = torch.softmax(zg, 1) if self.gate == "softmax" else torch.sigmoid(zg)
        return (pi * h).sum(1) - self.yt

    def jacobian(self, kind: str):
        """The ``jac`` argument of ``least_squares`` for ``kind`` in {analytic, autograd, 2-point}."""
        if kind == "analytic":
            return self.jac_analytic
        if kind == "autograd":
            jf = torch.func.jacfwd(self.residual_torch)
            return lambda v: jf(torch.as_tensor(v)).numpy()
        return "2-point"

    def objective(self, v: np.ndarray) -> float:
        r = self.residual(v)
        return float(r @ r / self.n)

    def grad_norm(self, v: np.ndarray) -> float:
        """Sup-norm of the gradient of :math:`L = \\frac1n\\sum_t r_t^2` over the free coordinates."""
        return float(np.abs(2.0 / self.n * self.jac_analytic(v).T @ self.residual(v)).max())


def make_starts(spec: ms.MoE, X: np.ndarray, y: np.ndarray, S: int, init: str, seed: int) -> ms.Params:
    """R*S starting values (rows r*S + s), moestat's own generators."""
    if init == "kmeans":
        return kmeans_init(spec, X, y, S, seed=seed)
    return random_init(spec, y, S, seed=seed)


def run_moestat(spec, X, y, starts, S, gtol, max_iter, compile=False):
    t0 = time.perf_counter()
    fit = ms.fit_lse(spec, X, y, init=starts, restarts=S, gtol=gtol, max_iter=max_iter, condition=False,
                     compile=compile)
    return fit, time.perf_counter() - t0


def run_scipy(problems: list[PlainMoE], x0s: list[np.ndarray], jac: str, gtol: float, max_iter: int):
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflow in trf's trust-region solve of runaway starts
        t0 = time.perf_counter()
        for prob, x0 in zip(problems, x0s, strict=True):
            res = least_squares(prob.residual, x0, jac=prob.jacobian(jac), method="trf", gtol=gtol * prob.n / 2,
                                ftol=None, xtol=None, max_nfev=max_iter)
            out.append(res)
        elapsed = time.perf_counter() - t0
    return out, elapsed


def check_problem(prob: PlainMoE, v: np.ndarray) -> float:
    """Max relative difference between the analytic and the autograd Jacobian at ``v``."""
    Ja = prob.jac_analytic(v)
    Jt = prob.jacobian("autograd")(v)
    return float(np.abs(Ja - Jt).max() / max(1e-300, np.abs(Jt).max()))


def judge(problems: list[PlainMoE], fit: ms.LSEFit) -> tuple[np.ndarray, np.ndarray]:
    """Objectives and gradient sup-norms of moestat's end points by this file's own formulas; checks that the
    objectives equal the fit's."""
    th = theta_rows(fit.restart_params).reshape(len(problems), -1)
    obj = np.array([p.objective(th[i][p.free]) for i, p in enumerate(problems)])
    rel_obj_check = float(np.max(np.abs(obj - fit.restarts["objective"].to_numpy()) / obj))
    if rel_obj_check > 1e-9:
        raise AssertionError(f"moestat's objective differs from the plain one by {rel_obj_check:.2e} (relative)")
    return obj, np.array([p.grad_norm(th[i][p.free]) for i, p in enumerate(problems)])


def cell(gate: str, d: int, k: int, n: int, R: int, S: int, init: str, jac: str, gtol: float, max_iter: int,
         repeat: int, scipy_repeat: int, compiled: bool = True) -> dict:
    spec = ms.MoE(gate=gate, expert="linear", k=k, d=d)
    data = ms.simulate(spec, truth_params(gate, k, d), n=n, reps=R, seed=1, inputs="gaussian")
    starts = make_starts(spec, data.X, data.y, S, init, seed=2)
    th0 = theta_rows(starts).reshape(R * S, -1)
    problems = [PlainMoE(gate, k, data.X[r], data.y[r]) for r in range(R) for _ in range(S)]
    x0s = [th0[i][p.free] for i, p in enumerate(problems)]
    jac_err = check_problem(problems[0], x0s[0])
    if jac_err > 1e-10:
        raise AssertionError(f"analytic Jacobian differs from autograd by {jac_err:.2e} (relative)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # moestat's ConvergenceWarning: non-converged restarts are counted below
        for c in (False, True) if compiled else (False,):  # warm-up (and the C++ build)
            run_moestat(spec, data.X[:1], data.y[:1], starts.select(list(range(S))), S, gtol, 3, compile=c)
        t_ms, t_mc, t_sp = [], [], []
        fit, fit_c, sp = None, None, None
        for i in range(max(repeat, scipy_repeat)):
            if i < repeat:
                fit, t = run_moestat(spec, data.X, data.y, starts, S, gtol, max_iter)
                t_ms.append(t)
                if compiled:
                    fit_c, t = run_moestat(spec, data.X, data.y, starts, S, gtol, max_iter, compile=True)
                    t_mc.append(t)
            if i < scipy_repeat:
                sp, t = run_scipy(problems, x0s, jac, gtol, max_iter)
                t_sp.append(t)
    # the same end-point judge for all
    obj_ms, g_ms = judge(problems, fit)
    obj_sp = np.array([p.objective(res.x) for p, res in zip(problems, sp, strict=True)])
    g_sp = np.array([p.grad_norm(res.x) for p, res in zip(problems, sp, strict=True)])
    conv_ms, conv_sp = g_ms <= GTOL_SLACK * gtol, g_sp <= GTOL_SLACK * gtol
    both = conv_ms & conv_sp
    rel = (obj_ms - obj_sp) / obj_sp
    same = both & (np.abs(rel) <= SAME_MIN)
    best_ms = np.where(conv_ms, obj_ms, np.inf).reshape(R, S).min(1)
    best_sp = np.where(conv_sp, obj_sp, np.inf).reshape(R, S).min(1)
    ok = np.isfinite(best_ms) & np.isfinite(best_sp)
    best_rel = (best_ms[ok] - best_sp[ok]) / best_sp[ok]
    rate_ms = conv_ms.sum() / min(t_ms)
    rate_sp = conv_sp.sum() / min(t_sp)
    compiled_columns = {}
    if compiled:
        obj_mc, g_mc = judge(problems, fit_c)
        conv_mc = g_mc <= GTOL_SLACK * gtol
        rate_mc = conv_mc.sum() / min(t_mc)
        both_mc = conv_mc & conv_ms
        compiled_columns = {
            "compile=True s (min-max)": f"{min(t_mc):.3g}-{max(t_mc):.3g}", "converged compiled": int(conv_mc.sum()),
            "speed-up compiled": (float(rate_mc / rate_sp) if rate_sp > 0 else "scipy none" if rate_mc > 0
                                  else "neither"),
            "compiled = default (to 1e-8)": f"{int((np.abs(obj_mc - obj_ms) <= SAME_MIN * obj_ms)[both_mc].sum())}"
                                            f"/{int(both_mc.sum())}",
            "loop": fit_c.settings.get("newton_loop", "tensor")}
    return {"gate": gate, "d": d, "k": k, "n": n, "fits": R * S,
            "moestat s (min-max)": f"{min(t_ms):.3g}-{max(t_ms):.3g}",
            "scipy s (min-max)": f"{min(t_sp):.3g}-{max(t_sp):.3g}",
            "converged moestat": int(conv_ms.sum()), "converged scipy": int(conv_sp.sum()),
            "conv. fits/s moestat": float(rate_ms), "conv. fits/s scipy": float(rate_sp),
            "speed-up": (float(rate_ms / rate_sp) if rate_sp > 0 else "scipy none" if rate_ms > 0 else "neither"),
            **compiled_columns,
            "same minimum": f"{int(same.sum())}/{int(both.sum())}",
            "lower: moestat/scipy": f"{int((both & (rel < -SAME_MIN)).sum())}/{int((both & (rel > SAME_MIN)).sum())}",
            "best-of-restarts rel. diff (max |.|)": float(np.abs(best_rel).max()) if ok.any() else float("nan"),
            "replicates moestat best lower/equal/higher": (f"{int((best_rel < -SAME_MIN).sum())}/"
                                                          f"{int((np.abs(best_rel) <= SAME_MIN).sum())}/"
                                                          f"{int((best_rel > SAME_MIN).sum())}"),
            "scipy nfev (median)": int(np.median([r.nfev for r in sp])),
            "moestat iters (median)": int(np.median(fit.restarts["n_iter"]))}


def jac_rows(gtol: float, max_iter: int) -> list[dict]:
    """Seconds per scipy fit with each Jacobian, and one moestat fit of the same problems (softmax, d=2, k=3)."""
    gate, d, k, n, S = "softmax", 2, 3, 1000, 2
    spec = ms.MoE(gate=gate, expert="linear", k=k, d=d)
    data = ms.simulate(spec, truth_params(gate, k, d), n=n, reps=1, seed=1, inputs="gaussian")
    starts = make_starts(spec, data.X, data.y, S, "kmeans", seed=2)
    th0 = theta_rows(starts).reshape(S, -1)
    problems = [PlainMoE(gate, k, data.X[0], data.y[0]) for _ in range(S)]
    x0s = [th0[i][p.free] for i, p in enumerate(problems)]
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit, t = run_moestat(spec, data.X, data.y, starts, S, gtol, max_iter)
        fit, t = run_moestat(spec, data.X, data.y, starts, S, gtol, max_iter)
    rows.append({"fitter": "moestat fit_lse (batched)", "s per fit": t / S,
                 "objectives": ", ".join(f"{v:.10g}" for v in fit.restarts["objective"])})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            fit, t = run_moestat(spec, data.X, data.y, starts, S, gtol, max_iter, compile=True)
    rows.append({"fitter": "moestat fit_lse(compile=True)", "s per fit": t / S,
                 "objectives": ", ".join(f"{v:.10g}" for v in fit.restarts["objective"])})
    for jac in ("analytic", "autograd", "2-point"):
        sp, t = run_scipy(problems, x0s, jac, gtol, max_iter)
        rows.append({"fitter": f"scipy trf, jac={jac}", "s per fit": t / S,
                     "objectives": ", ".join(f"{p.objective(r.x):.10g}" for p, r in zip(problems, sp, strict=True))})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 cells per gate, R=2, S=3 (about 20 s)")
    ap.add_argument("--gates", default="softmax,sigmoid")
    ap.add_argument("--reps", type=int, default=None, help="replicates R (default 5; quick 2)")
    ap.add_argument("--restarts", type=int, default=None, help="starts per replicate S (default 4; quick 3)")
    ap.add_argument("--init", default="kmeans", choices=("kmeans", "random"))
    ap.add_argument("--jac", default="analytic", choices=("analytic", "autograd", "2-point"))
    ap.add_argument("--gtol", type=float, default=1e-10, help="gradient tolerance (fit_lse's default)")
    ap.add_argument("--max-iter", type=int, default=200, help="iteration cap (fit_lse's Newton default)")
    ap.add_argument("--repeat", type=int, default=3, help="timed moestat runs per cell")
    ap.add_argument("--scipy-repeat", type=int, default=None, help="timed scipy runs per cell (default 2; quick 1)")
    ap.add_argument("--parts", default="cells,scaling,jac")
    ap.add_argument("--no-compile", action="store_true", help="time fit_lse's default only, not also compile=True")
    args = ap.parse_args()
    torch.set_num_threads(1)
    R = args.reps or (2 if args.quick else 5)
    S = args.restarts or (3 if args.quick else 4)
    scipy_repeat = args.scipy_repeat or (1 if args.quick else 2)
    cells = QUICK_CELLS if args.quick else FULL_CELLS
    import scipy

    print(f"torch {torch.__version__}, scipy {scipy.__version__}, threads {torch.get_num_threads()}, "
          f"R={R}, S={S}, init {args.init}, jac {args.jac}, gtol {args.gtol:g}, max_iter {args.max_iter}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.1f}\n")
    parts = args.parts.split(",")
    if "cells" in parts:
        rows = []
        for gate in args.gates.split(","):
            for d, k, n in cells:
                rows.append(cell(gate, d, k, n, R, S, args.init, args.jac, args.gtol, args.max_iter, args.repeat,
                                 scipy_repeat, not args.no_compile))
                print(md_table(rows[-1:]).splitlines()[-1], flush=True)
        print("\n## converged fits per second, moestat vs scipy least_squares (same data, starts, stopping rule)\n"
              + md_table(rows) + "\n", flush=True)
    if "scaling" in parts:
        rows = []
        for gate in args.gates.split(","):
            for r_, s_ in SCALING:
                row = cell(gate, 1, 2, 500, r_, s_, args.init, args.jac, args.gtol, args.max_iter, args.repeat,
                           scipy_repeat, not args.no_compile)
                rows.append({key: row[key] for key in SCALING_COLUMNS if key in row})
        print("## the same comparison as R x S grows (d=1, k=2, n=500)\n" + md_table(rows) + "\n", flush=True)
    if "jac" in parts:
        print("## scipy's Jacobian options (softmax, d=2, k=3, n=1000, 2 k-means starts)\n"
              + md_table(jac_rows(args.gtol, args.max_iter)) + "\n", flush=True)


if __name__ == "__main__":
    main()
