// Objective and gradient of the MoE least-squares problem, fused and cache-blocked (moestat/fit/_native.py builds it).
//
// For each group g (a replicate) and each block of `chunk` observations:
//   Z   = Theta_g  X_c^T                      (S*2k x c; one BLAS call)
//   U   = c_t df/dZ, loss += sum_t r_t^2      (one pass over the block, vectorised with at::vec)
//   grad_g += U X_c                           (one BLAS call)
// The block's inputs, Z and U stay in cache between the three steps.  The element-wise formulas are those of
// moestat/fit/_objective.py (module docstring): expert rows c pi phi'(z_e); sigmoid gate rows
// c h pi (1 - pi) / tau; softmax gate rows c pi (h - f) / tau.
#include <ATen/ATen.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <vector>

namespace {

// KMAX, Gate, activation(), activation_second(), gate_weights(): _native_common.cpp, inserted here.
// @NATIVE_COMMON@

// One block: Z (S*2k x ldz rows, first c columns) -> U (same layout), loss[s] += sum_t r^2.
template <typename T>
void block(const T* Z, const T* y, T* U, T* loss, int64_t S, int64_t k, int64_t c, int64_t ld, int64_t gate,
           int64_t top_k, int64_t act, T inv_tau, T scale) {
  using V = at::vec::Vectorized<T>;
  constexpr int64_t W = V::size();
  V pi[KMAX], h[KMAX], dh[KMAX];
  const V one(T(1));
  for (int64_t s = 0; s < S; ++s) {
    const T* zs = Z + s * 2 * k * ld;
    T* us = U + s * 2 * k * ld;
    V acc(T(0));
    for (int64_t t = 0; t < c; t += W) {
      const int64_t m = std::min<int64_t>(W, c - t);
      for (int64_t i = 0; i < k; ++i) {
        pi[i] = V::loadu(zs + i * ld + t, m) * V(inv_tau);
        activation<T>(act, V::loadu(zs + (k + i) * ld + t, m), h[i], dh[i]);
      }
      gate_weights<T>(gate, top_k, k, pi);
      V f(T(0));
      for (int64_t i = 0; i < k; ++i) f = at::vec::fmadd(pi[i], h[i], f);
      V r = f - V::loadu(y + t, m);
      if (m < W) r = V::set(V(T(0)), r, m);  // lanes past the block end contribute nothing
      acc = at::vec::fmadd(r, r, acc);
      const V cr = r * V(scale);
      for (int64_t i = 0; i < k; ++i) {
        const V pc = cr * pi[i];
        const V ug = (gate == SIGMOID ? pc * h[i] * (one - pi[i]) : pc * (h[i] - f)) * V(inv_tau);
        ug.store(us + i * ld + t, m);
        (pc * dh[i]).store(us + (k + i) * ld + t, m);
      }
    }
    T buf[W];
    acc.store(buf);
    T sum = 0;
    for (int64_t j = 0; j < W; ++j) sum += buf[j];
    loss[s] += sum;
  }
}

// Blocks [begin, end) of the flattened (group, block) index into this thread's accumulators.
template <typename T>
void run_blocks(const at::Tensor& theta, const at::Tensor& X, const T* yp, T* lp, at::Tensor& grad, int64_t begin,
                int64_t end, int64_t cmax, int64_t k, int64_t gate, int64_t top_k, int64_t act, T inv_tau, T scale) {
  const int64_t SK = theta.size(1), n = X.size(1), S = SK / (2 * k);
  const int64_t nb = (n + cmax - 1) / cmax;
  auto Zbuf = at::empty({SK * cmax}, theta.options()), Ubuf = at::empty({SK * cmax}, theta.options());
  for (int64_t task = begin; task < end; ++task) {
    const int64_t g = task / nb, lo = (task % nb) * cmax, c = std::min(cmax, n - lo);
    const at::Tensor Xc = X[g].narrow(0, lo, c);
    at::Tensor Zc = Zbuf.narrow(0, 0, SK * c).view({SK, c}), Uc = Ubuf.narrow(0, 0, SK * c).view({SK, c});
    at::mm_out(Zc, theta[g], Xc.t());
    block<T>(Zc.data_ptr<T>(), yp + g * n + lo, Uc.data_ptr<T>(), lp + g * S, S, k, c, c, gate, top_k, act, inv_tau,
             scale);
    grad[g].addmm_(Uc, Xc);
  }
}

// With several torch threads the (group, block) pairs are split into one contiguous range per thread, each
// accumulating into its own loss and gradient, summed at the end: the result depends on the number of threads
// only through the order of that final sum.
template <typename T>
void value_grad_impl(const at::Tensor& theta, const at::Tensor& X, const at::Tensor& y, at::Tensor& loss,
                     at::Tensor& grad, int64_t k, int64_t gate, int64_t top_k, int64_t act, double tau,
                     int64_t chunk) {
  const int64_t G = theta.size(0), n = X.size(1);
  const int64_t cmax = std::max<int64_t>(1, std::min(chunk, n));
  const int64_t tasks = G * ((n + cmax - 1) / cmax);
  const T inv_tau = T(1.0 / tau), scale = T(2.0 / double(n));
  const T* yp = y.data_ptr<T>();
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), tasks);
  if (threads <= 1) {
    run_blocks<T>(theta, X, yp, loss.data_ptr<T>(), grad, 0, tasks, cmax, k, gate, top_k, act, inv_tau, scale);
    return;
  }
  auto losses = at::zeros({threads, loss.size(0), loss.size(1)}, loss.options());
  auto grads = at::zeros({threads, grad.size(0), grad.size(1), grad.size(2)}, grad.options());
  const int64_t per = (tasks + threads - 1) / threads;
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      at::Tensor gt = grads[t];
      run_blocks<T>(theta, X, yp, losses[t].data_ptr<T>(), gt, t * per, std::min(tasks, (t + 1) * per), cmax, k,
                    gate, top_k, act, inv_tau, scale);
    }
  });
  loss.copy_(losses.sum(0));
  grad.copy_(grads.sum(0));
}

}  // namespace

// theta (G, S*2k, p), X (G, n, p) augmented inputs, y (G, n); gate a Gate code (top_k: the experts a TOPK gate keeps);
// returns loss (G, S) = sum_t r^2 / n and grad (G, S*2k, p).
std::vector<at::Tensor> value_grad(at::Tensor theta, at::Tensor X, at::Tensor y, int64_t k, int64_t gate,
                                   int64_t top_k, int64_t act, double tau, int64_t chunk) {
  TORCH_CHECK(k >= 1 && k <= KMAX, "moe_lsq: k must be in [1, ", KMAX, "]");
  TORCH_CHECK(theta.device().is_cpu() && X.device().is_cpu() && y.device().is_cpu(), "moe_lsq: CPU tensors only");
  theta = theta.contiguous(); X = X.contiguous(); y = y.contiguous();
  TORCH_CHECK(theta.dim() == 3 && X.dim() == 3 && y.dim() == 2 && theta.size(1) % (2 * k) == 0, "moe_lsq: shapes");
  const int64_t G = theta.size(0), SK = theta.size(1), p = theta.size(2), n = X.size(1);
  auto loss = at::zeros({G, SK / (2 * k)}, theta.options());
  auto grad = at::zeros({G, SK, p}, theta.options());
  AT_DISPATCH_FLOATING_TYPES(theta.scalar_type(), "moe_lsq", [&] {
    value_grad_impl<scalar_t>(theta, X, y, loss, grad, k, gate, top_k, act, tau, chunk);
  });
  loss.div_(double(n));
  return {loss, grad};
}

// torch.ops.<extension name>.<function> (_native.py); the indirection expands TORCH_EXTENSION_NAME first
#define MOESTAT_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
MOESTAT_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("value_grad", &value_grad);  // MoE least-squares objective and gradient
}
