// Element-wise pieces shared by the native kernels (_lsq_native.cpp, _newton_native.cpp): moestat/fit/_native.py
// inserts this file at each kernel's "@NATIVE_COMMON@" marker, inside its anonymous namespace, and then generates
// the activation cases from the expert registry (ExpertFamily.native and native_second in moestat/experts.py).

constexpr int64_t KMAX = 32;

enum Gate : int64_t { SIGMOID = 0, SOFTMAX = 1, TOPK = 2 };

// phi(z) and phi'(z) of expert family number `act`.
template <typename T>
inline void activation(int64_t act, const at::vec::Vectorized<T>& z, at::vec::Vectorized<T>& h,
                       at::vec::Vectorized<T>& dh) {
  using V = at::vec::Vectorized<T>;
  const V one(T(1)), zero(T(0));
  switch (act) {
    // @ACTIVATION_CASES@
    default: h = z; dh = one;
  }
}

// phi''(z) of expert family number `act`, from z and the phi(z), phi'(z) of `activation`.
template <typename T>
inline void activation_second(int64_t act, const at::vec::Vectorized<T>& z, const at::vec::Vectorized<T>& h,
                              const at::vec::Vectorized<T>& dh, at::vec::Vectorized<T>& d2h) {
  using V = at::vec::Vectorized<T>;
  const V one(T(1)), zero(T(0));
  (void)one; (void)h; (void)dh;
  switch (act) {
    // @SECOND_DERIVATIVE_CASES@
    default: d2h = zero;
  }
}

// Max-shifted softmax of pi_1..pi_k in place; Masked: over the experts whose `kept` lanes are set, zero elsewhere (a
// template argument, so that the dense softmax carries no mask test).
template <typename T, bool Masked>
inline void softmax_in_place(int64_t k, at::vec::Vectorized<T>* pi, const at::vec::Vectorized<T>* kept) {
  using V = at::vec::Vectorized<T>;
  V mx = pi[0];
  for (int64_t i = 1; i < k; ++i) mx = at::vec::maximum(mx, pi[i]);
  V tot(T(0));
  for (int64_t i = 0; i < k; ++i) {
    pi[i] = (pi[i] - mx).exp();
    if constexpr (Masked) pi[i] = V::blendv(V(T(0)), pi[i], kept[i]);
    tot = tot + pi[i];
  }
  const V inv = V(T(1)) / tot;
  for (int64_t i = 0; i < k; ++i) pi[i] = pi[i] * inv;
}

// Gate weights pi_1..pi_k in place from the tempered logits pi_i = z_i / tau: sigmoid, softmax (max-shifted), or
// top-K softmax: the softmax of the top_k largest logits of each observation, zero for the others (an expert is kept
// when fewer than top_k logits exceed it, counting equal logits of lower index as larger).  Zero weights outside the
// top K make the softmax formulas of the derivatives those of the softmax over the kept experts.
template <typename T>
inline void gate_weights(int64_t gate, int64_t top_k, int64_t k, at::vec::Vectorized<T>* pi) {
  using V = at::vec::Vectorized<T>;
  const V one(T(1)), zero(T(0));
  if (gate == SIGMOID) {
    for (int64_t i = 0; i < k; ++i) pi[i] = one / (one + pi[i].neg().exp());
  } else if (gate == TOPK && top_k < k) {
    V kept[KMAX];
    const V cap = V(static_cast<T>(top_k));
    for (int64_t i = 0; i < k; ++i) {
      V rank = zero;
      for (int64_t j = 0; j < k; ++j)
        if (j != i) rank = rank + V::blendv(zero, one, j < i ? pi[j] >= pi[i] : pi[j] > pi[i]);
      kept[i] = rank < cap;
    }
    softmax_in_place<T, true>(k, pi, kept);
  } else {
    softmax_in_place<T, false>(k, pi, nullptr);
  }
}
