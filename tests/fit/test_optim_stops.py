"""The stopping and acceptance rules shared by ``fit._optim``'s Newton and Levenberg-Marquardt loops (issue 21:
their bookkeeping was cut from about 66 to about 44 tensor operations per iteration, each a kernel launch on a GPU,
with the same results): the status precedence of ``_finish_stopped``, the gain test without a separate finiteness
test, the damping vector handed in, which a solve that raises the damping must not change, and L-BFGS's line
search against the plain masked search it replaced."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moestat.fit._optim import ClosureProblem, _damped_solve, _finish_stopped, _gain_accepts, _line_search, _Tracker

CONVERGED, CAP, DAMPING, STALL = 1, 4, 6, 9


def _tracker(A: int) -> _Tracker:
    problem = ClosureProblem(lambda x, rows: x.sum(1), A, "cpu")
    return _Tracker(problem, torch.zeros(A, 2, dtype=torch.float64), max_iter=10, history=False, progress=False,
                    desc="test")


def _reference_status(gn: float, damping: bool, stall: bool, gtol: float, at_cap: bool) -> int:
    """The documented precedence, written out: gradient test, then damping, then stall, then the iteration cap."""
    if gn <= gtol:
        return CONVERGED
    if damping:
        return DAMPING
    if stall:
        return STALL
    return CAP if at_cap else 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1e-12, 1e-10, 1e-3, math.inf, math.nan]), st.booleans(), st.booleans()),
                min_size=1, max_size=6), st.booleans())
def test_status_precedence_is_gradient_then_damping_then_stall_then_cap(rows, at_cap):
    A, gtol, it = len(rows), 1e-10, 7
    max_iter = it if at_cap else it + 5
    gn = torch.tensor([r[0] for r in rows], dtype=torch.float64)
    damping = torch.tensor([r[1] for r in rows])
    stall = torch.tensor([r[2] for r in rows])
    tr = _tracker(A)
    keep = _finish_stopped(tr, it, max_iter, gn, gtol, torch.ones(A, 2, dtype=torch.float64),
                           torch.arange(A, dtype=torch.float64), it, extra=[(damping, DAMPING), (stall, STALL)])
    expected = [_reference_status(r[0], r[1], r[2], gtol, at_cap) for r in rows]
    if not any(expected):
        assert keep is None  # nothing stopped: nothing written, nobody removed
        assert tr.res.status.tolist() == [0] * A
        return
    assert tr.res.status.tolist() == expected
    assert keep.tolist() == [s == 0 for s in expected]
    stopped = torch.tensor([s > 0 for s in expected])
    assert tr.res.n_iter[stopped].tolist() == [it] * int(stopped.sum())  # one count for every active problem
    assert tr.res.loss[stopped].tolist() == [float(a) for a in range(A) if expected[a]]


def test_without_extra_stops_only_the_gradient_test_stops_a_problem_before_the_cap():
    tr = _tracker(3)
    gn = torch.tensor([1e-12, 1.0, 2.0], dtype=torch.float64)
    keep = _finish_stopped(tr, 2, 5, gn, 1e-10, torch.zeros(3, 2, dtype=torch.float64), torch.zeros(3,
                           dtype=torch.float64), torch.tensor([2, 2, 2]))
    assert keep.tolist() == [False, True, True] and tr.res.status.tolist() == [CONVERGED, 0, 0]


finite_or_not = st.one_of(st.floats(min_value=0.0, max_value=1e6), st.sampled_from([math.inf, math.nan]))


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0.0, max_value=1e6), finite_or_not, st.floats(allow_nan=True, allow_infinity=True))
def test_gain_test_refuses_a_nan_or_infinite_trial_objective_without_a_finiteness_test(f, ft, pred):
    """The objective is a mean of squares: ``>= 0``, ``+inf`` or NaN.  For every such trial value the acceptance
    equals the former rule ``isfinite(ft) & (pred > 0) & (rho > 0)``."""
    f_t, ft_t, pred_t = (torch.tensor([v], dtype=torch.float64) for v in (f, ft, pred))
    rho = (f_t - ft_t) / pred_t
    former = torch.isfinite(ft_t) & (pred_t > 0) & (rho > 0)
    assert _gain_accepts(pred_t, rho).tolist() == former.tolist()


@pytest.mark.parametrize("per_problem", [True, False])
def test_a_solve_that_raises_the_damping_leaves_the_callers_vector_alone(per_problem):
    H = -torch.eye(3, dtype=torch.float64).expand(2, 3, 3).clone()  # indefinite: every try raises lambda
    H[1] = torch.eye(3, dtype=torch.float64)
    b = torch.ones(2, 3, dtype=torch.float64)
    lam = torch.full((2,), 1e-3, dtype=torch.float64)
    _, lam_out = _damped_solve(H, b, lam, torch.ones(2, 3, dtype=torch.float64), 5, per_problem=per_problem)
    assert lam.tolist() == [1e-3, 1e-3]
    assert lam_out[0] > 1e-3 and lam_out[1] == 1e-3


def _plain_line_search(problem, theta, f, g, gp, d, gd, t, max_ls, c1):
    """The batched backtracking search written plainly, every problem through every masked write (the loop
    before issue 21's cut): the reference for ``_line_search``."""
    new_theta, new_f, new_g = theta.clone(), f.clone(), g.clone()
    pending = torch.ones(theta.shape[0], dtype=torch.bool)
    for _ in range(max_ls):
        trial = problem.project(theta + t.unsqueeze(1) * d)
        ft, gt = problem.value_grad(trial)
        decrease = (gp * (trial - theta)).sum(1)
        ok = pending & torch.isfinite(ft) & (ft <= f + c1 * decrease)
        new_theta[ok], new_f[ok], new_g[ok] = trial[ok], ft[ok], gt[ok]
        pending &= ~ok
        if not bool(pending.any()):
            break
        denom = 2.0 * (ft - f - t * gd)
        t_q = torch.where(torch.isfinite(ft) & (denom > 0), -gd * t * t / denom, 0.1 * t)
        t = torch.where(pending, torch.minimum(torch.maximum(t_q, 0.1 * t), 0.5 * t), t)
    return new_theta, new_f, new_g, pending


def _bumpy(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rosenbrock's valley plus a ripple, NaN beyond |x_0| > 3 (a trial there must be refused)."""
    val = (1 - x[:, 0]) ** 2 + 10 * (x[:, 1] - x[:, 0] ** 2) ** 2 + 0.3 * torch.sin(5 * x[:, 0])
    return torch.where(x[:, 0].abs() > 3, torch.nan, val)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 6), st.sampled_from([1, 2, 30]), st.floats(0.05, 20.0))
def test_line_search_equals_the_plain_masked_search(seed, A, max_ls, step):
    gen = torch.Generator().manual_seed(seed)
    problem = ClosureProblem(_bumpy, A, "cpu")
    theta = torch.randn(A, 2, dtype=torch.float64, generator=gen)
    f, g = problem.value_grad(theta)
    d = -g + 0.5 * torch.randn(A, 2, dtype=torch.float64, generator=gen)  # some directions point uphill
    gd = (d * g).sum(1)
    t = torch.full((A,), step, dtype=torch.float64)
    got = _line_search(problem, theta, f, g, g, d, gd, t, max_ls, 1e-4)
    want = _plain_line_search(problem, theta, f, g, g, d, gd, t, max_ls, 1e-4)
    for a, b in zip(got[:3], want[:3], strict=True):  # bit for bit; a start in the NaN region stays NaN
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    failed = torch.zeros(A, dtype=torch.bool) if got[3] is None else got[3]
    assert torch.equal(failed, want[3])


def test_line_search_hands_back_the_first_trial_when_every_problem_accepts_it():
    problem = ClosureProblem(lambda x, rows: (x * x).sum(1), 3, "cpu")
    theta = torch.ones(3, 2, dtype=torch.float64)
    f, g = problem.value_grad(theta)
    new_theta, new_f, _, failed = _line_search(problem, theta, f, g, g, -g, -(g * g).sum(1),
                                               torch.full((3,), 0.25, dtype=torch.float64), 5, 1e-4)
    assert failed is None and torch.equal(new_theta, torch.full((3, 2), 0.5, dtype=torch.float64))
    assert torch.equal(new_f, torch.full((3,), 0.5, dtype=torch.float64))
