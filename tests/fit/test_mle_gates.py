"""fit_mle for every gate that defines a mixture density (gradient path, generalised EM, standard errors)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import moestat as ms
from moestat.exceptions import SingularInformationWarning
from moestat.fit._layout import BlockParams, ParamLayout
from moestat.fit.em import em_fit
from moestat.fit.mle import log_components, random_starts

_EXPERTS = dict(expert_weight=[[2.0, 0.0], [-2.0, 1.0]], expert_bias=[1.0, -1.0], noise_sd=[0.3, 0.3])
SPECS = {
    "softmax": (ms.MoE(gate="softmax", k=2, d=2), [0.5, 0.0], [[1.5, -1.0], [0.0, 0.0]]),
    "sigmoid": (ms.MoE(gate="sigmoid", k=2, d=2), [0.5, -0.5], [[1.5, -1.0], [-1.0, 1.0]]),
    "normalized_sigmoid": (ms.MoE(gate="normalized_sigmoid", k=2, d=2), [0.5, -0.5], [[1.5, -1.0], [-1.0, 1.0]]),
    "laplace": (ms.MoE(gate="laplace", k=2, d=2), [0.5, 0.0], [[1.0, 0.0], [-1.0, 0.5]]),
    "cosine": (ms.MoE(gate="cosine", k=2, d=2), [0.5, 0.0], [[1.0, 1.0], [-1.0, 0.5]]),
    "perturbed_cosine": (ms.MoE(gate="perturbed_cosine", k=2, d=2), [0.5, 0.0], [[1.0, 1.0], [-1.0, 0.5]]),
    "quadratic": (ms.MoE(gate="quadratic", k=2, d=2), [0.5, 0.0], [[2.0, -1.0], [0.0, 0.0]]),
    "gaussian": (ms.MoE(gate="gaussian", k=2, d=2), [0.5, 0.0], [[1.0, 0.5], [-1.0, 0.0]]),
}
TOPK_SPEC = ms.MoE(gate="topk", k=3, d=2, top_k=2)
TOPK_TRUTH = ms.Params([0.5, 0.0, -0.5], [[1.5, -1.0], [-1.0, 1.0], [0.0, 0.0]], [[2.0, 0.0], [-2.0, 1.0], [0.0, -1.0]],
                       [1.0, -1.0, 0.0], noise_sd=[0.3, 0.3, 0.3])
EM_GATES = ["softmax", "laplace", "cosine", "perturbed_cosine", "quadratic", "gaussian", "sigmoid",
            "normalized_sigmoid", "topk"]
# top-K's likelihood jumps wherever a selected set changes, so its agreement test needs a maximum inside one set
# region (test_topk_em_and_gradient_reach_the_same_interior_maximum)
SMOOTH_EM_GATES = [g for g in EM_GATES if g != "topk"]
ALL = [*SPECS, "topk"]


def _case(gate: str) -> tuple[ms.MoE, ms.Params]:
    if gate == "topk":
        return TOPK_SPEC, TOPK_TRUTH
    spec, gb, gw = SPECS[gate]
    return spec, ms.Params(gb, gw, **_EXPERTS)


def _data(gate: str, n: int, seed: int = 0):
    spec, truth = _case(gate)
    data = ms.simulate(spec, truth, n=n, seed=seed, model="mixture")
    return spec, truth, data.X[0], data.y[0]


def _fit(spec, X, y, init, method="gradient", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingularInformationWarning)
        return ms.fit_mle(spec, X, y, method=method, init=init, restarts=0, tol=1e-12, gtol=1e-9, **kw)


@pytest.mark.parametrize("gate", ALL)
def test_reported_loglik_is_the_models_loglik_of_the_returned_params(gate):
    spec, truth, X, y = _data(gate, 600)
    for method in ("gradient", "em") if gate in EM_GATES else ("gradient",):
        fit = _fit(spec, X, y, truth, method=method)
        # the engine's (A, k, n) layout and the model's public loglik are two evaluations of one sum: rounding only
        np.testing.assert_allclose(fit.loglik, spec.loglik(fit.params, X, y), rtol=1e-10, atol=0)


@pytest.mark.parametrize("gate", ALL)
def test_objective_gradient_matches_finite_differences(gate):
    """The L-BFGS objective -l/n (log_components in the layout's terms) against central differences."""
    spec, _, X, y = _data(gate, 300)
    layout = ParamLayout(spec)
    rng = np.random.default_rng(1)
    theta = torch.as_tensor(rng.normal(scale=0.7, size=(1, layout.size)))
    Zt = torch.cat([torch.ones(1, 300, 1, dtype=torch.float64), torch.as_tensor(X)[None]], -1).transpose(1, 2)
    yt = torch.as_tensor(y)[None]

    def objective(th: torch.Tensor) -> torch.Tensor:
        return -torch.logsumexp(log_components(spec, layout.unpack(th), Zt, yt), dim=1).sum() / 300

    th = theta.clone().requires_grad_(True)
    grad = torch.autograd.grad(objective(th), th)[0][0].numpy()
    h = 1e-6
    fd = np.array([(objective(theta + h * e) - objective(theta - h * e)).item() / (2 * h)
                   for e in torch.eye(layout.size, dtype=torch.float64)[:, None]])
    # central differences in float64: truncation O(h^2) ~ 1e-12 and rounding ~ 1e-16 / h ~ 1e-10 per entry
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-7)
    # and the objective is the model's log-likelihood of the unpacked parameters (an independent evaluation)
    np.testing.assert_allclose(-300 * objective(theta).item(),
                               spec.loglik(layout.unpack(theta[0]).to_params().numpy(), X, y), rtol=1e-12)


def test_topk_gradient_is_the_gradient_with_the_selected_set_held_fixed():
    """Top-K: the likelihood jumps where the selection changes; autograd differentiates it with the set of each
    observation frozen at the evaluation point (torch.topk's indices carry no gradient).  Checked against a
    hand-written likelihood whose mask is computed once, from the same point, and then held."""
    spec, _, X, y = _data("topk", 300)
    layout = ParamLayout(spec)
    theta = torch.as_tensor(np.random.default_rng(2).normal(scale=0.7, size=layout.size))
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)

    def frozen(th: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        p = layout.unpack(th)
        logits = Xt @ p.gate_weight.T + p.gate_bias
        logw = torch.log_softmax(logits.masked_fill(~mask, -torch.inf), -1)
        mu = Xt @ p.expert_weight.T + p.expert_bias
        logn = -0.5 * ((yt[:, None] - mu) / p.noise_sd) ** 2 - torch.log(p.noise_sd) - 0.5 * np.log(2 * np.pi)
        return torch.logsumexp(torch.where(mask, logw + logn, -torch.inf), -1).sum()

    p0 = layout.unpack(theta)
    logits0 = Xt @ p0.gate_weight.T + p0.gate_bias
    mask = torch.zeros_like(logits0, dtype=torch.bool).scatter(-1, logits0.topk(2, -1).indices, True)
    th1 = theta.clone().requires_grad_(True)
    th2 = theta.clone().requires_grad_(True)
    ll1 = torch.logsumexp(spec.log_density_components(layout.unpack(th1), Xt, yt), -1).sum()
    g1 = torch.autograd.grad(ll1, th1)[0]
    g2 = torch.autograd.grad(frozen(th2, mask), th2)[0]
    np.testing.assert_allclose(ll1.item(), frozen(theta, mask).item(), rtol=1e-12)
    np.testing.assert_allclose(g1.numpy(), g2.numpy(), rtol=1e-10, atol=1e-10)
    # a fit from the truth ends at a stationary point of the frozen-set likelihood, with the same loglik as the model
    fit = _fit(spec, X, y, TOPK_TRUTH)
    assert fit.converged
    np.testing.assert_allclose(fit.loglik, spec.loglik(fit.params, X, y), rtol=1e-10)


@pytest.mark.parametrize("gate", ALL)
def test_recovery_from_a_near_truth_start(gate):
    """n = 4000 from the gate's own MoE, started at the truth: every identified term within 4.5 standard errors of
    the truth (a two-sided normal tail of 7e-6 per term, about 1e-4 over a fit's 11-17 terms).  The perturbed
    cosine gate's d shift directions are not identified (its information is singular), so there its weights
    and experts are compared instead."""
    spec, truth, X, y = _data(gate, 4000, seed=3)
    fit = _fit(spec, X, y, truth)
    assert fit.converged
    layout = fit.layout
    target = layout.pack(BlockParams.from_params(truth.to_torch())).numpy()
    if gate == "perturbed_cosine":
        # weights: a max error of 0.1 over the inputs is about 4 standard errors of a gate fitted on 4000 points
        err = np.abs(spec.gate_weights(fit.params, X) - spec.gate_weights(truth, X)).max()
        assert err < 0.1
        expert = slice(layout.n_gate, layout.size)
        # the information is singular along exactly d = 2 directions (the local row shift), as documented: after
        # scaling to unit diagonal, two eigenvalues are rounding-sized and the others are not
        info = -np.asarray(fit.hessian())
        scale = 1 / np.sqrt(np.diag(info))
        eig = np.linalg.eigvalsh(info * scale[:, None] * scale[None, :])
        assert eig[1] < 1e-6 * eig[-1] and eig[2] > 1e-4 * eig[-1]
        # the expert terms' sampling sd is at most 0.03 here (softmax-gate fits of the same experts)
        np.testing.assert_allclose(fit.theta[expert], target[expert], atol=0.12)
        return
    se = fit.bse()
    assert np.isfinite(se).all() and (se > 0).all()
    z = (fit.theta - target) / se
    assert np.abs(z).max() < 4.5, dict(zip(fit.param_names, np.round(z, 2), strict=True))


@pytest.mark.parametrize("gate", SMOOTH_EM_GATES)
def test_em_and_gradient_reach_the_same_maximum(gate):
    """From the same start (random-subset starts, seed 4), EM with its gate step and L-BFGS end at one maximum: the
    log-likelihoods agree to 1e-6 (both stop on tolerances of 1e-12 relative / 1e-9 in the per-observation
    gradient, which put l within ~1e-8 of the maximum) and so do the fitted densities' weights and experts."""
    spec, truth, X, y = _data(gate, 1500, seed=5)
    em = _fit(spec, X, y, truth, method="em", switch_after=None, max_iter=3000)
    gr = _fit(spec, X, y, truth, method="gradient", max_iter=2000)
    assert em.converged and gr.converged
    assert abs(em.loglik - gr.loglik) < 1e-6
    # at a strict maximum, a loglik gap of 1e-6 allows parameter gaps of ~sqrt(2e-6 / lambda_min) ~ 1e-4
    np.testing.assert_allclose(spec.gate_weights(em.params, X), spec.gate_weights(gr.params, X), atol=2e-4)
    expert = slice(em.layout.n_gate, em.layout.size)
    np.testing.assert_allclose(em.theta[expert], gr.theta[expert], atol=2e-4)


@pytest.mark.parametrize("gate", [g for g in EM_GATES if g != "softmax"])
def test_generalised_em_never_lowers_the_loglik_on_any_iteration(gate):
    spec, _, X, y = _data(gate, 300, seed=6)
    Xt, yt = torch.as_tensor(X)[None], torch.as_tensor(y)[None]
    init = random_starts(spec, Xt, yt, 3, np.random.SeedSequence(7).spawn(1))
    floor = 1e-3 * yt.std(1)
    st = em_fit(spec, Xt, yt, init, var_floor=floor**2, tol=1e-12, max_iter=20, gate_steps=2)
    hist = st.history.numpy()[:, 0]  # (T, S): every iteration of every start
    assert hist.shape[0] > 5
    # ascent up to the rounding of a sum of 300 float64 terms
    assert (np.diff(hist, axis=0) >= -1e-9 * (1 + np.abs(hist[1:]))).all()
    assert (hist[-1] > hist[0] + 1.0).all()  # and it moves


def test_topk_em_and_gradient_reach_the_same_interior_maximum():
    """Top-2 of 3 with the third expert's gate score 8 below the others on every input: every selected set is
    {0, 1}, so near the maximum the likelihood is that of a softmax gate over experts 0 and 1 (smooth), and EM with
    its frozen-set gate step and L-BFGS must both reach it; the third expert's terms get zero derivative and stay
    at the start in both.  Independent check: the maximum is the log-likelihood of a k = 2 softmax MoE fitted by EM
    with the IRLS gate step (a different gate step).  (Where sets change near the maximum the likelihood jumps,
    and each method stops at its own jump edge: on the default top-K data above they end 0.5 apart.)"""
    truth = ms.Params([0.5, 0.0, -8.0], [[1.5, -1.0], [-1.0, 1.0], [0.0, 0.0]], [[2.0, 0.0], [-2.0, 1.0], [0.0, -1.0]],
                      [1.0, -1.0, 0.0], noise_sd=[0.3, 0.3, 0.3])
    data = ms.simulate(TOPK_SPEC, truth, n=1500, seed=5, model="mixture")
    X, y = data.X[0], data.y[0]
    em = _fit(TOPK_SPEC, X, y, truth, method="em", switch_after=None, max_iter=3000)
    gr = _fit(TOPK_SPEC, X, y, truth, method="gradient", max_iter=2000)
    assert em.converged and gr.converged
    for fit in (em, gr):  # the maximum is interior: the third score stays far below the other two on every input
        scores = X @ np.asarray(fit.params.gate_weight).T + np.asarray(fit.params.gate_bias)
        assert (scores[:, :2].min(1) - scores[:, 2]).min() > 1.0
    # both stop on tolerances of 1e-12 relative / 1e-9 in the per-observation gradient: l within ~1e-8 of the max
    assert abs(em.loglik - gr.loglik) < 1e-6
    soft = _fit(ms.MoE(gate="softmax", k=2, d=2), X, y,
                ms.Params([0.5, 0.0], [[1.5, -1.0], [-1.0, 1.0]], [[2.0, 0.0], [-2.0, 1.0]], [1.0, -1.0],
                          noise_sd=[0.3, 0.3]), method="em", switch_after=None, max_iter=3000)
    assert abs(em.loglik - soft.loglik) < 1e-6
    # a loglik gap of 1e-6 at a strict maximum allows parameter gaps of ~1e-4 (as in the test above)
    np.testing.assert_allclose(TOPK_SPEC.gate_weights(em.params, X), TOPK_SPEC.gate_weights(gr.params, X), atol=2e-4)
    np.testing.assert_allclose(TOPK_SPEC.gate_weights(em.params, X)[:, :2], ms.MoE(gate="softmax", k=2, d=2)
                               .gate_weights(soft.params, X), atol=2e-4)
    expert = slice(em.layout.n_gate, em.layout.size)
    np.testing.assert_allclose(em.theta[expert], gr.theta[expert], atol=2e-4)


def test_sparse_gate_em_changes_selected_sets_and_never_lowers_the_loglik():
    """Top-K and normalised sigmoid with top_k: a gate step that moves an expert with positive responsibility out
    of a selected set makes the expected complete-data log-likelihood -inf, so on it alone EM could never change a
    set; the line search also accepts a step that does not lower the observed log-likelihood.  Every iteration of
    every start must still not lower l, and the sets must change (checked against the start's sets)."""
    for spec in (TOPK_SPEC, ms.MoE(gate="normalized_sigmoid", k=3, d=2, top_k=2)):
        data = ms.simulate(TOPK_SPEC, TOPK_TRUTH, n=600, seed=6, model="mixture")
        X, y = data.X[0], data.y[0]
        Xt, yt = torch.as_tensor(X)[None], torch.as_tensor(y)[None]
        init = random_starts(spec, Xt, yt, 8, np.random.SeedSequence(7).spawn(1))
        # random-subset starts have a zero gate (every score tied, so every set is {0, 1}); random gate rows instead
        rng = np.random.default_rng(8)
        init.gate_bias = torch.as_tensor(rng.normal(size=init.gate_bias.shape))
        init.gate_weight = torch.as_tensor(rng.normal(size=init.gate_weight.shape))
        floor = 1e-3 * yt.std(1)
        st = em_fit(spec, Xt, yt, init, var_floor=floor**2, tol=1e-12, max_iter=200, gate_steps=2)
        hist = st.history.numpy()[:, 0]
        # ascent up to the rounding of a sum of 600 float64 terms
        assert (np.diff(hist, axis=0) >= -1e-9 * (1 + np.abs(hist[1:]))).all()
        changed = 0
        for s in range(8):
            start = init.map(lambda a, s=s: a[0, s]).to_params().numpy()
            end = st.params.map(lambda a, s=s: a[0, s]).to_params().numpy()
            changed += int(((spec.gate_weights(start, X) > 0) != (spec.gate_weights(end, X) > 0)).any())
        assert changed > 0


def test_tidy_names_the_gate_parameters_and_se_are_the_observed_information():
    """Laplace: every centre is free and the last intercept is the reference; cosine: angles.  The SEs are the
    inverse of minus the Hessian of the model's loglik in those terms, checked against central differences of the
    model's gradient (d = 2: the distance is smooth away from x = w; in d = 1 it has a kink at every input)."""
    spec, truth, X, y = _data("laplace", 400, seed=8)
    fit = _fit(spec, X, y, truth)
    terms = fit.tidy()["term"].tolist()
    assert terms[:5] == ["gate[0]:const", "gate[0]:x1", "gate[0]:x2", "gate[1]:x1", "gate[1]:x2"]
    layout = fit.layout
    th0 = torch.as_tensor(np.asarray(fit.theta))
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)

    def grad(th: torch.Tensor) -> np.ndarray:
        th = th.clone().requires_grad_(True)
        ll = torch.logsumexp(spec.log_density_components(layout.unpack(th), Xt, yt), -1).sum()  # MoE.loglik's core
        return torch.autograd.grad(ll, th)[0].numpy()

    h = 1e-5
    E = torch.eye(th0.numel(), dtype=torch.float64) * h
    H = np.stack([(grad(th0 + e) - grad(th0 - e)) / (2 * h) for e in E])
    # central differences: truncation O(h^2) ~ 1e-10 relative, rounding ~ 1e-16 * 400 / h ~ 1e-8 absolute
    np.testing.assert_allclose(fit.hessian(), H, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fit.bse(), np.sqrt(np.diag(np.linalg.inv(-H))), rtol=1e-5)
    cspec, ctruth, Xc, yc = _data("cosine", 300, seed=9)
    cfit = _fit(cspec, Xc, yc, ctruth)
    assert cfit.param_names[:5] == ["gate[0]:const", "gate[0]:angle1", "gate[1]:angle1", "expert[0]:const",
                                    "expert[0]:x1"]
    # the angle of the unit vector (1, 1)/sqrt(2) is pi/4 (the truth's first gate direction)
    assert abs(cfit.theta[1] - np.pi / 4) < 5 * cfit.bse()[1]


def test_gauge_moves_any_parameters_to_the_reference_without_changing_the_likelihood():
    """pack applies the gate's own invariance (Gaussian: the shift that also moves the intercepts); unpack(pack(p))
    has the same log-likelihood as p and the reference entries at zero."""
    rng = np.random.default_rng(10)
    X, y = torch.as_tensor(rng.normal(size=(200, 2))), torch.as_tensor(rng.normal(size=200))
    for gate in ("softmax", "gaussian", "quadratic", "laplace", "cosine", "perturbed_cosine"):
        spec = ms.MoE(gate=gate, k=3, d=2)
        p = ms.Params(rng.normal(size=3), rng.normal(size=(3, 2)), rng.normal(size=(3, 2)), rng.normal(size=3),
                      noise_sd=[0.5, 0.7, 0.9]).to_torch()
        layout = ParamLayout(spec)
        back = layout.unpack(layout.pack(BlockParams.from_params(p)))
        np.testing.assert_allclose(spec.loglik(back.to_params(), X, y), spec.loglik(p, X, y), rtol=1e-12)
        assert back.gate_bias[-1] == 0
        if layout.gauge == "row":
            assert (back.gate_weight[-1] == 0).all()


def test_bad_specs_are_refused_with_the_fix():
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (200, 2))
    y = X[:, 0] + rng.normal(size=200)
    with pytest.raises(ValueError, match="direction is a sign"):
        ms.fit_mle(ms.MoE(gate="cosine", k=2, d=1), X[:, :1], y, method="gradient")
    with pytest.raises(ValueError, match="gate_columns"):
        ms.fit_mle(ms.MoE(gate="laplace", k=2, d=2), X, y, gate_columns=[0])
    with pytest.raises(ValueError, match="gate_solver='newton'"):
        ms.fit_mle(ms.MoE(gate="gaussian", k=2, d=2), X, y, gate_solver="cvxpy")
    with pytest.raises(ValueError, match="method='gradient'"):
        ms.fit_mle(ms.MoE(gate="sigmoid", k=2, d=2, expert="relu"), X, y, method="em")
