// EM for Gaussian, Poisson and binomial experts (shared slopes allowed) with a softmax gate, one fused loop per
// (replicate, restart) pair
// (moestat/fit/_native.py builds it; moestat/fit/em.py calls it with compile=True).  The L-BFGS phase that follows
// EM, _mle_lbfgs_native.cpp, is inserted at the @MLE_LBFGS@ marker and built into the same extension.
//
// The iteration is em_fit's tensor loop (moestat/fit/em.py), written for one pair at a time so that a pair's
// arrays (k x n) stay in cache and no tensor operation is dispatched per step:
//   E-step      c_jt = log pi_j(x_t) - (y_t - mu_jt)^2 / (2 var_j) - log(2 pi var_j) / 2,
//               lse_t = log sum_j exp(c_jt), tau_jt = exp(c_jt - lse_t), l = sum_t w_t lse_t;
//   stopping    |l - l_prev| <= tol (1 + |l|), tested after EM steps only (not after a SQUAREM jump);
//   experts     Gaussian: (sum_t w tau z z' + eps I) beta_j = sum_t w tau z y + eps beta_j,
//               var_j = max((sum_t w tau r^2 + eps var_j) / (sum_t w tau + eps), floor);
//               Poisson and binomial (canonical links, trials m, offset o): one proximal Newton (IRLS) step on
//               sum_t w tau m [y eta - b(eta)] - eps/2 |beta - beta_old|^2, halving up to 29 times, never lowering
//               it (the full step taken unchecked when its predicted gain is below 64 ulps of the terms), as
//               glm_expert_step in em.py; the E-step's log density is m [y eta - b(eta)] + c_t, with the constant
//               c_t (-log y!, log C(m, m y)) computed once by the caller;
//   shared      slopes common to all experts: em.py's shared_newton_step (a joint Newton step through the Schur
//               complement; Gaussian: the full step, then the variances; GLM: halved until Q does not fall);
//   gate        damped Newton (IRLS) steps on sum_t sum_j w tau log pi_j, halving up to 11 times, never lowering it;
//   SQUAREM     scheme S3 every three iterations, a jump refused where it lowers l below l(theta_1).
// Linear systems are solved by Cholesky (the proximal Gram matrix and the damped gate Hessian are positive
// definite); a system that is not (NaN data) gives NaN parameters, a non-finite l, and the pair stops unconverged.
#include <ATen/ATen.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using V = at::vec::Vectorized<double>;
constexpr int64_t W = V::size();
constexpr double HALF_LOG_2PI = 0.918938533204672741780329736406;
constexpr double NaN = std::numeric_limits<double>::quiet_NaN();
constexpr double INF = std::numeric_limits<double>::infinity();
constexpr int LINE_SEARCH = 12;  // step sizes 1, 1/2, ..., 2^-11, as _LINE_SEARCH in em.py
constexpr int MAX_HALVINGS = 30;  // GLM expert steps 1, 1/2, ..., 2^-29, as families._MAX_HALVINGS
constexpr double ROUNDING = 64.0;  // families._ROUNDING
enum Family : int64_t { GAUSSIAN = 0, POISSON = 1, BINOMIAL = 2 };

// b(eta): exp(eta) (Poisson) or log(1 + exp(eta)) = max(eta, 0) + log1p(exp(-|eta|)) (binomial)
inline V cumulant(int64_t family, const V& eta) {
  if (family == POISSON) return eta.exp();
  return at::vec::maximum(eta, V(0.0)) + (V(0.0) - eta.abs()).exp().log1p();
}

// the mean g^-1(eta) and the variance function V(mu)
inline V mean_of(int64_t family, const V& eta) {
  if (family == POISSON) return eta.exp();
  return V(1.0) / (V(1.0) + (V(0.0) - eta).exp());
}

double hsum(const V& v) {
  double buf[W];
  v.store(buf);
  double s = 0.0;
  for (int64_t i = 0; i < W; ++i) s += buf[i];
  return s;
}

// sum_t a_t b_t c_t (c may be null: sum_t a_t b_t)
double dot3(const double* a, const double* b, const double* c, int64_t n) {
  V acc(0.0);
  for (int64_t t = 0; t < n; t += W) {
    const int64_t m = std::min<int64_t>(W, n - t);
    V x = V::loadu(a + t, m) * V::loadu(b + t, m);
    if (c != nullptr) x = x * V::loadu(c + t, m);
    acc = acc + x;
  }
  return hsum(acc);
}

// Solve A x = b for a symmetric positive definite A (m x m, row-major, overwritten by its Cholesky factor);
// b is overwritten by x.  Not positive definite: x = NaN.
void chol_solve(double* A, double* b, int64_t m) {
  for (int64_t j = 0; j < m; ++j) {
    double d = A[j * m + j];
    for (int64_t l = 0; l < j; ++l) d -= A[j * m + l] * A[j * m + l];
    if (!(d > 0.0)) {
      std::fill(b, b + m, NaN);
      return;
    }
    d = std::sqrt(d);
    A[j * m + j] = d;
    for (int64_t i = j + 1; i < m; ++i) {
      double s = A[i * m + j];
      for (int64_t l = 0; l < j; ++l) s -= A[i * m + l] * A[j * m + l];
      A[i * m + j] = s / d;
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    double s = b[i];
    for (int64_t l = 0; l < i; ++l) s -= A[i * m + l] * b[l];
    b[i] = s / A[i * m + i];
  }
  for (int64_t i = m - 1; i >= 0; --i) {
    double s = b[i];
    for (int64_t l = i + 1; l < m; ++l) s -= A[l * m + i] * b[l];
    b[i] = s / A[i * m + i];
  }
}

// f(b) for b = 0, ..., B-1, each (replicate, restart) pair going to a thread as the thread becomes free: runs differ
// in length, and equal contiguous shares would leave threads idle.  A pair's result does not depend on its thread.
template <class F>
void each_pair(int64_t B, F f) {
  std::atomic<int64_t> next{0};
  const int64_t teams = std::min<int64_t>(B, at::get_num_threads());
  at::parallel_for(0, teams, 1, [&](int64_t, int64_t) {
    for (int64_t b = next++; b < B; b = next++) f(b);
  });
}

struct Pair {
  // data (views into the batch)
  const double* y;   // n
  const double* w;   // n or null (case weights)
  const double* Zg;  // pg x n, first row the intercept
  const double* Ze;  // pe x n
  const double* m;    // n or null (binomial trials)
  const double* off;  // n or null (GLM offset)
  const double* cst;  // n or null (GLM log-density constant)
  const double* Zs;   // q x n or null (shared covariates, no intercept)
  int64_t q = 0;
  int64_t n, k, km1, pg, pe, family;
  double floor, eps;
  // parameters
  std::vector<double> tg, beta, var, gamma;  // (k-1) x pg, k x pe, k (Gaussian), q (shared)
  // work arrays
  std::vector<double> logw, resid, tau, lw1, tw, mu, etac;  // k x n each (resid holds eta for GLM experts)
  bool resid_valid = false;

  // log gate weights (k x n) of the gate rows th ((k-1) x pg; reference expert k-1 has logit 0)
  void gate_log_weights(const double* th, double* out) const {
    for (int64_t j = 0; j < km1; ++j) {
      double* row = out + j * n;
      std::fill(row, row + n, 0.0);
      for (int64_t a = 0; a < pg; ++a) {
        const V c(th[j * pg + a]);
        const double* z = Zg + a * n;
        for (int64_t t = 0; t < n; t += W) {
          const int64_t m = std::min<int64_t>(W, n - t);
          (V::loadu(row + t, m) + c * V::loadu(z + t, m)).store(row + t, m);
        }
      }
    }
    double* ref = out + km1 * n;
    for (int64_t t = 0; t < n; t += W) {
      const int64_t m = std::min<int64_t>(W, n - t);
      V mx(0.0);
      for (int64_t j = 0; j < km1; ++j) mx = at::vec::maximum(mx, V::loadu(out + j * n + t, m));
      V s = (V(0.0) - mx).exp();
      for (int64_t j = 0; j < km1; ++j) s = s + (V::loadu(out + j * n + t, m) - mx).exp();
      const V lse = s.log() + mx;
      for (int64_t j = 0; j < km1; ++j) (V::loadu(out + j * n + t, m) - lse).store(out + j * n + t, m);
      (V(0.0) - lse).store(ref + t, m);
    }
  }

  // E-step: tau (k x n, unweighted), returns l
  double e_step() {
    if (!resid_valid) {
      for (int64_t j = 0; j < k; ++j) expert_residual(j);
      resid_valid = true;
    }
    if (family != GAUSSIAN) return e_step_glm();
    std::vector<double> cst(k);
    for (int64_t j = 0; j < k; ++j) cst[j] = 0.5 * std::log(var[j]) + HALF_LOG_2PI;
    V acc(0.0);
    const V half(-0.5);
    for (int64_t t = 0; t < n; t += W) {
      const int64_t m = std::min<int64_t>(W, n - t);
      V c[64];
      for (int64_t j = 0; j < k; ++j) {
        const V r = V::loadu(resid.data() + j * n + t, m);
        c[j] = V::loadu(logw.data() + j * n + t, m) + ((half * (r * r)) / V(var[j]) - V(cst[j]));
      }
      acc = acc + normalise(c, t, m);
    }
    return hsum(acc);
  }

  // From the log joint densities c[j] of one block of observations (t, t + cnt): the responsibilities into tau and
  // the block's (case-weighted) log normalisers, zero beyond cnt.
  V normalise(V* c, int64_t t, int64_t cnt) {
    V mx(-INF);
    for (int64_t j = 0; j < k; ++j) mx = at::vec::maximum(mx, c[j]);
    mx = V::blendv(mx, V(0.0), mx.abs() == V(INF));  // an infinite maximum shifts by 0, as torch.logsumexp
    V s(0.0);
    for (int64_t j = 0; j < k; ++j) {
      c[j] = (c[j] - mx).exp();
      s = s + c[j];
    }
    V lse = s.log() + mx;
    for (int64_t j = 0; j < k; ++j) (c[j] / s).store(tau.data() + j * n + t, cnt);
    if (w != nullptr) lse = lse * V::loadu(w + t, cnt);
    return cnt < W ? V::set(V(0.0), lse, cnt) : lse;
  }

  // Gaussian: r = y - beta_j z; GLM: eta = beta_j z + o (into resid)
  void expert_residual(int64_t j) { linear_predictor(beta.data() + j * pe, resid.data() + j * n); }

  void linear_predictor(const double* b, double* out) const { linear_predictor(b, gamma.data(), out); }

  void linear_predictor(const double* b, const double* g, double* out) const {
    for (int64_t t = 0; t < n; t += W) {
      const int64_t c = std::min<int64_t>(W, n - t);
      V eta(0.0);
      for (int64_t a = 0; a < pe; ++a) eta = eta + V(b[a]) * V::loadu(Ze + a * n + t, c);
      for (int64_t a = 0; a < q; ++a) eta = eta + V(g[a]) * V::loadu(Zs + a * n + t, c);
      if (family == GAUSSIAN) eta = V::loadu(y + t, c) - eta;
      else if (off != nullptr) eta = eta + V::loadu(off + t, c);
      eta.store(out + t, c);
    }
  }

  // m [y eta - b(eta)] at one block of eta
  V kernel(const V& eta, const V& yv, const V& bv, int64_t t, int64_t c) const {
    V kern = yv * eta - bv;
    if (m != nullptr) kern = V::loadu(m + t, c) * kern;
    return kern;
  }

  double e_step_glm() {
    V acc(0.0);
    for (int64_t t = 0; t < n; t += W) {
      const int64_t c = std::min<int64_t>(W, n - t);
      const V yv = V::loadu(y + t, c);
      const V cv = cst == nullptr ? V(0.0) : V::loadu(cst + t, c);
      V lc[64];
      for (int64_t j = 0; j < k; ++j) {
        const V eta = V::loadu(resid.data() + j * n + t, c);
        const V muv = mean_of(family, eta);
        muv.store(mu.data() + j * n + t, c);
        const V bv = family == POISSON ? muv : cumulant(family, eta);
        lc[j] = V::loadu(logw.data() + j * n + t, c) + (kernel(eta, yv, bv, t, c) + cv);
      }
      acc = acc + normalise(lc, t, c);
    }
    return hsum(acc);
  }

  // sum_t tw_t m_t [y_t eta_t - b(eta_t)] and sum_t |...| for one expert (b from mu when given: Poisson)
  void glm_objective(const double* twj, const double* eta, const double* muj, double& q, double& scale) const {
    V acc(0.0), aacc(0.0);
    for (int64_t t = 0; t < n; t += W) {
      const int64_t c = std::min<int64_t>(W, n - t);
      const V e = V::loadu(eta + t, c);
      const V bv = muj != nullptr ? V::loadu(muj + t, c) : cumulant(family, e);
      const V term = V::loadu(twj + t, c) * kernel(e, V::loadu(y + t, c), bv, t, c);
      acc = acc + (c < W ? V::set(V(0.0), term, c) : term);
      aacc = aacc + (c < W ? V::set(V(0.0), term.abs(), c) : term.abs());
    }
    q = hsum(acc);
    scale = hsum(aacc);
  }

  void glm_expert_step(const double* tw_) {
    std::vector<double> wm(n), H(pe * pe), grad(pe), delta(pe), cand(pe), b0(pe);
    for (int64_t j = 0; j < k; ++j) {
      const double* twj = tw_ + j * n;
      double* eta = resid.data() + j * n;
      const double* muj = mu.data() + j * n;
      double q, scale;
      glm_objective(twj, eta, family == POISSON ? muj : nullptr, q, scale);
      for (int64_t t = 0; t < n; ++t) wm[t] = m == nullptr ? twj[t] : twj[t] * m[t];
      std::vector<double> r(n), v(n);
      for (int64_t t = 0; t < n; ++t) {
        r[t] = wm[t] * (y[t] - muj[t]);
        v[t] = wm[t] * (family == POISSON ? muj[t] : muj[t] * (1.0 - muj[t]));
      }
      for (int64_t a = 0; a < pe; ++a) {
        grad[a] = dot3(r.data(), Ze + a * n, nullptr, n);
        for (int64_t b = 0; b <= a; ++b) {
          const double h = dot3(v.data(), Ze + a * n, Ze + b * n, n);
          H[a * pe + b] = H[b * pe + a] = h;
        }
        H[a * pe + a] += eps;
      }
      delta = grad;
      chol_solve(H.data(), delta.data(), pe);
      bool ok = true;
      double gd = 0.0;
      for (int64_t a = 0; a < pe; ++a) {
        ok = ok && std::isfinite(delta[a]);
        gd += grad[a] * delta[a];
      }
      if (!ok || !std::isfinite(q)) continue;  // the expert stays put
      bool unmeasurable = gd <= ROUNDING * std::numeric_limits<double>::epsilon() * scale;
      std::copy(beta.begin() + j * pe, beta.begin() + (j + 1) * pe, b0.begin());
      double step = 1.0;
      for (int h = 0; h < MAX_HALVINGS; ++h, step *= 0.5) {
        double pen = 0.0;
        for (int64_t a = 0; a < pe; ++a) {
          cand[a] = b0[a] + step * delta[a];
          pen += (cand[a] - b0[a]) * (cand[a] - b0[a]);
        }
        linear_predictor(cand.data(), etac.data());
        double qc, sc;
        glm_objective(twj, etac.data(), nullptr, qc, sc);
        qc -= 0.5 * eps * pen;
        if (std::isfinite(qc) && (qc >= q || unmeasurable)) {
          std::copy(cand.begin(), cand.end(), beta.begin() + j * pe);
          std::copy(etac.begin(), etac.begin() + n, eta);
          break;
        }
        unmeasurable = false;  // only the full step is taken unmeasured
      }
    }
  }

  // responsibilities times case weights, into tw
  const double* weighted_tau() {
    if (w == nullptr) return tau.data();
    for (int64_t j = 0; j < k; ++j)
      for (int64_t t = 0; t < n; ++t) tw[j * n + t] = tau[j * n + t] * w[t];
    return tw.data();
  }

  void expert_step(const double* tw_) {
    std::vector<double> G(pe * pe), rhs(pe);
    for (int64_t j = 0; j < k; ++j) {
      const double* tj = tw_ + j * n;
      for (int64_t a = 0; a < pe; ++a) {
        for (int64_t b = 0; b <= a; ++b) {
          const double g = dot3(tj, Ze + a * n, Ze + b * n, n);
          G[a * pe + b] = G[b * pe + a] = g;
        }
        G[a * pe + a] += eps;
        rhs[a] = dot3(tj, Ze + a * n, y, n) + eps * beta[j * pe + a];
      }
      chol_solve(G.data(), rhs.data(), pe);
      for (int64_t a = 0; a < pe; ++a) beta[j * pe + a] = rhs[a];
      expert_residual(j);
      const double* r = resid.data() + j * n;
      const double ssq = dot3(tj, r, r, n);
      V acc(0.0);
      for (int64_t t = 0; t < n; t += W) {
        const int64_t m = std::min<int64_t>(W, n - t);
        acc = acc + V::loadu(tj + t, m);
      }
      var[j] = std::max((ssq + eps * var[j]) / (hsum(acc) + eps), floor);
    }
    resid_valid = true;
  }

  // Shared slopes (em.shared_newton_step): one joint Newton step on every expert's coefficients and gamma, solved
  // through the Schur complement of the block-diagonal part; Gaussian experts (ECM weights w tau var_min / var_j)
  // take the full step, then their variances; GLM experts halve it (t = 1, ..., 2^-29) until Q does not fall.
  void shared_step(const double* tw_) {
    const bool gauss = family == GAUSSIAN;
    double vmin = INF;
    if (gauss)
      for (int64_t j = 0; j < k; ++j) vmin = std::min(vmin, var[j]);
    std::vector<double> wt(k * n), r(k * n), h(k * n), hs(n, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const double f = gauss ? vmin / var[j] : 1.0;
      for (int64_t t = 0; t < n; ++t) {
        const int64_t i = j * n + t;
        if (gauss) {
          wt[i] = tw_[i] * f;
          r[i] = resid[i];  // y - eta
          h[i] = wt[i];
        } else {
          wt[i] = m == nullptr ? tw_[i] : tw_[i] * m[t];
          r[i] = y[t] - mu[i];
          const double v = family == POISSON ? mu[i] : mu[i] * (1.0 - mu[i]);
          h[i] = wt[i] * std::max(v, std::numeric_limits<double>::min());
        }
        hs[t] += h[i];
      }
    }
    // per expert: A_j (pe x pe), C_j (pe x q), g_bj; shared: D (q x q), g_s
    std::vector<double> A(pe * pe), C(k * pe * q), AinvC(k * pe * q), Ainvg(k * pe), D(q * q), gs(q, 0.0), col(pe);
    std::vector<double> wr(n);
    for (int64_t j = 0; j < k; ++j) {
      for (int64_t t = 0; t < n; ++t) wr[t] = wt[j * n + t] * r[j * n + t];
      const double* hj = h.data() + j * n;
      for (int64_t a = 0; a < pe; ++a) {
        for (int64_t b = 0; b <= a; ++b) A[a * pe + b] = A[b * pe + a] = dot3(hj, Ze + a * n, Ze + b * n, n);
        A[a * pe + a] += eps;
        Ainvg[j * pe + a] = dot3(wr.data(), Ze + a * n, nullptr, n);
        for (int64_t c = 0; c < q; ++c) C[(j * pe + a) * q + c] = dot3(hj, Ze + a * n, Zs + c * n, n);
      }
      for (int64_t c = 0; c < q; ++c) gs[c] += dot3(wr.data(), Zs + c * n, nullptr, n);
      // A_j^-1 g_bj and A_j^-1 C_j (one factorisation per right-hand side: chol_solve overwrites A)
      std::vector<double> Aj = A;
      chol_solve(Aj.data(), Ainvg.data() + j * pe, pe);
      for (int64_t c = 0; c < q; ++c) {
        for (int64_t a = 0; a < pe; ++a) col[a] = C[(j * pe + a) * q + c];
        Aj = A;
        chol_solve(Aj.data(), col.data(), pe);
        for (int64_t a = 0; a < pe; ++a) AinvC[(j * pe + a) * q + c] = col[a];
      }
    }
    for (int64_t c = 0; c < q; ++c) {
      for (int64_t e = 0; e <= c; ++e) D[c * q + e] = D[e * q + c] = dot3(hs.data(), Zs + c * n, Zs + e * n, n);
      D[c * q + c] += eps;
    }
    std::vector<double> ds = gs;
    for (int64_t j = 0; j < k; ++j)
      for (int64_t a = 0; a < pe; ++a) {
        const double g = Ainvg[j * pe + a];
        for (int64_t c = 0; c < q; ++c) {
          ds[c] -= C[(j * pe + a) * q + c] * g;
          for (int64_t e = 0; e < q; ++e) D[c * q + e] -= C[(j * pe + a) * q + c] * AinvC[(j * pe + a) * q + e];
        }
      }
    chol_solve(D.data(), ds.data(), q);  // the Schur complement is positive definite
    std::vector<double> db(k * pe);
    bool ok = true;
    for (int64_t j = 0; j < k; ++j)
      for (int64_t a = 0; a < pe; ++a) {
        double v = Ainvg[j * pe + a];
        for (int64_t c = 0; c < q; ++c) v -= AinvC[(j * pe + a) * q + c] * ds[c];
        db[j * pe + a] = v;
        ok = ok && std::isfinite(v);
      }
    for (int64_t c = 0; c < q; ++c) ok = ok && std::isfinite(ds[c]);
    if (!ok) {
      std::fill(db.begin(), db.end(), 0.0);
      std::fill(ds.begin(), ds.end(), 0.0);
    }
    if (gauss) {
      for (int64_t i = 0; i < k * pe; ++i) beta[i] += db[i];
      for (int64_t c = 0; c < q; ++c) gamma[c] += ds[c];
      for (int64_t j = 0; j < k; ++j) {
        expert_residual(j);
        const double* tj = tw_ + j * n;
        const double* rj = resid.data() + j * n;
        double st = 0.0;
        for (int64_t t = 0; t < n; ++t) st += tj[t];
        var[j] = std::max((dot3(tj, rj, rj, n) + eps * var[j]) / (st + eps), floor);
      }
      resid_valid = true;
      return;
    }
    if (!ok) return;
    double step_sq = 0.0;
    for (double v : db) step_sq += v * v;
    for (double v : ds) step_sq += v * v;
    const double q0 = shared_objective(tw_, beta.data(), gamma.data());
    std::vector<double> cb(k * pe), cs(q);
    double step = 1.0;
    for (int h2 = 0; h2 < LINE_SEARCH + 18; ++h2, step *= 0.5) {
      for (int64_t i = 0; i < k * pe; ++i) cb[i] = beta[i] + step * db[i];
      for (int64_t c = 0; c < q; ++c) cs[c] = gamma[c] + step * ds[c];
      const double qc = shared_objective(tw_, cb.data(), cs.data()) - 0.5 * eps * step * step * step_sq;
      if (std::isfinite(qc) && qc >= q0) {
        beta = cb;
        gamma = cs;
        resid_valid = false;
        return;
      }
    }
  }

  // GLM experts: sum_j sum_t w tau m [y eta - b(eta)] at coefficients (b, g)
  double shared_objective(const double* tw_, const double* b, const double* g) {
    double total = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      linear_predictor(b + j * pe, g, etac.data());
      double qj, sc;
      glm_objective(tw_ + j * n, etac.data(), nullptr, qj, sc);
      total += qj;
    }
    return total;
  }

  double gate_objective(const double* tw_, const double* lw) const {
    V acc(0.0);
    for (int64_t t = 0; t < k * n; t += W) {
      const int64_t m = std::min<int64_t>(W, k * n - t);
      acc = acc + V::loadu(tw_ + t, m) * V::loadu(lw + t, m);
    }
    return hsum(acc);
  }

  void gate_step(const double* tw_) {
    const int64_t M = km1 * pg;
    const double q0 = gate_objective(tw_, logw.data());
    std::vector<double> pi(km1 * n), piw(km1 * n), grad(M), H(M * M), Wjl(n), delta(M), cand(M);
    for (int64_t j = 0; j < km1; ++j)
      for (int64_t t = 0; t < n; ++t) {
        pi[j * n + t] = std::exp(logw[j * n + t]);
        piw[j * n + t] = w == nullptr ? pi[j * n + t] : pi[j * n + t] * w[t];
      }
    for (int64_t j = 0; j < km1; ++j)
      for (int64_t a = 0; a < pg; ++a) {
        double g = 0.0;
        for (int64_t t = 0; t < n; ++t) g += (tw_[j * n + t] - piw[j * n + t]) * Zg[a * n + t];
        grad[j * pg + a] = g;
      }
    for (int64_t j = 0; j < km1; ++j)
      for (int64_t l = 0; l <= j; ++l) {
        for (int64_t t = 0; t < n; ++t)
          Wjl[t] = (j == l ? piw[j * n + t] : 0.0) - piw[j * n + t] * pi[l * n + t];
        for (int64_t a = 0; a < pg; ++a)
          for (int64_t b = 0; b < pg; ++b) {
            const double h = dot3(Wjl.data(), Zg + a * n, Zg + b * n, n);
            H[(j * pg + a) * M + l * pg + b] = h;
            H[(l * pg + b) * M + j * pg + a] = h;
          }
      }
    double mean = 0.0;
    for (int64_t i = 0; i < M; ++i) mean += H[i * M + i];
    mean /= static_cast<double>(M);
    const double damp = mean * 1e-10 + 1e-9 * static_cast<double>(n);
    for (int64_t i = 0; i < M; ++i) H[i * M + i] += damp;
    delta = grad;
    chol_solve(H.data(), delta.data(), M);
    double step = 1.0;
    for (int h = 0; h < LINE_SEARCH; ++h, step *= 0.5) {
      for (int64_t i = 0; i < M; ++i) cand[i] = tg[i] + step * delta[i];
      gate_log_weights(cand.data(), lw1.data());
      const double q1 = gate_objective(tw_, lw1.data());
      if (q1 >= q0) {  // false for NaN
        tg = cand;
        std::swap(logw, lw1);
        return;
      }
    }
  }

  void pack(std::vector<double>& out) const {
    out.clear();
    out.insert(out.end(), tg.begin(), tg.end());
    out.insert(out.end(), beta.begin(), beta.end());
    if (family == GAUSSIAN)
      for (int64_t j = 0; j < k; ++j) out.push_back(std::log(var[j]));
    out.insert(out.end(), gamma.begin(), gamma.end());
  }

  void adopt(const std::vector<double>& th) {
    const int64_t G = km1 * pg, E = k * pe;
    std::copy(th.begin(), th.begin() + G, tg.begin());
    std::copy(th.begin() + G, th.begin() + G + E, beta.begin());
    const int64_t nv = family == GAUSSIAN ? k : 0;
    if (family == GAUSSIAN)
      for (int64_t j = 0; j < k; ++j) var[j] = std::max(std::exp(th[G + E + j]), floor);
    std::copy(th.begin() + G + E + nv, th.begin() + G + E + nv + q, gamma.begin());
    gate_log_weights(tg.data(), logw.data());
    resid_valid = false;
  }
};

}  // namespace

// Batched EM from the starts tg (B, k-1, pg), beta (B, k, pe), var (B, k); data y (B, n), w (B, n) or an empty
// tensor, Zg (B, pg, n), Ze (B, pe, n), floor (B,).  Returns [tg, beta, var, loglik (B,), converged (B,),
// n_iter (B,), history (T, B)], as em_fit's loop.
std::vector<at::Tensor> em_softmax(at::Tensor y, at::Tensor w, at::Tensor Zg, at::Tensor Ze, at::Tensor tg,
                                   at::Tensor beta, at::Tensor var, at::Tensor floor, double tol, int64_t max_iter,
                                   double eps, int64_t gate_steps, bool accelerate, int64_t family, at::Tensor trials,
                                   at::Tensor offset, at::Tensor constant, at::Tensor Zs, at::Tensor gamma) {
  TORCH_CHECK(y.scalar_type() == at::kDouble && y.device().is_cpu(), "em_softmax: float64 CPU tensors");
  TORCH_CHECK(family >= GAUSSIAN && family <= BINOMIAL, "em_softmax: family 0 (gaussian), 1 (poisson), 2 (binomial)");
  y = y.contiguous(); Zg = Zg.contiguous(); Ze = Ze.contiguous(); floor = floor.contiguous();
  const bool weighted = w.numel() > 0;
  if (weighted) w = w.contiguous();
  const bool has_m = trials.numel() > 0, has_o = offset.numel() > 0, has_c = constant.numel() > 0;
  if (has_m) trials = trials.contiguous();
  if (has_o) offset = offset.contiguous();
  if (has_c) constant = constant.contiguous();
  const int64_t nq = Zs.numel() > 0 ? Zs.size(1) : 0;
  if (nq > 0) Zs = Zs.contiguous();
  at::Tensor gamma_out = nq > 0 ? gamma.contiguous().clone() : gamma;
  double* gp = nq > 0 ? gamma_out.data_ptr<double>() : nullptr;
  const double* zsp = nq > 0 ? Zs.data_ptr<double>() : nullptr;
  const int64_t B = y.size(0), n = y.size(1), km1 = tg.size(1), pg = Zg.size(1), k = beta.size(1),
                pe = Ze.size(1);
  TORCH_CHECK(k <= 64, "em_softmax: at most 64 experts");
  at::Tensor tg_out = tg.contiguous().clone(), beta_out = beta.contiguous().clone(),
             var_out = var.contiguous().clone();
  at::Tensor ll = at::empty({B}, y.options());
  at::Tensor converged = at::zeros({B}, y.options().dtype(at::kBool));
  at::Tensor n_iter = at::zeros({B}, y.options().dtype(at::kLong));
  at::Tensor hist = at::empty({max_iter + 1, B}, y.options());
  const double* yp = y.data_ptr<double>();
  const double* wp = weighted ? w.data_ptr<double>() : nullptr;
  const double* zgp = Zg.data_ptr<double>();
  const double* zep = Ze.data_ptr<double>();
  const double* flp = floor.data_ptr<double>();
  const double* mp = has_m ? trials.data_ptr<double>() : nullptr;
  const double* op = has_o ? offset.data_ptr<double>() : nullptr;
  const double* kp = has_c ? constant.data_ptr<double>() : nullptr;
  double* tgp = tg_out.data_ptr<double>();
  double* bp = beta_out.data_ptr<double>();
  double* vp = var_out.data_ptr<double>();
  double* llp = ll.data_ptr<double>();
  bool* cp = converged.data_ptr<bool>();
  int64_t* ip = n_iter.data_ptr<int64_t>();
  double* hp = hist.data_ptr<double>();
  const bool accel = accelerate && k > 1;

  each_pair(B, [&](int64_t b) {
    Pair P;
    P.y = yp + b * n;
    P.w = weighted ? wp + b * n : nullptr;
    P.Zg = zgp + b * pg * n;
    P.Ze = zep + b * pe * n;
    P.m = has_m ? mp + b * n : nullptr;
    P.off = has_o ? op + b * n : nullptr;
    P.cst = has_c ? kp + b * n : nullptr;
    P.n = n; P.k = k; P.km1 = km1; P.pg = pg; P.pe = pe; P.family = family;
    P.q = nq;
    P.Zs = nq > 0 ? zsp + b * nq * n : nullptr;
    if (nq > 0) P.gamma.assign(gp + b * nq, gp + (b + 1) * nq);
    P.floor = flp[b]; P.eps = eps;
    P.tg.assign(tgp + b * km1 * pg, tgp + (b + 1) * km1 * pg);
    P.beta.assign(bp + b * k * pe, bp + (b + 1) * k * pe);
    P.var.assign(vp + b * k, vp + (b + 1) * k);
    P.logw.assign(k * n, 0.0); P.resid.assign(k * n, 0.0); P.tau.assign(k * n, 0.0);
    P.lw1.assign(k * n, 0.0);
    if (family != GAUSSIAN) P.mu.assign(k * n, 0.0);
    P.etac.assign(n, 0.0);
    if (weighted) P.tw.assign(k * n, 0.0);
    P.gate_log_weights(P.tg.data(), P.logw.data());
    std::vector<double> sq0, sq1, sq2, cur;
    int phase = 0;
    bool have_prev = false, have_sq2 = false, conv = false;
    double ll_prev = 0.0, ll_mid = 0.0, l = -INF;
    int64_t it = 0;
    for (it = 0; it <= max_iter; ++it) {
      l = P.e_step();
      if (accel && phase == 2 && have_sq2 && !(std::isfinite(l) && l >= ll_mid)) {
        P.adopt(sq2);  // back to theta_2 where the jump lowered the likelihood
        l = P.e_step();
      }
      hp[it * B + b] = l;
      const bool tested = have_prev && !(accel && phase == 2);
      bool keep = std::isfinite(l);
      if (tested) keep = keep && std::abs(l - ll_prev) > (std::abs(l) + 1.0) * tol;
      if (!keep) {
        conv = tested && std::isfinite(l);
        break;
      }
      if (it == max_iter) break;
      if (accel) {
        if (phase == 0) P.pack(sq0);
        else if (phase == 1) { P.pack(sq1); ll_mid = l; }
      }
      const double* tw = P.weighted_tau();
      if (nq > 0) P.shared_step(tw);
      else if (family == GAUSSIAN) P.expert_step(tw);
      else P.glm_expert_step(tw);
      if (k > 1)
        for (int64_t s = 0; s < gate_steps; ++s) P.gate_step(tw);
      if (accel && phase == 1) {
        P.pack(sq2);
        have_sq2 = true;
        const size_t np = sq0.size();
        double rn = 0.0, vn = 0.0;
        std::vector<double> r(np), v(np);
        for (size_t i = 0; i < np; ++i) {
          r[i] = sq1[i] - sq0[i];
          v[i] = sq2[i] - 2.0 * sq1[i] + sq0[i];
          rn += r[i] * r[i];
          vn += v[i] * v[i];
        }
        rn = std::sqrt(rn);
        vn = std::sqrt(vn);
        const double alpha = std::min(vn > 0.0 ? -rn / vn : -1.0, -1.0);
        bool finite = true;
        for (size_t i = 0; i < np; ++i) {
          r[i] = sq0[i] - 2.0 * alpha * r[i] + alpha * alpha * v[i];
          finite = finite && std::isfinite(r[i]);
        }
        P.adopt(finite ? r : sq2);
      }
      if (accel) phase = (phase + 1) % 3;
      ll_prev = l;
      have_prev = true;
    }
    const int64_t stop = std::min(it, max_iter);
    for (int64_t t = stop + 1; t <= max_iter; ++t) hp[t * B + b] = l;
    llp[b] = l;
    cp[b] = conv;
    ip[b] = stop;
    std::copy(P.tg.begin(), P.tg.end(), tgp + b * km1 * pg);
    std::copy(P.beta.begin(), P.beta.end(), bp + b * k * pe);
    std::copy(P.var.begin(), P.var.end(), vp + b * k);
    if (nq > 0) std::copy(P.gamma.begin(), P.gamma.end(), gp + b * nq);
  });
  const int64_t T = n_iter.numel() ? n_iter.max().item<int64_t>() + 1 : 1;
  return {tg_out, beta_out, var_out, ll, converged, n_iter, hist.narrow(0, 0, T).clone(), gamma_out};
}

// The random starts' GLM fits: families.irls_weighted for every lane (replicate, restart, expert) of w (R, S, n, k),
// one lane at a time.  A lane maximises sum_t w m [y eta - b(eta)] - ridge/2 |beta|^2 - prox/2 |beta - beta_init|^2
// (eta = z beta + o) by Newton steps with halving (t = 1, 1/2, ..., 2^-29; the full step unchecked when its predicted
// gain is below 64 ulps of the terms), until a step is at most tol (1 + max|beta|), no step raises the objective, or
// max_iter steps.  Z (R, n, p), y (R, n), beta (R, S, k, p); trials and offset (R, n) or empty.
at::Tensor irls(at::Tensor Z, at::Tensor y, at::Tensor w, at::Tensor beta, int64_t family, int64_t max_iter,
                double tol, double ridge, double prox, at::Tensor trials, at::Tensor offset) {
  TORCH_CHECK(family == POISSON || family == BINOMIAL, "irls: family 1 (poisson) or 2 (binomial)");
  Z = Z.contiguous(); y = y.contiguous(); w = w.contiguous();
  const bool has_m = trials.numel() > 0, has_o = offset.numel() > 0;
  if (has_m) trials = trials.contiguous();
  if (has_o) offset = offset.contiguous();
  const int64_t R = Z.size(0), n = Z.size(1), p = Z.size(2), S = w.size(1), k = w.size(3);
  at::Tensor out = beta.contiguous().clone();
  const double* zp = Z.data_ptr<double>();
  const double* yp = y.data_ptr<double>();
  const double* wp = w.data_ptr<double>();
  const double* mp = has_m ? trials.data_ptr<double>() : nullptr;
  const double* op = has_o ? offset.data_ptr<double>() : nullptr;
  double* bp = out.data_ptr<double>();
  at::parallel_for(0, R * S * k, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> wl(n), eta(n), b0(p), b(p), cand(p), g(p), H(p * p), delta(p);
    for (int64_t lane = begin; lane < end; ++lane) {
      const int64_t r = lane / (S * k), s = (lane / k) % S, j = lane % k;
      const double* z = zp + r * n * p;
      const double* yr = yp + r * n;
      const double* mr = has_m ? mp + r * n : nullptr;
      const double* orr = has_o ? op + r * n : nullptr;
      for (int64_t t = 0; t < n; ++t) wl[t] = wp[((r * S + s) * n + t) * k + j];
      double* bl = bp + ((r * S + s) * k + j) * p;
      std::copy(bl, bl + p, b0.begin());
      b = b0;
      auto predictor = [&](const std::vector<double>& bb) {
        for (int64_t t = 0; t < n; ++t) {
          double e = orr != nullptr ? orr[t] : 0.0;
          for (int64_t a = 0; a < p; ++a) e += z[t * p + a] * bb[a];
          eta[t] = e;
        }
      };
      auto objective = [&](const std::vector<double>& bb, double& q, double& scale) {
        predictor(bb);
        q = 0.0;
        scale = 0.0;
        for (int64_t t = 0; t < n; ++t) {
          const double e = eta[t];
          const double cum = family == POISSON ? std::exp(e) : std::max(e, 0.0) + std::log1p(std::exp(-std::abs(e)));
          double kern = yr[t] * e - cum;
          if (mr != nullptr) kern *= mr[t];
          const double term = wl[t] * kern;
          q += term;
          scale += std::abs(term);
        }
        double pen = 0.0, pen0 = 0.0;
        for (int64_t a = 0; a < p; ++a) {
          pen += bb[a] * bb[a];
          pen0 += (bb[a] - b0[a]) * (bb[a] - b0[a]);
        }
        if (ridge != 0.0) { q -= 0.5 * ridge * pen; scale += 0.5 * ridge * pen; }
        if (prox != 0.0) { q -= 0.5 * prox * pen0; scale += 0.5 * prox * pen0; }
      };
      double q, scale;
      objective(b, q, scale);
      if (!std::isfinite(q)) continue;
      for (int64_t it = 0; it < max_iter; ++it) {
        predictor(b);
        std::fill(g.begin(), g.end(), 0.0);
        std::fill(H.begin(), H.end(), 0.0);
        for (int64_t t = 0; t < n; ++t) {
          const double mu = family == POISSON ? std::exp(eta[t]) : 1.0 / (1.0 + std::exp(-eta[t]));
          const double wm = mr != nullptr ? wl[t] * mr[t] : wl[t];
          const double v = wm * (family == POISSON ? mu : mu * (1.0 - mu));
          const double rr = wm * (yr[t] - mu);
          const double* zt = z + t * p;
          for (int64_t a = 0; a < p; ++a) {
            g[a] += rr * zt[a];
            for (int64_t c = 0; c <= a; ++c) H[a * p + c] += v * zt[a] * zt[c];
          }
        }
        for (int64_t a = 0; a < p; ++a) {
          for (int64_t c = 0; c < a; ++c) H[c * p + a] = H[a * p + c];
          g[a] -= ridge * b[a] + prox * (b[a] - b0[a]);
          H[a * p + a] += ridge + prox;
        }
        delta = g;
        chol_solve(H.data(), delta.data(), p);
        bool ok = true;
        double dec = 0.0, dmax = 0.0, bmax = 0.0;
        for (int64_t a = 0; a < p; ++a) {
          ok = ok && std::isfinite(delta[a]);
          dec += g[a] * delta[a];
          dmax = std::max(dmax, std::abs(delta[a]));
          bmax = std::max(bmax, std::abs(b[a]));
        }
        if (!ok) break;  // a singular system: the lane stays where it is
        const bool small = dmax <= tol * (1.0 + bmax);
        bool unmeasurable = dec <= ROUNDING * std::numeric_limits<double>::epsilon() * scale;
        bool moved = false;
        double step = 1.0;
        for (int h = 0; h < MAX_HALVINGS; ++h, step *= 0.5) {
          for (int64_t a = 0; a < p; ++a) cand[a] = b[a] + step * delta[a];
          double qc, sc;
          objective(cand, qc, sc);
          if (std::isfinite(qc) && (qc >= q || unmeasurable)) {
            b = cand;
            q = qc;
            scale = sc;
            moved = true;
            break;
          }
          unmeasurable = false;  // only the full step is taken unmeasured
        }
        if (small || !moved) break;
      }
      std::copy(b.begin(), b.end(), bl);
    }
  });
  return out;
}

// @MLE_LBFGS@

// torch.ops.<extension name>.<function> (_native.py); the indirection expands TORCH_EXTENSION_NAME first
#define MOESTAT_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
MOESTAT_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("irls", &irls);  // GLM fits of every lane by step-halved Newton (the random starts of GLM experts)
  m.def("em_softmax", &em_softmax);  // EM for Gaussian, Poisson or binomial experts, softmax gate, one loop per pair
  m.def("lbfgs_softmax", &lbfgs_softmax);  // L-BFGS on the same models' negative mean log-likelihood, one loop per pair
  m.def("mixture_value_grad", &mixture_value_grad);  // that objective's value and gradient
}
