"""fit_mle's memory budget: blocks of (replicate, restart) problems give the unblocked fit (issue 21), and the bar."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import moestat as ms
from moestat.exceptions import MoestatWarning
from moestat.fit import mle as mle_mod
from moestat.fit._layout import ParamLayout
from moestat.fit.mle import MEMORY_BUDGET, MemoryModel, memory_bytes
from tests.torch_memory import torch_peak

ROOT = Path(__file__).resolve().parents[2]
SPEC = ms.MoE(gate="softmax", expert="linear", k=3, d=2)
TRUTH = ms.Params([0.5, 0.0, -0.5], [[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]], [[1.0, 0.5], [-1.0, 0.0], [0.0, 1.0]],
                  [0.5, -0.5, 0.0], noise_sd=[0.3, 0.3, 0.3])
N, R, RESTARTS = 300, 3, 4  # 12 problems: blocks of 1, 2, 3, 5 and 12 problems split replicates' restarts


def _data():
    return ms.simulate(SPEC, TRUTH, n=N, reps=R, seed=1, model="mixture")


def _budget(A: int, phase: str = "em") -> int:
    """The smallest budget whose blocks hold ``A`` problems (the hand inversion of problems_per_block)."""
    m = MemoryModel.of(SPEC, ParamLayout(SPEC), R, N, weighted=False, trials=False)
    return int(np.ceil(m.fixed + A * N * getattr(m, phase)))


# ------------------------------------------------------------------------------------------ budget parsing
@pytest.mark.parametrize(("value", "expected"), [("2GB", 2 * 10**9), ("512MiB", 512 * 2**20), (" 1.5 kb", 1500),
                                                 ("3e3", 3000), (4096, 4096), (None, None), ("1gib", 2**30)])
def test_memory_budget_strings_and_numbers(value, expected):
    assert memory_bytes(value) == expected


@pytest.mark.parametrize(("value", "error"), [("2 parsecs", ValueError), ("GB", ValueError), (0, ValueError),
                                              (-5, ValueError), ("0.1B", ValueError), (True, TypeError),
                                              ([1], TypeError)])
def test_bad_memory_budget_is_named(value, error):
    with pytest.raises(error, match="memory_budget"):
        ms.fit_mle(SPEC, _data().X[0], _data().y[0], memory_budget=value)


def test_default_budget_keeps_the_issue_workload_under_a_gigabyte():
    # the issue's workload: 20 replicates x 5 starts x 20,000 observations at d = 4 (k = 3), by the model's arithmetic
    spec = ms.MoE(gate="softmax", expert="linear", k=3, d=4)
    n, reps = 20_000, 20
    m = MemoryModel.of(spec, ParamLayout(spec), reps, n, weighted=False, trials=False)
    budget = memory_bytes(MEMORY_BUDGET)
    assert budget == 10**9
    for phase in ("em", "lbfgs"):
        A = m.problems_per_block(budget, n, reps * 5, phase)
        assert 1 <= A < reps * 5  # it does block (unblocked it would need ~2 GB, docs/performance.md)
        assert m.fixed + A * n * getattr(m, phase) <= budget
        assert m.fixed + (A + 1) * n * getattr(m, phase) > budget  # and takes as many problems as fit


# ------------------------------------------------------------------------------------------ blocks are sized
def test_blocks_are_sized_from_the_budget(monkeypatch):
    sizes = []
    real = mle_mod.em_fit

    def spy(spec, X, *args, **kwargs):
        sizes.append(int(X.shape[0]))
        return real(spec, X, *args, **kwargs)

    monkeypatch.setattr(mle_mod, "em_fit", spy)
    d = _data()
    ms.fit_mle(SPEC, d.X, d.y, restarts=RESTARTS, seed=5, memory_budget=_budget(5))
    assert sizes == [5, 5, 2]  # 12 problems, 5 per block: blocks cut through replicates' restarts
    sizes.clear()
    ms.fit_mle(SPEC, d.X, d.y, restarts=RESTARTS, seed=5, memory_budget=None)
    assert sizes == [12]


def test_a_budget_below_one_problem_warns_and_fits_one_at_a_time(monkeypatch):
    sizes = []
    real = mle_mod.em_fit
    monkeypatch.setattr(mle_mod, "em_fit", lambda spec, X, *a, **kw: sizes.append(int(X.shape[0])) or real(spec, X, *a,
                                                                                                           **kw))
    d = _data()
    with pytest.warns(MoestatWarning, match="memory_budget=1000 bytes"):
        fit = ms.fit_mle(SPEC, d.X[0], d.y[0], restarts=2, seed=5, memory_budget=1000)
    assert sizes == [1, 1]
    assert fit.settings["memory_budget"] == 1000


# ------------------------------------------------------------------------------------------ same fit, every budget
_SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import numpy as np, torch
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    import test_mle_blocks as t
    import moestat as ms
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    d = t._data()
    worst = {{}}
    for name, kw, phase in [("em", {{}}, "em"), ("pure em", {{"switch_after": None}}, "em"),
                            ("gradient", {{"method": "gradient"}}, "lbfgs")]:
        ref = ms.fit_mle(t.SPEC, d.X, d.y, restarts=t.RESTARTS, seed=5, memory_budget=None, device="cpu", **kw)
        for A in (1, 2, 3, 5):
            f = ms.fit_mle(t.SPEC, d.X, d.y, restarts=t.RESTARTS, seed=5, memory_budget=t._budget(A, phase),
                           device="cpu", **kw)
            diffs = [np.abs(np.asarray(getattr(f.params, a)) - np.asarray(getattr(ref.params, a))).max()
                     for a in ("gate_bias", "gate_weight", "expert_weight", "expert_bias", "noise_sd")]
            same = (np.array_equal(f.glance()["best_restart"], ref.glance()["best_restart"])
                    and np.array_equal(f.n_iter, ref.n_iter)
                    and np.array_equal(f.converged, ref.converged)
                    and (f.history is None or np.array_equal(f.history, ref.history))
                    and np.allclose(f.tidy()["std_error"], ref.tidy()["std_error"], rtol=1e-10, atol=0, equal_nan=True))
            worst[f"{{name}}, A={{A}}"] = [float(max(diffs)), float(np.abs(f.loglik - ref.loglik).max()),
                                        float(np.abs(f.restart_loglik - ref.restart_loglik).max()), bool(same)]
    print(json.dumps(worst))
""")


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="MKL_CBWR (reproducible BLAS) is an MKL setting")
def test_blocks_give_the_unblocked_fit_exactly_with_reproducible_blas():
    # MKL's GEMM results depend on the memory alignment of their operands (Intel's "conditional numerical
    # reproducibility"), and a problem's rows sit at different offsets in different blocks; MKL_CBWR=AUTO,STRICT
    # makes them alignment-independent, and then blocks change no bit of any problem's arithmetic: every block size
    # (one problem, blocks splitting a replicate's restarts) gives the unblocked fit to 1e-10
    env = {**os.environ, "MKL_CBWR": "AUTO,STRICT", "OMP_NUM_THREADS": "1"}
    script = _SCRIPT.format(root=str(ROOT), tests=str(Path(__file__).parent))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    worst = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(worst) == 12
    for case, (params, loglik, restart_loglik, same) in worst.items():
        assert params <= 1e-10 and loglik <= 1e-10 and restart_loglik <= 1e-10, case
        assert same, case  # best restart, iterations, convergence, EM histories and standard errors identical


@pytest.mark.parametrize("method", ["em", "gradient"])
def test_blocks_give_the_same_maxima_with_default_blas(method):
    # without MKL_CBWR the same arithmetic rounds differently at other memory offsets (1e-14 relative per product);
    # the optimisers then stop at slightly different points: log-likelihoods agree to the stopping rule (EM: 1e-8
    # relative change; L-BFGS: 1e-10 relative decrease), coefficients along flat directions of the likelihood to 1e-3
    d = _data()
    phase = "em" if method == "em" else "lbfgs"
    ref = ms.fit_mle(SPEC, d.X, d.y, restarts=RESTARTS, seed=5, method=method, memory_budget=None)
    for A in (1, 5):
        f = ms.fit_mle(SPEC, d.X, d.y, restarts=RESTARTS, seed=5, method=method, memory_budget=_budget(A, phase))
        np.testing.assert_allclose(f.restart_loglik, ref.restart_loglik, rtol=1e-8)
        np.testing.assert_array_equal(f.glance()["best_restart"], ref.glance()["best_restart"])
        np.testing.assert_allclose(np.asarray(f.params.expert_weight), np.asarray(ref.params.expert_weight), atol=1e-3)
        # inference is unchanged: standard errors at the (nearly) same estimate, to the estimate's agreement
        np.testing.assert_allclose(f.tidy()["std_error"], ref.tidy()["std_error"], rtol=1e-3)


def test_user_starts_and_random_starts_split_across_blocks():
    # a user start (the truth) first, then random ones: problems 0, 5, 10 are user starts, in different blocks
    d = _data()
    ref = ms.fit_mle(SPEC, d.X, d.y, init=TRUTH, restarts=4, seed=5, memory_budget=None, switch_after=None)
    f = ms.fit_mle(SPEC, d.X, d.y, init=TRUTH, restarts=4, seed=5, memory_budget=_budget(4), switch_after=None)
    assert f.restart_loglik.shape == (R, 5)
    np.testing.assert_allclose(f.restart_loglik, ref.restart_loglik, rtol=1e-8)  # as above: EM's stopping rule
    np.testing.assert_array_equal(f.n_iter, ref.n_iter)


# ------------------------------------------------------------------------------------------ the estimate bounds memory
@pytest.mark.parametrize("method", ["em", "gradient"])
def test_the_estimate_bounds_the_measured_growth_per_problem(method):
    # the torch peak of an unblocked fit grows by about b bytes per observation and problem; the model's b must not
    # be below it (it is an upper estimate; measured 0.4-0.9 of it in docs/performance.md), nor absurdly above (4x)
    spec = ms.MoE(gate="softmax", expert="linear", k=3, d=4)
    rng = np.random.default_rng(0)
    truth = ms.Params(rng.normal(size=3), rng.normal(size=(3, 4)), rng.normal(size=(3, 4)), rng.normal(size=3),
                      noise_sd=np.full(3, 0.3))
    n = 1500
    # device="cpu": the profiler below measures the CPU allocator (on a GPU the fit's tensors live elsewhere)
    kw = {"restarts": 2, "seed": 2, "method": method, "memory_budget": None, "max_iter": 200 if method == "em" else 40,
          "device": "cpu"}
    if method == "em":
        kw["switch_after"] = None
    peaks = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for reps in (1, 5):
            data = ms.simulate(spec, truth, n=n, reps=reps, seed=1, model="mixture")
            peaks[reps] = torch_peak(lambda data=data: ms.fit_mle(spec, data.X, data.y, **kw))
    growth = (peaks[5] - peaks[1]) / (8 * n)
    m = MemoryModel.of(spec, ParamLayout(spec), 1, n, weighted=False, trials=False)
    b = m.em if method == "em" else m.lbfgs
    assert growth <= b <= 4 * growth


# ------------------------------------------------------------------------------------------ progress
def test_progress_bar_counts_problems(capsys):
    d = _data()
    ms.fit_mle(SPEC, d.X, d.y, restarts=RESTARTS, seed=5, memory_budget=_budget(5), progress=True)
    err = capsys.readouterr().err
    # the count is the contract; the phase text after it ("EM, block ...") is redrawn at tqdm's refresh interval,
    # so whether a given phase shows up in the captured output depends on timing and is not asserted
    # (and the bar clears itself when done, so the last count drawn depends on timing too)
    assert "fit_mle" in err and re.search(r"\b\d+/12 problems done", err)
    ms.fit_mle(SPEC, d.X, d.y, restarts=RESTARTS, seed=5, progress=False)
    assert "problems done" not in capsys.readouterr().err


def test_progress_must_be_boolean_or_none():
    d = _data()
    with pytest.raises(TypeError, match="progress"):
        ms.fit_mle(SPEC, d.X[0], d.y[0], progress="yes")
