"""The C++ Newton loop of ``fit_lse(compile=True)`` (``moestat/fit/_newton_native.cpp``) against independent
computations and against the tensor loop (:func:`moestat.fit._optim.newton`).

* Its Hessian and gradient at one point against the autograd reference (the model's own mean formula differentiated
  twice by autograd, :class:`~moestat.fit._objective.ReferenceKernel`), for both gates, every expert with a C++
  form, a temperature, and blocks of observations shorter than the data and than a vector register.
* Whole fits against the tensor loop from the same starts: the same method step by step, summed in another order,
  so the same end points up to rounding wherever either loop converges (``_assert_same_fits``).  Runs that crawl to
  the iteration cap along a curved valley are not compared: there the trust region's accept/reject decisions
  amplify rounding, and the two loops end 1e-5 relative apart in the objective, both unconverged.  Tolerances:
  objectives 1e-9 relative and fitted means 1e-5 (rounding of 1e-16 grown over up to 200 Newton iterations).
  The property-based draws have k <= 2 experts on 300 rows; with k = 3 some draws are ill-posed, with minima in
  valleys so flat that two points that both meet the gradient tolerance differ by 2e-8 relative in the objective
  (softmax gate, sigmoid experts, seed 6682); the fixed cases below have k = 3 and 4.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import moestat as ms
from moestat.fit import _native
from moestat.fit._objective import MeanKernel, ReferenceKernel

pytestmark = pytest.mark.skipif(not _native.compiler_available(), reason="no C++ compiler for the native Newton loop")

NATIVE_EXPERTS = tuple(sorted(_native.ACTIVATION_CODES))  # every family with a C++ form
# The C++ loop is the CPU's: on a GPU host device="auto" is CUDA, where compile=True runs the tensor loop.
CPU = "cpu"


def _data(gate: str, expert: str, k: int, d: int, n: int, reps: int, seed: int, temperature: float = 1.0):
    """A spec (top-K gates keep k - 1 experts) and R replicates of n rows from a random truth."""
    spec = ms.MoE(gate=gate, expert=expert, k=k, d=d, temperature=temperature,
                  top_k=k - 1 if gate == "topk" else None)
    rng = np.random.default_rng(seed)
    truth = ms.Params(rng.normal(size=k), 1.5 * rng.normal(size=(k, d)), rng.normal(size=(k, d)),
                      rng.normal(size=k), noise_sd=np.full(k, 0.1))
    return spec, ms.simulate(spec, truth, n=n, reps=reps, seed=seed)


def _flat(params: ms.Params) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=float).reshape(-1) for _, a in params.blocks()])


def _fits(spec, data, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ms.ConvergenceWarning)
        return [ms.fit_lse(spec, data.X, data.y, device=CPU, compile=c, condition=False, **kwargs)
                for c in (False, True)]


#: a gate parameter above this has saturated the gate (logits of 100 over inputs of order 1)
SATURATED = 100.0


def _largest_gate_parameter(params: ms.Params) -> np.ndarray:
    """The largest absolute gate bias or weight of each restart."""
    gate = np.concatenate([np.abs(np.asarray(params.gate_bias)).reshape(params.n_reps, -1),
                           np.abs(np.asarray(params.gate_weight)).reshape(params.n_reps, -1)], axis=1)
    return gate.max(axis=1)


def _assert_same_fits(spec, data, tensor, native, iter_slack: int = 2, short_run: int = 60, long_run: int = 100
                      ) -> None:
    """Restarts that either loop converged within ``long_run`` iterations end at the same minimum in both: the same
    objective and the same fitted mean at the data (parameters themselves can differ along flat directions, e.g. a
    saturated gate's intercept, 17.56 against 17.84 with the same fit; sigmoid gate and expert, k = 1, seed 162).
    Where both converged within ``short_run`` iterations, the C++ loop needs at most ``iter_slack`` more: it takes
    steps at the rounding floor that the tensor loop may first reject a few times.  Where only one loop converged,
    the other stopped at the rounding floor of the objective with a gradient within 100 gtol (``damping`` or
    ``stall``: no step it could verify, see ``test_step_below_the_rounding_floor``).

    Longer runs crawl along curved valleys, where rounding moves accept/reject decisions: 111 against 122
    iterations to the same minimum (sigmoid gate, k = 1, seed 162), objectives 3.7e-9 apart at two points that both
    meet the gradient tolerance after 174 and 176 iterations, or one loop converging at 192 iterations where the
    other reaches the 200-iteration cap (sigmoid gates at temperature 0.7, k = 2; 3 of 150 draws of k <= 2).

    A gate that saturates (a gate parameter above ``SATURATED`` in either fit) has no finite minimiser: the gate
    sharpens towards a step, the objective falls towards its infimum along that ray, and each loop meets the
    gradient tolerance at its own point of it, so the objectives are compared to 1e-7 relative there (sigmoid gate
    and experts, k = 2, d = 1, seed 287: gate weights 3994 and 3944, objectives 4.1e-9 relative apart)."""
    assert native.settings["newton_loop"] == "native"
    assert "newton_loop" not in tensor.settings
    a, b = tensor.restarts, native.restarts
    # the loops' own stops: fit_lse relabels the best restart's gtol stop "saddle" by its Hessian, and which of two
    # restarts at the same minimum is best is decided by rounding
    stop_a, stop_b = a["status"].replace("saddle", "gtol"), b["status"].replace("saddle", "gtol")
    n_a, n_b = a["n_iter"].to_numpy(), b["n_iter"].to_numpy()
    ca, cb = stop_a.isin(["gtol", "kink"]).to_numpy(), stop_b.isin(["gtol", "kink"]).to_numpy()
    same = (ca & (n_a <= long_run)) | (cb & (n_b <= long_run))
    saturated = np.maximum(_largest_gate_parameter(tensor.restart_params),
                           _largest_gate_parameter(native.restart_params)) > SATURATED
    for rows, rtol in ((same & ~saturated, 1e-9), (same & saturated, 1e-7)):
        np.testing.assert_allclose(b["objective"][rows], a["objective"][rows], rtol=rtol)
    rows = np.flatnonzero(same)
    X = data.X[a["rep"].to_numpy()[rows]]
    mean_a = spec.mean(tensor.restart_params.select(rows), X)
    mean_b = spec.mean(native.restart_params.select(rows), X)
    np.testing.assert_allclose(mean_b, mean_a, rtol=1e-5, atol=1e-5)  # responses of order 1
    short = ca & cb & (n_a <= short_run)
    assert np.all((n_b - n_a)[short] <= iter_slack)
    assert set(stop_a[same & ~ca]) | set(stop_b[same & ~cb]) <= {"damping", "stall"}
    assert (a["grad_norm"][same & ~ca] <= 1e-8).all() and (b["grad_norm"][same & ~cb] <= 1e-8).all()


@pytest.mark.parametrize("gate", ["softmax", "sigmoid", "topk"])
@pytest.mark.parametrize("expert", NATIVE_EXPERTS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_hessian_and_gradient_match_autograd(gate, expert, temperature):
    """The loop's objective, gradient and exact Hessian against torch.func on the model's own mean; the top-K gate
    keeps 2 of 3 experts (the Hessian of the softmax over the kept ones, between changes of the kept set)."""
    k, d, n = 3, 2, 203
    spec, data = _data(gate, expert, k, d, n, reps=1, seed=3, temperature=temperature)
    module = _native.load_newton()
    kernel = MeanKernel.from_spec(spec, compile=True)
    rng = np.random.default_rng(4)
    theta = torch.as_tensor(rng.normal(scale=0.8, size=(2 * k, d + 1)))
    X = torch.cat([torch.ones(n, 1, dtype=torch.float64), torch.as_tensor(data.X[0])], 1)
    y = torch.as_tensor(data.y[0])
    free = torch.ones(2 * k * (d + 1), dtype=torch.bool)
    if gate in ("softmax", "topk"):
        free[(k - 1) * (d + 1) : k * (d + 1)] = False
    free_idx = torch.nonzero(free).squeeze(1)
    r, J, Hx = ReferenceKernel(spec).residual_derivatives(theta[None], X[None], y[None], exact=True)
    H_ref = Hx[0][free_idx][:, free_idx] / n
    b_ref = (J[0].T @ r[0])[free_idx] / n
    # one block; several with a short last one; blocks shorter than a vector register; pair sums in the loop's
    # register tiles (-1: the loop's own threshold, far above these 126 sums) and as BLAS products (0); evaluated
    # twice with one workspace, as in the loop
    for chunk, small_product in [(n, -1), (37, -1), (5, -1), (n, 0), (37, 0)]:
        loss, b, H = module.value_hessian(theta.reshape(-1), X.T.contiguous(), y, free_idx, k,
                                          *_native.gate_args(gate, k, spec.top_k), kernel.native_act,
                                          kernel.act2 is not None, temperature, chunk, small_product, 2)
        assert float(loss) == pytest.approx(float(r.square().mean()), rel=1e-13)
        np.testing.assert_allclose(b, b_ref, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(H, H_ref, rtol=1e-10, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(gate=st.sampled_from(["softmax", "sigmoid"]), expert=st.sampled_from(["linear", "gelu", "tanh", "sigmoid"]),
       k=st.integers(1, 2), d=st.integers(1, 3), boxed=st.booleans(), temperature=st.sampled_from([1.0, 0.7]),
       seed=st.integers(0, 10_000))
def test_fits_match_the_tensor_loop(gate, expert, k, d, boxed, temperature, seed):
    spec, data = _data(gate, expert, k, d, n=300, reps=2, seed=seed, temperature=temperature)
    tensor, native = _fits(spec, data, restarts=2, seed=seed, box=2.0 if boxed else None)
    _assert_same_fits(spec, data, tensor, native)


@pytest.mark.parametrize("case", ["relu", "constant", "held_by_box", "k4_d3", "lapack", "leaky_relu", "softplus",
                                  "celu", "poly2", "poly3", "topk"])
def test_fixed_cases_match_the_tensor_loop(case):
    gate, expert, k, d, box = {"relu": ("softmax", "relu", 2, 2, None), "constant": ("sigmoid", "constant", 3, 2, None),
                               "held_by_box": ("softmax", "linear", 3, 2, 0.6),
                               "k4_d3": ("sigmoid", "gelu", 4, 3, None),
                               "lapack": ("sigmoid", "tanh", 3, 32, None),  # 198 free: LAPACK's Cholesky
                               "leaky_relu": ("sigmoid", "leaky_relu", 2, 2, None),
                               # k = 2: at k = 3 these data's softplus fits crawl 95-175 iterations to gtol
                               "softplus": ("softmax", "softplus", 2, 2, None),
                               "celu": ("sigmoid", "celu", 2, 2, None),
                               "poly2": ("softmax", "poly2", 2, 2, None),
                               "poly3": ("sigmoid", "poly3", 2, 1, None),
                               "topk": ("topk", "gelu", 4, 2, None)}[case]  # keeps 3 of 4
    spec, data = _data(gate, expert, k, d, n=400, reps=2, seed=11)
    tensor, native = _fits(spec, data, restarts=3, seed=5, box=box)
    _assert_same_fits(spec, data, tensor, native)
    # the saddle check's curvature, from the C++ loop's own Hessian (native_hessians): the same smallest eigenvalue
    stopped = ["gtol", "saddle", "kink"]
    both = np.isin(tensor.status, stopped) & np.isin(native.status, stopped)
    assert both.any()
    np.testing.assert_allclose(native.hessian_min_eig[both], tensor.hessian_min_eig[both], rtol=1e-6, atol=1e-10)
    if case == "held_by_box":  # coordinates held on the box during the steps: the held-coordinate path ran
        assert native.restarts["hit_bound"].all()
    if case == "lapack":  # two of the six restarts converge (the others stall on the 400 rows' flat valleys)
        assert (native.restarts["status"] == "gtol").sum() >= 2
    if case == "relu":  # kink certificates are the caller's, from the native end points
        assert set(native.restarts["status"]) == set(tensor.restarts["status"])


def test_step_below_the_rounding_floor():
    """A softmax problem whose last Newton step (gradient 1.3e-10 to 1e-14, gtol 1e-10) predicts a decrease of the
    objective below its rounding error: the loop takes the step since the objective did not rise beyond that error,
    and converges, instead of rejecting it on a gain ratio that is rounding noise until the damping stop (status
    ``damping`` at 77 iterations without that rule)."""
    spec = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
    rng = np.random.default_rng(0)  # the truth of benchmarks/lse_vs_scipy.py's (d, k, n) = (1, 2, 500) cell
    truth = ms.Params(gate_bias=rng.normal(size=2), gate_weight=2.0 * rng.normal(size=(2, 1)),
                      expert_weight=2.0 * rng.normal(size=(2, 1)), expert_bias=np.linspace(-2.0, 2.0, 2)
                      ).normalize_softmax(-1)
    data = ms.simulate(spec, truth, n=500, reps=2, seed=1, inputs="gaussian")
    starts = ms.fit.init.kmeans_init(spec, data.X, data.y, 3, seed=2)
    fit = ms.fit_lse(spec, data.X, data.y, device=CPU, init=starts, restarts=3, condition=False, compile=True)
    assert (fit.restarts["status"] == "gtol").all()
    assert (fit.restarts["grad_norm"] <= 1e-10).all()


def test_threads_give_the_same_bits():
    spec, data = _data("sigmoid", "gelu", 3, 2, n=300, reps=3, seed=8)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        fits = [ms.fit_lse(spec, data.X, data.y, device=CPU, restarts=3, seed=1, compile=True, threads=t)
                for t in (1, None)]
    finally:
        torch.set_num_threads(old)
    np.testing.assert_array_equal(_flat(fits[0].restart_params), _flat(fits[1].restart_params))
    np.testing.assert_array_equal(fits[0].restarts["n_iter"], fits[1].restarts["n_iter"])


def test_native_blocks_of_replicates(monkeypatch):
    """With ``block_bytes="auto"`` the C++ loop takes replicates in blocks of NATIVE_NEWTON_BLOCK_BYTES of inputs (the
    8 MiB cache blocks of the tensor loop would hand its threads a few problems per call); an explicit ``block_bytes``
    still bounds a call.  The fits do not depend on the blocks."""
    import moestat.fit.lse as lse

    spec, data = _data("softmax", "gelu", 3, 2, n=200, reps=5, seed=3)
    per_replicate = 200 * 3 * 8  # n (d + 1) float64 bytes
    monkeypatch.setattr(lse, "NATIVE_NEWTON_BLOCK_BYTES", 2 * per_replicate)
    calls = []
    real = _native.load_newton()

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def newton(self, theta, *args):
            calls.append(theta.shape[0])
            return real.newton(theta, *args)

    monkeypatch.setattr(lse._native, "load_newton", lambda: Spy())
    fits = {}
    for block in ("auto", per_replicate, None):
        calls.clear()
        fits[block] = ms.fit_lse(spec, data.X, data.y, device=CPU, restarts=2, seed=1, compile=True, block_bytes=block)
        assert fits[block].settings["newton_loop"] == "native"
        assert calls == {"auto": [4, 4, 2], per_replicate: [2] * 5, None: [10]}[block]
    for block in ("auto", per_replicate):
        np.testing.assert_array_equal(_flat(fits[block].restart_params), _flat(fits[None].restart_params))


@pytest.mark.parametrize("option", ["history", "progress", "cosine", "poly4", "learn_temperature", "eager"])
def test_tensor_loop_where_the_native_one_does_not_apply(option):
    gate = {"cosine": "cosine", "learn_temperature": "laplace"}.get(option, "softmax")
    expert = "poly4" if option == "poly4" else "linear"  # degree 4: no C++ form (NATIVE_POLY_DEGREES)
    spec = ms.MoE(gate=gate, expert=expert, k=3, d=2)
    _, data = _data("softmax", "linear", 3, 2, n=200, reps=1, seed=2)
    kwargs = {"history": option == "history", "progress": option == "progress",
              "learn_temperature": option == "learn_temperature", "compile": option != "eager"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ms.fit_lse(spec, data.X, data.y, device=CPU, seed=0, max_iter=5, condition=False, **kwargs)
    assert fit.settings["optimizer"] == "newton"
    assert "newton_loop" not in fit.settings


def test_float32():
    spec, data = _data("softmax", "tanh", 2, 2, n=400, reps=2, seed=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ms.ConvergenceWarning)
        f64 = ms.fit_lse(spec, data.X, data.y, device=CPU, restarts=2, seed=3, compile=True)
        f32 = ms.fit_lse(spec, data.X, data.y, device=CPU, restarts=2, seed=3, compile=True, dtype="float32", gtol=1e-5)
    assert f32.settings["newton_loop"] == "native" and f32.settings["dtype"] == "float32"
    # float32 rounding (1e-7 relative) of an objective of about 0.01 whose minimum is well separated
    np.testing.assert_allclose(f32.objective, f64.objective, rtol=1e-4)
