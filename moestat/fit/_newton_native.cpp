// The trust-region Newton method of moestat/fit/_optim.py (`newton`) for the MoE least-squares problem, one whole
// run per problem in C++ (moestat/fit/_native.py builds it; fit_lse(compile=True) calls it).
//
// Per problem (a replicate x restart) and per evaluation, for each block of `chunk` observations:
//   Z   = Theta X_c^T                       (2k x c; p small: an axpy per input column)
//   r, u = df/dZ and the pair rows C_ab = u_a u_b + r W_ab (a <= b), W = d2f/dZ dZ^T   (one at::vec pass)
//   M  += C XX_c^T,  B += (r u) X_c          (XX the pair products of the inputs; tiles of FMAs, BLAS when large)
// and H (half the exact Hessian of the objective on the free coordinates) is gathered from M, b from B.  When all
// observations fit one block, the lane pass of a trial point's value (Z, gate weights, experts, residuals) is kept,
// and the Hessian at an accepted trial point starts from it.  The
// element-wise formulas are those of MeanKernel.exact_curvature_rows (moestat/fit/_objective.py); the step, its
// damping, projection, gain ratio and stopping rules those of _optim.newton, so the two agree to rounding.
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

// KMAX, Gate, activation(), activation_second(), gate_weights(): _native_common.cpp, inserted here.
// @NATIVE_COMMON@

// Pair sums M (mu x mx entries) up to which each block's products run in pair_sums' register tiles rather than as two
// BLAS calls (measured on 2 AVX-512 cores: the tiles 1.07x BLAS at 95,931 sums, the flagship preset; 0.93x at 267,750).
constexpr int64_t SMALL_PRODUCT = 131072;
// Free parameters from which the damped step is factored by LAPACK instead of the loop's own Cholesky.
constexpr int64_t LAPACK_MIN_F = 192;
// Rounding error of the objective sum_t r_t^2 / n, as a multiple of sqrt(n) eps |L|.
constexpr double NOISE_ULPS = 4.0;
// Status codes of _optim.STATUS.
enum Status : int64_t { RUNNING = 0, GTOL = 1, MAX_ITER = 4, DAMPING = 6, STALL = 9 };

// Sum of a vector register's lanes, in lane order.
template <typename T>
inline T lane_sum(const at::vec::Vectorized<T>& v) {
  T buf[at::vec::Vectorized<T>::size()];
  v.store(buf);
  T s = 0;
  for (const T x : buf) s += x;
  return s;
}

template <typename T>
inline T dot(const T* a, const T* b, int64_t m) {
  using V = at::vec::Vectorized<T>;
  constexpr int64_t W = V::size();
  V acc(T(0));
  int64_t q = 0;
  for (; q + W <= m; q += W) acc = at::vec::fmadd(V::loadu(a + q), V::loadu(b + q), acc);
  T s = lane_sum(acc);
  for (; q < m; ++q) s += a[q] * b[q];
  return s;
}

// out[a * ldo + q] += sum_t A[a * lda + t] B[q * ldb + t] for a < RA, q < RQ, t < len: RA x RQ independent
// accumulators, so the FMA chains overlap and each loaded vector serves RQ (or RA) products.
template <typename T, int RA, int RQ>
inline void pair_tile(const T* A, int64_t lda, const T* B, int64_t ldb, int64_t len, T* out, int64_t ldo) {
  using V = at::vec::Vectorized<T>;
  constexpr int64_t W = V::size();
  V acc[RA][RQ];
  for (int i = 0; i < RA; ++i)
    for (int j = 0; j < RQ; ++j) acc[i][j] = V(T(0));
  int64_t t = 0;
  for (; t + W <= len; t += W) {
    V b[RQ];
    for (int j = 0; j < RQ; ++j) b[j] = V::loadu(B + j * ldb + t);
    for (int i = 0; i < RA; ++i) {
      const V a = V::loadu(A + i * lda + t);
      for (int j = 0; j < RQ; ++j) acc[i][j] = at::vec::fmadd(a, b[j], acc[i][j]);
    }
  }
  if (t < len) {
    const int64_t r = len - t;
    V b[RQ];
    for (int j = 0; j < RQ; ++j) b[j] = V::loadu(B + j * ldb + t, r);
    for (int i = 0; i < RA; ++i) {
      const V a = V::loadu(A + i * lda + t, r);
      for (int j = 0; j < RQ; ++j) acc[i][j] = at::vec::fmadd(a, b[j], acc[i][j]);
    }
  }
  for (int i = 0; i < RA; ++i)
    for (int j = 0; j < RQ; ++j) out[i * ldo + j] += lane_sum(acc[i][j]);
}

// out (ma x mb, row stride ldo) += A B^T for A (ma x len, row stride lda), B (mb x len, row stride ldb), in tiles of
// up to 4 x 4.
template <typename T>
void pair_sums(const T* A, int64_t lda, int64_t ma, const T* B, int64_t ldb, int64_t mb, int64_t len, T* out,
               int64_t ldo) {
  using Tile = void (*)(const T*, int64_t, const T*, int64_t, int64_t, T*, int64_t);
  static constexpr Tile tiles[4][4] = {
      {pair_tile<T, 1, 1>, pair_tile<T, 1, 2>, pair_tile<T, 1, 3>, pair_tile<T, 1, 4>},
      {pair_tile<T, 2, 1>, pair_tile<T, 2, 2>, pair_tile<T, 2, 3>, pair_tile<T, 2, 4>},
      {pair_tile<T, 3, 1>, pair_tile<T, 3, 2>, pair_tile<T, 3, 3>, pair_tile<T, 3, 4>},
      {pair_tile<T, 4, 1>, pair_tile<T, 4, 2>, pair_tile<T, 4, 3>, pair_tile<T, 4, 4>}};
  for (int64_t a = 0; a < ma; a += 4) {
    const int64_t ra = std::min<int64_t>(4, ma - a);
    for (int64_t q = 0; q < mb; q += 4) {
      const int64_t rq = std::min<int64_t>(4, mb - q);
      tiles[ra - 1][rq - 1](A + a * lda, lda, B + q * ldb, ldb, len, out + a * ldo + q, ldo);
    }
  }
}

// In-place Cholesky factor of the symmetric F x F matrix A (row-major, lower triangle used); false when A is not
// numerically positive definite.
template <typename T>
bool cholesky(T* A, int64_t F) {
  for (int64_t j = 0; j < F; ++j) {
    T* Lj = A + j * F;
    const T s = Lj[j] - dot(Lj, Lj, j);
    if (!(s > T(0)) || !std::isfinite(s)) return false;
    const T ljj = std::sqrt(s);
    Lj[j] = ljj;
    for (int64_t i = j + 1; i < F; ++i) {
      T* Li = A + i * F;
      Li[j] = (Li[j] - dot(Li, Lj, j)) / ljj;
    }
  }
  return true;
}

// Cholesky factor of the F x F matrix whose lower triangle is in A (row-major), in place: our own loop for small F,
// LAPACK's blocked one (through ATen) from LAPACK_MIN_F on, where its blocking outweighs the call's overhead.
template <typename T>
bool factor(T* A, int64_t F) {
  if (F < LAPACK_MIN_F) return cholesky(A, F);
  for (int64_t a = 0; a < F; ++a)
    for (int64_t c2 = 0; c2 < a; ++c2) A[c2 * F + a] = A[a * F + c2];
  auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
  auto result = at::linalg_cholesky_ex(at::from_blob(A, {F, F}, opts));
  if (std::get<1>(result).template item<int64_t>() != 0) return false;
  const at::Tensor L = std::get<0>(result).contiguous();
  const T* l = L.template data_ptr<T>();
  std::copy(l, l + F * F, A);
  for (int64_t q = 0; q < F * F; ++q)
    if (!std::isfinite(A[q])) return false;
  return true;
}

// Solve L L^T x = rhs in place (L row-major lower triangle of an F x F array).
template <typename T>
void cholesky_solve(const T* L, T* x, int64_t F) {
  for (int64_t i = 0; i < F; ++i) x[i] = (x[i] - dot(L + i * F, x, i)) / L[i * F + i];
  for (int64_t i = F - 1; i >= 0; --i) {
    T s = x[i];
    for (int64_t q = i + 1; q < F; ++q) s -= L[q * F + i] * x[q];
    x[i] = s / L[i * F + i];
  }
}

// Position of the unordered pair (a, b) of m rows in the order of torch.triu_indices(m, m).
inline int64_t pair_pos(int64_t a, int64_t b, int64_t m) {
  if (a > b) std::swap(a, b);
  return a * m - a * (a - 1) / 2 + (b - a);
}

struct Model {
  int64_t k, p, n, gate, top_k, act;
  bool act2;  // phi'' not identically zero
  double tau;
};

// Work arrays of one thread, and the data of the problem it is solving.
template <typename T>
struct Workspace {
  const Model& m;
  int64_t c, mu, mx, P, F;
  int64_t small_product;  // mu * mx up to which the pair sums run in pair_sums' tiles, not BLAS
  const T* XT;  // (p, n) inputs of the problem's replicate, transposed
  const T* y;   // (n,)
  std::vector<T> Z, RU, C, XX, Mbuf, Bbuf;  // a block's Z, r u, pair rows, input pairs; the pair sums
  // With all observations in one block, value() keeps Z and each lane group's gate weights, experts, derivatives,
  // mean and residual (3k + 2 registers, `lanes`), and its sum of squares: value_hessian(..., reuse = true) at the
  // same theta (an accepted trial point) starts from them instead of evaluating the mean again.
  bool one_block;
  std::vector<at::vec::Vectorized<T>> lanes;
  T kept_value;
  const T* xx_of;  // with one block, the inputs whose pair products XX holds (they change only with the replicate)
  std::vector<int64_t> hidx;  // (F*F,) flat position in M of each entry of H
  std::vector<int64_t> free;  // (F,)

  Workspace(const Model& model, int64_t chunk, const std::vector<int64_t>& free_idx,
            int64_t tile_max = SMALL_PRODUCT)
      : m(model), c(chunk), small_product(tile_max), XT(nullptr), y(nullptr), free(free_idx) {
    const int64_t k2 = 2 * m.k;
    mu = k2 * (k2 + 1) / 2;
    mx = m.p * (m.p + 1) / 2;
    P = k2 * m.p;
    F = int64_t(free.size());
    Z.resize(k2 * c); RU.resize(k2 * c); C.resize(mu * c); XX.resize(mx * c);
    Mbuf.resize(mu * mx); Bbuf.resize(k2 * m.p);
    one_block = m.n <= c;
    if (one_block) lanes.resize(lane_groups() * lane_stride());
    kept_value = T(0);
    xx_of = nullptr;
    hidx.resize(F * F);
    for (int64_t a = 0; a < F; ++a)
      for (int64_t b = 0; b < F; ++b) {
        const int64_t ia = free[a] / m.p, la = free[a] % m.p, ib = free[b] / m.p, lb = free[b] % m.p;
        hidx[a * F + b] = pair_pos(ia, ib, k2) * mx + pair_pos(la, lb, m.p);
      }
  }

  int64_t lane_groups() const { return (c + at::vec::Vectorized<T>::size() - 1) / at::vec::Vectorized<T>::size(); }
  int64_t lane_stride() const { return 3 * m.k + 2; }  // pi, h, dh (k each), f, residual

  // Z (2k x cc) = Theta X_c^T for observations [lo, lo + cc).
  void linear(const T* theta, int64_t lo, int64_t cc) {
    const int64_t k2 = 2 * m.k, p = m.p, n = m.n;
    for (int64_t j = 0; j < k2; ++j) {
      T* z = Z.data() + j * c;
      const T* th = theta + j * p;
      const T* x0 = XT + lo;
      for (int64_t t = 0; t < cc; ++t) z[t] = th[0] * x0[t];
      for (int64_t l = 1; l < p; ++l) {
        const T w = th[l];
        const T* xl = XT + l * n + lo;
        for (int64_t t = 0; t < cc; ++t) z[t] += w * xl[t];
      }
    }
  }

  // Gate weights, experts, mean and residual of lanes [t, t + mm) of the block at observation lo in Z; the squared
  // residual is added to acc (lanes past the block's end: residual 0).
  at::vec::Vectorized<T> residual_lanes(int64_t lo, int64_t t, int64_t mm, at::vec::Vectorized<T>* pi,
                                        at::vec::Vectorized<T>* h, at::vec::Vectorized<T>* dh,
                                        at::vec::Vectorized<T>& f, at::vec::Vectorized<T>& acc) const {
    using V = at::vec::Vectorized<T>;
    const int64_t k = m.k;
    const V inv_tau(T(1.0 / m.tau));
    for (int64_t i = 0; i < k; ++i) {
      pi[i] = V::loadu(Z.data() + i * c + t, mm) * inv_tau;
      activation<T>(m.act, V::loadu(Z.data() + (k + i) * c + t, mm), h[i], dh[i]);
    }
    gate_weights<T>(m.gate, m.top_k, k, pi);
    f = V(T(0));
    for (int64_t i = 0; i < k; ++i) f = at::vec::fmadd(pi[i], h[i], f);
    V res = f - V::loadu(y + lo + t, mm);
    if (mm < V::size()) res = V::set(V(T(0)), res, mm);
    acc = at::vec::fmadd(res, res, acc);
    return res;
  }

  // Sum of squared residuals at theta.
  T value(const T* theta) {
    using V = at::vec::Vectorized<T>;
    constexpr int64_t W = V::size();
    V pi[KMAX], h[KMAX], dh[KMAX], f;
    V acc(T(0));
    const int64_t k = m.k, stride = lane_stride();
    for (int64_t lo = 0; lo < m.n; lo += c) {
      const int64_t cc = std::min(c, m.n - lo);
      linear(theta, lo, cc);
      for (int64_t t = 0; t < cc; t += W) {
        if (one_block) {
          V* kept = lanes.data() + (t / W) * stride;
          kept[3 * k + 1] = residual_lanes(lo, t, std::min<int64_t>(W, cc - t), kept, kept + k, kept + 2 * k,
                                           kept[3 * k], acc);
        } else {
          residual_lanes(lo, t, std::min<int64_t>(W, cc - t), pi, h, dh, f, acc);
        }
      }
    }
    kept_value = lane_sum(acc);
    return kept_value;
  }

  // Sum of squared residuals, b = J^T r / n (P) and H = (1/n) sum_t C_t (x) x_t x_t^T on the free coordinates.
  // reuse: theta is the point of the last value() call, whose lane pass is kept (one block only).
  T value_hessian(const T* theta, T* b, T* H, bool reuse = false) {
    using V = at::vec::Vectorized<T>;
    constexpr int64_t W = V::size();
    const int64_t k = m.k, k2 = 2 * k, p = m.p, n = m.n;
    const T inv_tau = T(1.0 / m.tau), inv_tau2 = inv_tau * inv_tau;
    const V one(T(1)), two(T(2)), vt(inv_tau), vt2(inv_tau2);
    V own[3 * KMAX + 2], d2h[KMAX], u[2 * KMAX];
    V acc(T(0));
    reuse = reuse && one_block;
    const int64_t stride = lane_stride();
    std::fill(Mbuf.begin(), Mbuf.end(), T(0));
    std::fill(Bbuf.begin(), Bbuf.end(), T(0));
    auto opts = at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value);
    at::Tensor Mt = at::from_blob(Mbuf.data(), {mu, mx}, opts), Bt = at::from_blob(Bbuf.data(), {k2, p}, opts);
    for (int64_t lo = 0; lo < n; lo += c) {
      const int64_t cc = std::min(c, n - lo);
      if (!reuse) linear(theta, lo, cc);
      for (int64_t t = 0; t < cc; t += W) {
        const int64_t mm = std::min<int64_t>(W, cc - t);
        V* const lane = reuse ? lanes.data() + (t / W) * stride : own;
        const V* const pi = lane;
        const V* const h = lane + k;
        const V* const dh = lane + 2 * k;
        if (!reuse) lane[3 * k + 1] = residual_lanes(lo, t, mm, lane, lane + k, lane + 2 * k, lane[3 * k], acc);
        const V f = lane[3 * k], res = lane[3 * k + 1];
        if (m.act2)
          for (int64_t i = 0; i < k; ++i)
            activation_second<T>(m.act, V::loadu(Z.data() + (k + i) * c + t, mm), h[i], dh[i], d2h[i]);
        for (int64_t i = 0; i < k; ++i) {
          u[i] = (m.gate == SIGMOID ? h[i] * pi[i] * (one - pi[i]) : pi[i] * (h[i] - f)) * vt;
          u[k + i] = pi[i] * dh[i];
        }
        for (int64_t a = 0; a < k2; ++a) (res * u[a]).store(RU.data() + a * c + t, mm);
        int64_t row = 0;
        for (int64_t a = 0; a < k2; ++a) {
          for (int64_t bb = a; bb < k2; ++bb, ++row) {
            V w(T(0));
            bool has_w = false;
            if (a < k && bb < k) {  // gate-gate
              const int64_t i = a, j = bb;
              if (m.gate == SIGMOID) {
                if (i == j) { w = pi[i] * (one - pi[i]) * (one - two * pi[i]) * h[i] * vt2; has_w = true; }
              } else {
                w = pi[i] * pi[j] * (h[i] + h[j] - two * f);
                w = (i == j ? pi[i] * (h[i] - f) - w : w.neg()) * vt2;
                has_w = true;
              }
            } else if (a < k) {  // gate-expert
              const int64_t i = a, j = bb - k;
              if (m.gate == SIGMOID) {
                if (i == j) { w = pi[i] * (one - pi[i]) * dh[i] * vt; has_w = true; }
              } else {
                w = pi[i] * pi[j] * dh[j];
                w = (i == j ? pi[i] * dh[i] - w : w.neg()) * vt;
                has_w = true;
              }
            } else if (a == bb && m.act2) {  // expert-expert
              w = pi[a - k] * d2h[a - k];
              has_w = true;
            }
            V cab = u[a] * u[bb];
            if (has_w) cab = at::vec::fmadd(res, w, cab);
            cab.store(C.data() + row * c + t, mm);
          }
        }
      }
      // pair products of the inputs: XX_(l, l') = x_l x_l' (l <= l'); with one block, once per replicate
      if (!(one_block && xx_of == XT)) {
        int64_t row = 0;
        for (int64_t l = 0; l < p; ++l) {
          const T* xl = XT + l * n + lo;
          for (int64_t l2 = l; l2 < p; ++l2, ++row) {
            const T* xl2 = XT + l2 * n + lo;
            T* out = XX.data() + row * c;
            for (int64_t t = 0; t < cc; ++t) out[t] = xl[t] * xl2[t];
          }
        }
        xx_of = one_block ? XT : nullptr;
      }
      if (mu * mx <= small_product) {
        pair_sums(C.data(), c, mu, XX.data(), c, mx, cc, Mbuf.data(), mx);
        pair_sums(RU.data(), c, k2, XT + lo, n, p, cc, Bbuf.data(), p);
      } else {
        at::Tensor Ct = at::from_blob(C.data(), {mu, cc}, {c, 1}, opts);
        at::Tensor XXt = at::from_blob(XX.data(), {mx, cc}, {c, 1}, opts);
        at::Tensor RUt = at::from_blob(RU.data(), {k2, cc}, {c, 1}, opts);
        at::Tensor Xc = at::from_blob(const_cast<T*>(XT) + lo, {p, cc}, {n, 1}, opts);
        Mt.addmm_(Ct, XXt.t());
        Bt.addmm_(RUt, Xc.t());
      }
    }
    const T inv_n = T(1.0 / double(n));
    const int64_t FF = F * F;
    for (int64_t q = 0; q < FF; ++q) H[q] = Mbuf[hidx[q]] * inv_n;
    for (int64_t a = 0; a < F; ++a) b[a] = Bbuf[free[a]] * inv_n;
    return reuse ? kept_value : lane_sum(acc);
  }
};

struct Settings {
  int64_t max_iter, stall_window;
  double gtol, damping, stall_tol;
};

struct Outcome {
  double loss, gnorm;
  int64_t n_iter, status, evals;
};

// One problem from theta (P, overwritten with the end point) to its stop.
template <typename T>
Outcome solve(Workspace<T>& ws, T* theta, const T* lower, const T* upper, const Settings& set) {
  const int64_t P = ws.P, F = ws.F, n = ws.m.n;
  const std::vector<int64_t>& free = ws.free;
  const T inv_n = T(1.0 / double(n));
  const T eps = std::numeric_limits<T>::epsilon(), tiny = std::numeric_limits<T>::min();
  auto project = [&](T* th) {
    if (lower == nullptr) return;
    for (int64_t q = 0; q < P; ++q) th[q] = std::max(std::min(th[q], upper[q]), lower[q]);
  };
  std::vector<T> H(F * F), M(F * F), b(F), g(P), D(F), Dreg(F), delta(F), trial(P), Hd(F);
  std::vector<char> held(F);
  std::vector<T> past;  // objectives of the iterations so far (the stall test looks stall_window back)
  Outcome out{0, 0, 0, RUNNING, 0};
  project(theta);
  T f = ws.value_hessian(theta, b.data(), H.data()) * inv_n;
  out.evals = 1;
  for (int64_t a = 0; a < F; ++a) D[a] = std::abs(H[a * F + a]);
  T lam = T(set.damping), nu = T(2);
  past.push_back(f);
  for (int64_t it = 0; it <= set.max_iter; ++it) {
    std::fill(g.begin(), g.end(), T(0));
    for (int64_t a = 0; a < F; ++a) g[free[a]] = T(2) * b[a];
    T gn = 0;
    bool nan = false;
    for (int64_t q = 0; q < P; ++q) {
      const bool blocked = lower != nullptr &&
                           ((theta[q] <= lower[q] && g[q] > 0) || (theta[q] >= upper[q] && g[q] < 0));
      if (!blocked) gn = std::max(gn, std::abs(g[q]));
      nan = nan || std::isnan(g[q]);
    }
    if (nan) gn = std::numeric_limits<T>::quiet_NaN();  // as torch's amax: a NaN gradient is never converged
    int64_t status = RUNNING;
    if (gn <= T(set.gtol)) {
      status = GTOL;
    } else if (lam > T(1e16)) {
      status = DAMPING;
    } else if (int64_t(past.size()) > set.stall_window &&
               past[past.size() - 1 - set.stall_window] - f <= T(set.stall_tol) * std::max(std::abs(f), tiny)) {
      status = STALL;
    } else if (it == set.max_iter) {
      status = MAX_ITER;
    }
    if (status != RUNNING) {
      out.loss = double(f); out.gnorm = double(gn); out.status = status;
      return out;
    }
    T dmax = 0;
    for (int64_t a = 0; a < F; ++a) {
      D[a] = std::max(D[a], std::abs(H[a * F + a]));
      dmax = std::max(dmax, D[a]);
    }
    for (int64_t a = 0; a < F; ++a) Dreg[a] = D[a] + eps * std::max(dmax, tiny);
    bool any_held = false;
    for (int64_t a = 0; a < F; ++a) {
      const int64_t q = free[a];
      const bool blocked = lower != nullptr &&
                           ((theta[q] <= lower[q] && g[q] > 0) || (theta[q] >= upper[q] && g[q] < 0));
      held[a] = blocked && g[q] != 0;
      any_held = any_held || held[a];
    }
    // damped step: (H + lam diag(Dreg)) delta = -b, held coordinates fixed; lam x10 until positive definite
    bool factored = false;
    for (int64_t attempt = 0; attempt < 40; ++attempt) {
      for (int64_t a = 0; a < F; ++a)
        for (int64_t c2 = 0; c2 <= a; ++c2)
          M[a * F + c2] = (any_held && (held[a] || held[c2])) ? T(a == c2 ? 1 : 0) : H[a * F + c2];
      for (int64_t a = 0; a < F; ++a) M[a * F + a] += lam * Dreg[a];
      if (factor(M.data(), F)) { factored = true; break; }
      lam *= T(10);
    }
    if (factored) {
      for (int64_t a = 0; a < F; ++a) delta[a] = (any_held && held[a]) ? T(0) : -b[a];
      cholesky_solve(M.data(), delta.data(), F);
      for (int64_t a = 0; a < F; ++a)
        if (!std::isfinite(delta[a])) delta[a] = T(0);
    } else {
      std::fill(delta.begin(), delta.end(), T(0));
    }
    std::copy(theta, theta + P, trial.begin());
    for (int64_t a = 0; a < F; ++a) trial[free[a]] += delta[a];
    project(trial.data());
    for (int64_t a = 0; a < F; ++a) delta[a] = trial[free[a]] - theta[free[a]];
    const T ft = ws.value(trial.data()) * inv_n;
    out.evals += 1;
    T db = 0, dHd = 0;
    for (int64_t a = 0; a < F; ++a) {
      db += delta[a] * b[a];
      Hd[a] = dot(H.data() + a * F, delta.data(), F);
    }
    for (int64_t a = 0; a < F; ++a) dHd += delta[a] * Hd[a];
    const T pred = T(-2) * db - dHd;
    const T rho = (f - ft) / pred;
    // A predicted decrease below the rounding error of the objective cannot be checked against the computed one
    // (their ratio is rounding noise): such a step is taken when the objective did not rise beyond that error.
    const T noise = T(NOISE_ULPS) * std::sqrt(T(n)) * eps * std::abs(f);
    const bool at_floor = pred > 0 && pred <= noise;
    const bool accept = std::isfinite(ft) && pred > 0 && (at_floor ? ft <= f + noise : rho > 0);
    if (accept) {
      const T cube = at_floor ? T(1) : T(2) * rho - T(1);  // at the floor the model is taken as exact (rho = 1)
      lam = std::max(lam * std::max(T(1) - cube * cube * cube, T(1.0 / 3.0)), T(1e-12));
      nu = T(2);
    } else {
      lam = lam * nu;
      nu = nu * T(2);
    }
    out.n_iter += 1;
    if (accept) {
      std::copy(trial.begin(), trial.end(), theta);
      f = ws.value_hessian(theta, b.data(), H.data(), true) * inv_n;
      out.evals += 1;
    }
    past.push_back(f);
  }
  return out;  // not reached: it == max_iter stops above
}

template <typename T>
void newton_impl(const at::Tensor& theta, const at::Tensor& XT, const at::Tensor& y, const at::Tensor& lower,
                 const at::Tensor& upper, const std::vector<int64_t>& free, const Model& model, int64_t S,
                 int64_t chunk, const Settings& set, at::Tensor& loss, at::Tensor& gnorm, at::Tensor& n_iter,
                 at::Tensor& status, at::Tensor& evals) {
  const int64_t B = theta.size(0), P = theta.size(1), p = model.p, n = model.n;
  T* th = theta.data_ptr<T>();
  const T* xt = XT.data_ptr<T>();
  const T* yp = y.data_ptr<T>();
  const T* lo = lower.numel() ? lower.data_ptr<T>() : nullptr;
  const T* hi = upper.numel() ? upper.data_ptr<T>() : nullptr;
  double* lp = loss.data_ptr<double>();
  double* gp = gnorm.data_ptr<double>();
  int64_t* ip = n_iter.data_ptr<int64_t>();
  int64_t* sp = status.data_ptr<int64_t>();
  int64_t* ep = evals.data_ptr<int64_t>();
  // Problems go to threads one at a time, as each thread becomes free: their iteration counts differ (85-109 on the
  // flagship preset at n = 10,000), so equal contiguous shares would leave threads idle.  A problem's result does
  // not depend on the thread that solves it.
  std::atomic<int64_t> next{0};
  const int64_t teams = std::min<int64_t>(B, at::get_num_threads());
  at::parallel_for(0, teams, 1, [&](int64_t, int64_t) {
    Workspace<T> ws(model, chunk, free);
    for (int64_t bi = next++; bi < B; bi = next++) {
      const int64_t rep = bi / S;
      ws.XT = xt + rep * p * n;
      ws.y = yp + rep * n;
      const Outcome o = solve<T>(ws, th + bi * P, lo, hi, set);
      lp[bi] = o.loss; gp[bi] = o.gnorm; ip[bi] = o.n_iter; sp[bi] = o.status; ep[bi] = o.evals;
    }
  });
}

}  // namespace

// theta (B, 2k*p) starts (row j of problem b at [j*p, (j+1)*p)), XT (R, p, n) augmented inputs transposed, y (R, n),
// problem b on replicate b / S; free_idx the optimised coordinates (increasing); lower/upper (P,) or empty (no box);
// gate a Gate code and top_k the experts a TOPK gate keeps.  Returns theta (B, P) end points, loss (B,) =
// sum_t r^2 / n, the projected gradient's sup-norm (B,), iterations, status codes (_optim.STATUS) and evaluations (B,).
std::vector<at::Tensor> newton(at::Tensor theta, at::Tensor XT, at::Tensor y, at::Tensor free_idx, at::Tensor lower,
                               at::Tensor upper, int64_t S, int64_t k, int64_t gate, int64_t top_k, int64_t act,
                               bool act2, double tau, int64_t max_iter, double gtol, double damping,
                               int64_t stall_window, double stall_tol, int64_t chunk) {
  TORCH_CHECK(k >= 1 && k <= KMAX, "moe_newton: k must be in [1, ", KMAX, "]");
  TORCH_CHECK(theta.device().is_cpu() && XT.device().is_cpu() && y.device().is_cpu(), "moe_newton: CPU tensors only");
  theta = theta.contiguous().clone(); XT = XT.contiguous(); y = y.contiguous();
  lower = lower.contiguous(); upper = upper.contiguous();
  TORCH_CHECK(theta.dim() == 2 && XT.dim() == 3 && y.dim() == 2, "moe_newton: shapes");
  const int64_t B = theta.size(0), p = XT.size(1), n = XT.size(2);
  TORCH_CHECK(theta.size(1) == 2 * k * p && B % S == 0 && XT.size(0) * S == B, "moe_newton: shapes");
  auto fi = free_idx.to(at::kLong).contiguous();
  std::vector<int64_t> free(fi.data_ptr<int64_t>(), fi.data_ptr<int64_t>() + fi.numel());
  const Model model{k, p, n, gate, top_k, act, act2, tau};
  const Settings set{max_iter, stall_window, gtol, damping, stall_tol};
  auto dopt = at::TensorOptions().dtype(at::kDouble), lopt = at::TensorOptions().dtype(at::kLong);
  auto loss = at::empty({B}, dopt), gnorm = at::empty({B}, dopt);
  auto n_iter = at::empty({B}, lopt), status = at::empty({B}, lopt), evals = at::empty({B}, lopt);
  const int64_t cmax = std::max<int64_t>(1, std::min(chunk, n));
  AT_DISPATCH_FLOATING_TYPES(theta.scalar_type(), "moe_newton", [&] {
    newton_impl<scalar_t>(theta, XT, y, lower, upper, free, model, S, cmax, set, loss, gnorm, n_iter, status, evals);
  });
  return {theta, loss, gnorm, n_iter, status, evals};
}

// The loop's own objective (sum_t r_t^2 / n), b = J^T r / n and H (half the exact Hessian) at one theta (2k*p), on the
// free coordinates: what each Newton iteration builds, exposed for the saddle check, the tests and the benchmarks.
// small_product: the largest mu * mx whose pair sums run in tiles rather than BLAS (negative: the loop's
// SMALL_PRODUCT); evaluations: how many times to evaluate with one workspace, as the loop does (for timing).
std::vector<at::Tensor> value_hessian(at::Tensor theta, at::Tensor XT, at::Tensor y, at::Tensor free_idx, int64_t k,
                                      int64_t gate, int64_t top_k, int64_t act, bool act2, double tau, int64_t chunk,
                                      int64_t small_product, int64_t evaluations) {
  TORCH_CHECK(k >= 1 && k <= KMAX, "moe_newton: k must be in [1, ", KMAX, "]");
  theta = theta.contiguous(); XT = XT.contiguous(); y = y.contiguous();
  const int64_t p = XT.size(0), n = XT.size(1);
  TORCH_CHECK(theta.numel() == 2 * k * p && y.numel() == n, "moe_newton: shapes");
  auto fi = free_idx.to(at::kLong).contiguous();
  std::vector<int64_t> free(fi.data_ptr<int64_t>(), fi.data_ptr<int64_t>() + fi.numel());
  const int64_t F = int64_t(free.size());
  const Model model{k, p, n, gate, top_k, act, act2, tau};
  auto loss = at::empty({}, theta.options()), b = at::empty({F}, theta.options()), H = at::empty({F, F}, theta.options());
  AT_DISPATCH_FLOATING_TYPES(theta.scalar_type(), "moe_newton_hessian", [&] {
    Workspace<scalar_t> ws(model, std::max<int64_t>(1, std::min(chunk, n)), free,
                           small_product < 0 ? SMALL_PRODUCT : small_product);
    ws.XT = XT.data_ptr<scalar_t>();
    ws.y = y.data_ptr<scalar_t>();
    scalar_t value = 0;
    for (int64_t e = 0; e < std::max<int64_t>(1, evaluations); ++e)
      value = ws.value_hessian(theta.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), H.data_ptr<scalar_t>());
    loss.fill_(value / scalar_t(n));
  });
  return {loss, b, H};
}

// torch.ops.<extension name>.<function> (_native.py); the indirection expands TORCH_EXTENSION_NAME first
#define MOESTAT_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
MOESTAT_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("newton", &newton);  // Trust-region Newton for MoE least squares, one run per problem
  m.def("value_hessian", &value_hessian);  // Objective, half gradient and half exact Hessian at one point
}
