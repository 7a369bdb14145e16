"""nguyen2025_shared (DeepSeek-style shared experts and normalised sigmoid routing): the model against a numpy
implementation of its formula, the paired truths, the least-squares estimator against moestat's fit_lse and the
noise-free truth, the matched errors against a brute-force matching and their invariances, the information matrix
against finite differences, and the study cell."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.special import erf

import moestat as ms
from moestat.papers import nguyen2025_shared as paper
from moestat.params import Params
from moestat.rates.theory import THEORY_COLUMNS

ARCHS = list(paper.ARCHITECTURES)


def gelu(z):
    return 0.5 * z * (1.0 + erf(z / np.sqrt(2.0)))


def numpy_mean(arch, p, X):
    """The module docstring's formula written out in numpy: shared experts with weight one plus routed experts
    weighted by the normalised sigmoid or the softmax of beta_1^T x + beta_0."""
    gate = paper.ARCHITECTURES[arch][0]
    r = p.routed
    s = X @ np.asarray(r.gate_weight).T + np.asarray(r.gate_bias)
    if gate == "softmax":
        e = np.exp(s - s.max(1, keepdims=True))
        w = e / e.sum(1, keepdims=True)
    else:
        sig = 1.0 / (1.0 + np.exp(-s))
        w = sig / sig.sum(1, keepdims=True)
    out = (w * gelu(X @ np.asarray(r.expert_weight).T + np.asarray(r.expert_bias))).sum(1)
    for a, b in zip(p.shared_weight, p.shared_bias, strict=True):
        out = out + gelu(X @ a + b)
    return out


def tp(arch):
    return paper.truth_params(paper.shared_experts_truth(arch))


@pytest.fixture(scope="module")
def X():
    return np.random.default_rng(0).uniform(-1, 1, size=(400, 2))


# ----------------------------------------------------------------------------- theory rows
def test_theory_rows_have_the_registry_columns_and_honest_kinds():
    assert all(len(row) == len(THEORY_COLUMNS) and row[0] == "nguyen2025_shared" for row in paper.THEORY)
    rows = [dict(zip(THEORY_COLUMNS, row, strict=True)) for row in paper.THEORY]
    claims = [r for r in rows if r["kind"] == "claim"]
    # the abstract's two claims carry no rate: the theorems could not be read
    assert len(claims) == 2 and all(np.isnan(r["exponent"]) and r["rate_model"] is None for r in claims)
    derived = [r for r in rows if r["kind"] == "derived"]
    assert {r["exponent"] for r in derived} == {0.5} and {r["rate_model"] for r in derived} == {"power"}
    # every architecture has a derived l2 and err_expert row; only shared architectures have err_shared_expert
    for gate, m in paper.ARCHITECTURES.values():
        regime = "shared" if m else "plain"
        mine = {r["response"] for r in derived if r["gate"] == gate and r["regime"] == regime}
        assert {"l2", "err_expert", "err_param"} <= mine
        assert ("err_shared_expert" in mine) == bool(m)
    assert [r["kind"] for r in rows if r["regime"] == "cross"] == ["no_rate"]
    # predicted_rate takes the first matching row: the derived rates must come before the rate-less claims
    kinds = [r["kind"] for r in rows]
    assert max(i for i, k in enumerate(kinds) if k == "derived") < min(i for i, k in enumerate(kinds) if k == "claim")


# ----------------------------------------------------------------------------- the model
@pytest.mark.parametrize("arch", ARCHS)
def test_mean_matches_the_formula_in_numpy(arch, X):
    p = tp(arch)
    got = paper.evaluate(arch, "gelu", p, X)
    np.testing.assert_allclose(got, numpy_mean(arch, p, X), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
def test_closed_form_jacobian_equals_autodiff(arch, X):
    p = perturbed(tp(arch), np.random.default_rng(8), R=1, scale=0.2)  # away from the truth's round numbers
    theta = torch.as_tensor(p.flat()[0])
    Xt = torch.as_tensor(X)
    got = paper.shared_jacobian(arch, "gelu", theta, Xt, p.k, p.m)
    want = torch.func.jacfwd(lambda t: paper.shared_mean(arch, "gelu", t, Xt, p.k, p.m))(theta)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


def test_without_shared_experts_the_model_is_moestats_moe(X):
    for arch in ("nsig", "softmax"):
        p = tp(arch)
        spec = ms.MoE(gate=paper.ARCHITECTURES[arch][0], expert="gelu", k=p.k, d=2)
        np.testing.assert_allclose(paper.evaluate(arch, "gelu", p, X), spec.mean(p.routed, X), rtol=1e-13)


def test_architectures_share_experts_and_differ_in_routing(X):
    shared, plain = tp("shared_nsig"), tp("softmax")
    assert (shared.k, shared.m, plain.k, plain.m) == (2, 1, 3, 0)
    # the shared expert is the plain model's last atom, routed with a zero gate row
    np.testing.assert_array_equal(np.asarray(plain.routed.expert_weight)[2], shared.shared_weight[0])
    assert np.asarray(plain.routed.gate_bias)[2] == 0 and not np.asarray(plain.routed.gate_weight)[2].any()
    back = paper.as_architecture(paper.as_architecture(shared, 0), 1)
    np.testing.assert_array_equal(back.flat(), shared.flat())
    # the four regression functions differ (the design compares different models on one data stream)
    means = [paper.evaluate(a, "gelu", tp(a), X) for a in ARCHS]
    for i, j in itertools.combinations(range(4), 2):
        assert np.abs(means[i] - means[j]).max() > 0.05


def test_simulated_truths_are_paired_and_have_the_stated_noise():
    ys, fs = [], []
    for arch in ARCHS:
        truth = paper.shared_experts_truth(arch)
        X, y = paper.simulate_shared(truth, 4000, 2, seed=7)
        ys.append(y)
        fs.append(np.stack([paper.evaluate(arch, "gelu", paper.truth_params(truth), X[r]) for r in range(2)]))
        if arch == ARCHS[0]:
            X0 = X
        np.testing.assert_array_equal(X, X0)  # same inputs for every architecture
    noise = [y - f for y, f in zip(ys, fs, strict=True)]
    for e in noise[1:]:
        np.testing.assert_allclose(e, noise[0], atol=1e-12)  # same noise draws
    # sd of 8000 standard normal draws times 0.02: within 5% (about 3 standard errors of an sd estimate)
    assert noise[0].std() == pytest.approx(paper.NOISE_SD, rel=0.05)


# ----------------------------------------------------------------------------- the estimator
@pytest.mark.parametrize("arch", ARCHS)
def test_noise_free_data_are_fitted_exactly(arch):
    p = tp(arch)
    X = np.random.default_rng(1).uniform(-1, 1, size=(1, 500, 2))
    y = paper.evaluate(arch, "gelu", p, X[0])[None]
    fit = paper.fit_shared_lse(arch, X, y, k=p.k, truth=p, seed=0, starts=["near_truth"])
    assert fit.converged.all() and fit.objective[0] < 1e-20
    err = paper.matched_errors(fit.params, p, arch)
    assert err["err_param"][0] < 1e-7  # the start moved every coordinate by about 0.05; the LSE is the truth


def test_fit_reaches_fit_lse_minimum_and_no_higher_than_the_truth():
    """Independent implementation: moestat's fit_lse (trust-region Newton, its own kernels) on the plain softmax
    and normalised sigmoid models reaches the same least-squares minimum; both lie below the objective at the
    true parameters."""
    for arch in ("softmax", "nsig"):
        truth = paper.shared_experts_truth(arch)
        p = paper.truth_params(truth)
        X, y = paper.simulate_shared(truth, 300, 1, seed=3)
        mine = paper.fit_shared_lse(arch, X, y, k=p.k, truth=p, seed=0, starts=["near_truth"])
        ref = ms.fit_lse(truth.spec, X, y, init="near_truth", truth=p.routed, seed=0, threads=1, condition=False)
        at_truth = np.mean((y[0] - paper.evaluate(arch, "gelu", p, X[0])) ** 2)
        assert mine.objective[0] <= at_truth
        # both solvers stop on tolerances far below this: equal minima to 1e-9 relative
        assert mine.objective[0] == pytest.approx(float(ref.objective[0]), rel=1e-9)
        if arch == "softmax":  # the gauge: last routed gate row held at zero
            assert np.asarray(mine.params.routed.gate_bias)[0, -1] == 0
            assert not np.asarray(mine.params.routed.gate_weight)[0, -1].any()


def test_fit_records_every_start_and_keeps_the_lowest():
    p = tp("shared_nsig")
    truth = paper.shared_experts_truth("shared_nsig")
    X, y = paper.simulate_shared(truth, 300, 2, seed=5)
    fit = paper.fit_shared_lse("shared_nsig", X, y, k=2, truth=p, seed=1, starts=["near_truth", "random"],
                               max_nfev=60)
    both = np.stack([fit.objectives["near_truth"], fit.objectives["random"]])
    np.testing.assert_array_equal(fit.objective, both.min(0))
    assert set(fit.start) <= {"near_truth", "random"}


def test_bad_inputs_name_the_argument():
    p = tp("softmax")
    X, y = np.zeros((1, 10, 2)), np.zeros((1, 10))
    with pytest.raises(ValueError, match="architecture"):
        paper.shared_experts_truth("deepseek")
    with pytest.raises(ValueError, match="noise_sd"):
        paper.shared_experts_truth("softmax", noise_sd=0)
    with pytest.raises(ValueError, match="needs truth"):
        paper.fit_shared_lse("softmax", X, y, k=3)
    with pytest.raises(ValueError, match="as_architecture"):
        paper.fit_shared_lse("shared_softmax", X, y, k=2, truth=p)
    with pytest.raises(ValueError, match="starts"):
        paper.fit_shared_lse("softmax", X, y, k=3, truth=p, starts=["random", "random"])
    with pytest.raises(ValueError, match="m=1"):
        paper.shared_mean("softmax", "gelu", torch.zeros(18), torch.zeros(3, 2), 3, 1)
    with pytest.raises(ValueError, match="shape"):
        paper.fit_shared_lse("softmax", X[0], y, k=3, truth=p)


# ----------------------------------------------------------------------------- matched errors
def brute_errors(fitted, truth, arch):
    """The definition of matched_errors, replicate by replicate, with explicit loops over both groups'
    permutations (the routed and the shared matching chosen jointly)."""
    gate = paper.ARCHITECTURES[arch][0]
    out = {b: [] for b in paper.BLOCKS}
    k, m = truth.k, truth.m
    for j in range(k + m):
        out[f"expert_{j}"] = []
    t = truth.routed
    tg = np.column_stack([np.asarray(t.gate_bias), np.asarray(t.gate_weight)])
    te = np.column_stack([np.asarray(t.expert_weight), np.asarray(t.expert_bias)])
    tk = np.column_stack([truth.shared_weight, truth.shared_bias])
    for r in range(np.asarray(fitted.routed.gate_bias).shape[0]):
        f = fitted.routed
        fg = np.column_stack([np.asarray(f.gate_bias)[r], np.asarray(f.gate_weight)[r]])
        fe = np.column_stack([np.asarray(f.expert_weight)[r], np.asarray(f.expert_bias)[r]])
        fk = np.column_stack([fitted.shared_weight[r], fitted.shared_bias[r]])
        best = None
        for perm in itertools.permutations(range(k)):
            for sperm in itertools.permutations(range(m)):
                g, tgc = fg[list(perm)], tg
                if gate == "softmax":
                    g, tgc = g - g[k - 1], tg - tg[k - 1]
                dg = [np.linalg.norm(g[j] - tgc[j]) for j in range(k)]
                de = [np.linalg.norm(fe[perm[j]] - te[j]) for j in range(k)]
                dk = [np.linalg.norm(fk[sperm[s]] - tk[s]) for s in range(m)]
                cost = sum(x**2 for x in dg + de + dk)
                if best is None or cost < best[0]:
                    best = (cost, dg, de, dk)
        _, dg, de, dk = best
        out["routed_gate"].append(max(dg))
        out["routed_expert"].append(max(de))
        out["shared_expert"].append(max(dk) if m else np.nan)
        out["expert"].append(max(de + dk))
        out["param"].append(max([np.hypot(a, b) for a, b in zip(dg, de, strict=True)] + dk))
        for j, e in enumerate(de + dk):
            out[f"expert_{j}"].append(e)
    return {f"err_{b}": np.asarray(v) for b, v in out.items()}


def perturbed(p, rng, R=4, scale=0.3):
    flat = p.flat()[None] + scale * rng.standard_normal((R, p.flat().size))
    return paper.SharedParams.from_flat(flat, p.k, p.m, p.d)


@pytest.mark.parametrize("arch", ARCHS)
def test_matched_errors_equal_brute_force(arch):
    p = tp(arch)
    fitted = perturbed(p, np.random.default_rng(11))
    got = paper.matched_errors(fitted, p, arch)
    want = brute_errors(fitted, p, arch)
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-12, equal_nan=True)
    zero = paper.matched_errors(p, p, arch)
    assert all(v[0] == 0 or np.isnan(v[0]) for v in zero.values())


def test_matched_errors_with_two_shared_experts_equal_brute_force():
    p = paper.as_architecture(tp("nsig"), 2)  # the three experts as one routed atom and two shared experts
    assert (p.k, p.m) == (1, 2)
    fitted = perturbed(p, np.random.default_rng(4), R=3)
    got = paper.matched_errors(fitted, p, "shared_nsig")
    want = brute_errors(fitted, p, "shared_nsig")
    swapped = paper.SharedParams(fitted.routed, fitted.shared_weight[:, ::-1], fitted.shared_bias[:, ::-1])
    again = paper.matched_errors(swapped, p, "shared_nsig")
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-12)
        np.testing.assert_allclose(again[key], got[key], rtol=1e-12)  # shared experts permute among themselves


@pytest.mark.parametrize("arch", ARCHS)
def test_matched_errors_ignore_the_order_of_routed_atoms(arch):
    p = tp(arch)
    fitted = perturbed(p, np.random.default_rng(2), scale=0.1)
    r = fitted.routed
    order = list(range(p.k))[::-1]
    shuffled = paper.SharedParams(Params(np.asarray(r.gate_bias)[:, order], np.asarray(r.gate_weight)[:, order],
                                         np.asarray(r.expert_weight)[:, order], np.asarray(r.expert_bias)[:, order]),
                                  fitted.shared_weight, fitted.shared_bias)
    a, b = paper.matched_errors(fitted, p, arch), paper.matched_errors(shuffled, p, arch)
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-12, equal_nan=True)


def test_shared_experts_are_not_exchangeable_with_routed_ones():
    """Swapping the shared expert with a routed atom's expert is a different model: a perfect fit stops being one
    (a matching across groups would score the swapped fit zero)."""
    p = tp("shared_nsig")
    r = p.routed
    ew = np.asarray(r.expert_weight).copy()
    eb = np.asarray(r.expert_bias).copy()
    sw, sb = ew[:1].copy(), eb[:1].copy()
    ew[0], eb[0] = p.shared_weight[0], p.shared_bias[0]
    swapped = paper.SharedParams(Params(r.gate_bias, r.gate_weight, ew, eb), sw, sb)
    err = paper.matched_errors(swapped, p, "shared_nsig")
    assert err["err_shared_expert"][0] > 1 and err["err_routed_expert"][0] > 1


def test_softmax_errors_see_only_gate_differences_and_nsig_errors_do_not():
    rng = np.random.default_rng(3)
    for arch, invariant in (("softmax", True), ("shared_nsig", False)):
        p = tp(arch)
        fitted = perturbed(p, rng, R=2, scale=0.05)
        r = fitted.routed
        shift = np.array([0.7, -0.4, 0.3])  # (beta_0, beta_1) added to every routed gate row
        moved = paper.SharedParams(Params(np.asarray(r.gate_bias) + shift[0], np.asarray(r.gate_weight) + shift[1:],
                                          r.expert_weight, r.expert_bias), fitted.shared_weight, fitted.shared_bias)
        a, b = paper.matched_errors(fitted, p, arch), paper.matched_errors(moved, p, arch)
        same = np.allclose(a["err_routed_gate"], b["err_routed_gate"], rtol=1e-12)
        assert same == invariant
        # the softmax router itself is unchanged by the shift; the normalised sigmoid router is not
        X = rng.uniform(-1, 1, (50, 2))
        f0 = paper.evaluate(arch, "gelu", fitted.select([0]), X[None])
        f1 = paper.evaluate(arch, "gelu", moved.select([0]), X[None])
        assert np.allclose(f0, f1, atol=1e-12) == invariant


# ----------------------------------------------------------------------------- information, l2
def test_information_eigenvalues_equal_finite_differences_and_detect_non_identifiability(X):
    arch = "shared_nsig"
    p = tp(arch)
    ev = paper.information_eigenvalues(arch, p, X)
    theta = p.flat()
    h = 1e-6
    cols = []
    for i in range(theta.size):
        e = np.zeros_like(theta)
        e[i] = h
        plus = paper.evaluate(arch, "gelu", paper.SharedParams.from_flat(theta + e, 2, 1, 2), X)
        minus = paper.evaluate(arch, "gelu", paper.SharedParams.from_flat(theta - e, 2, 1, 2), X)
        cols.append((plus - minus) / (2 * h))
    J = np.column_stack(cols)
    fd = np.linalg.eigvalsh(J.T @ J / len(X))
    # central differences: O(h^2) ~ 1e-12 error per entry; eigenvalues agree far inside 1e-7 absolute
    np.testing.assert_allclose(ev, fd, atol=1e-7)
    assert ev[0] > 1e-5  # identified at the truth
    # two copies of one routed atom: exchanging mass between them leaves f unchanged, so one eigenvalue is zero
    r = p.routed
    dup = paper.SharedParams(Params(np.repeat(np.asarray(r.gate_bias)[:1], 2), np.repeat(np.asarray(r.gate_weight)
                                    [:1], 2, 0), np.repeat(np.asarray(r.expert_weight)[:1], 2, 0),
                                    np.repeat(np.asarray(r.expert_bias)[:1], 2)), p.shared_weight, p.shared_bias)
    assert paper.information_eigenvalues(arch, dup, X)[0] < 1e-12


def unbatch(p, r):
    fields = ("gate_bias", "gate_weight", "expert_weight", "expert_bias")
    return paper.SharedParams(Params(*(np.asarray(getattr(p.routed, f))[r] for f in fields)),
                              p.shared_weight[r], p.shared_bias[r])


def test_l2_distance_is_the_root_mean_square_difference(X):
    a, b = tp("shared_nsig"), tp("softmax")
    batch = perturbed(a, np.random.default_rng(9), R=2, scale=0.1)
    got = paper.l2_distance("shared_nsig", batch, "softmax", b, X)
    fb = numpy_mean("softmax", b, X)
    want = [np.sqrt(np.mean((numpy_mean("shared_nsig", unbatch(batch, r), X) - fb) ** 2)) for r in range(2)]
    np.testing.assert_allclose(got, want, rtol=1e-12)


# ----------------------------------------------------------------------------- the study cell
def test_study_cell_fits_own_and_other_architectures_on_paired_data():
    study = ms.Study(name="t", truth=[{"label": a, "stream": "s", "data": {"architecture": a}}
                                     for a in ("shared_nsig", "softmax")],
                     fit=[{"label": "own", "options": {"starts": ["near_truth"]}},
                          {"label": "other", "options": {"architecture": "other", "starts": ["near_truth"]}}],
                     n=[400], reps=2, seed=1, cell=paper.shared_cell, threads=1)
    frame = study.run(None, progress=False)
    assert len(frame) == 8 and frame.groupby("rep")["data_seed"].nunique().eq(1).all()
    own = frame[frame["fit"] == "own"]
    other = frame[frame["fit"] == "other"]
    assert (own["architecture"] == own["truth"]).all() and (own["specified"] == "well").all()
    assert set(zip(other["truth"], other["architecture"], strict=True)) == {("shared_nsig", "softmax"),
                                                                          ("softmax", "shared_nsig")}
    assert own["err_expert"].notna().all() and other["err_expert"].isna().all()
    # the misspecified fit cannot reproduce the other model: its l2 is far above the well-specified fit's
    assert other["l2"].min() > 10 * own["l2"].max()
    ctx = SimpleNamespace(truth_cfg={"data": {"architecture": "softmax"}}, fit_cfg={"options": {"lr": 1}})
    with pytest.raises(ValueError, match="not options of shared_cell"):
        paper.shared_cell(ctx)
