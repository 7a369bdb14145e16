// The L-BFGS phase of fit_mle(compile=True), one fused loop per (replicate, restart) pair; inserted into
// _em_native.cpp at its @MLE_LBFGS@ marker (moestat/fit/_native.py), whose helpers (V, W, hsum, cumulant,
// mean_of, the family codes) it uses.
//
// Objective: the negative mean log-likelihood of a softmax-gated mixture of Gaussian, Poisson or binomial experts on
// the packed vector v of moestat.fit._layout.ParamLayout (gate rows j < k-1 of pg terms, the last expert the
// reference; expert rows of pe terms; q shared slopes; Gaussian: k log-scales rho_j, sd_j^2 = floor^2 + e^(2 rho_j)):
//   a_jt = alpha_j z^g_t,  eta_jt = beta_j z^e_t + gamma s_t + o_t,
//   log f_jt = -(y_t - eta_jt)^2 / (2 sd_j^2) - log(sd_j^2) / 2 - log(2 pi) / 2   (Gaussian)
//            = m_t [y_t eta_jt - b(eta_jt)] + c_t                                  (Poisson, binomial),
//   l_t = log sum_j exp(log pi_jt + log f_jt),  L = -(1/n) sum_t w_t l_t,
// and its gradient through the responsibilities tau_jt = exp(log pi_jt + log f_jt - l_t):
//   dL/dalpha_j = -(1/n) sum_t w (tau_j - pi_j) z^g,  dL/dbeta_j = -(1/n) sum_t w tau_j u_j z^e,
//   dL/dgamma = -(1/n) sum_t w sum_j tau_j u_j s,     dL/drho_j = -(1/n) sum_t w tau_j (r_j^2 / sd_j^2 - 1) e^(2 rho_j) / sd_j^2,
// with u_j = r_j / sd_j^2 (Gaussian, r_j = y - eta_j) or m (y - mu_j) (canonical links).
//
// Optimiser: moestat.fit._optim.lbfgs step for step (Nocedal & Wright 2006, Alg. 7.4 for H g; backtracking
// Armijo search with safeguarded quadratic interpolation; the curvature test for storing a pair; the gtol, ftol,
// line-search and iteration-cap stops and their status codes 1, 2, 5, 4), written for one pair at a time.  The
// products run in another order, so results agree with the tensor loop to rounding, not bit for bit.

namespace {

// the length of the packed vector: gate rows, expert rows, shared slopes, Gaussian log-scales
inline int64_t packed_size(int64_t k, int64_t pg, int64_t pe, int64_t q, int64_t family) {
  return (k - 1) * pg + k * pe + q + (family == GAUSSIAN ? k : 0);
}

struct MixtureObjective {
  const double* y;
  const double* w;    // or null
  const double* Zg;   // pg x n
  const double* Ze;   // pe x n
  const double* Zs;   // q x n or null
  const double* m;    // trials or null
  const double* off;  // offset or null
  const double* cst;  // GLM log-density constant or null
  int64_t n, k, pg, pe, q, family;
  double floor2;
  std::vector<double> logw, eta, lc;  // k x n

  int64_t size() const { return packed_size(k, pg, pe, q, family); }

  // the lanes of x from cnt on set to 0 (a block's tail beyond the last observation)
  static V head(const V& x, int64_t cnt) { return cnt < W ? V::set(V(0.0), x, cnt) : x; }

  // log gate weights (k x n) of the gate rows of v; the reference expert k-1 has logit 0
  void gate_log_weights(const double* v) {
    for (int64_t j = 0; j < k - 1; ++j) {
      double* row = logw.data() + j * n;
      std::fill(row, row + n, 0.0);
      for (int64_t a = 0; a < pg; ++a) {
        const double c = v[j * pg + a];
        const double* z = Zg + a * n;
        for (int64_t t = 0; t < n; ++t) row[t] += c * z[t];
      }
    }
    double* ref = logw.data() + (k - 1) * n;
    for (int64_t t = 0; t < n; t += W) {
      const int64_t cnt = std::min<int64_t>(W, n - t);
      V mx(0.0);
      for (int64_t j = 0; j < k - 1; ++j) mx = at::vec::maximum(mx, V::loadu(logw.data() + j * n + t, cnt));
      mx = V::blendv(mx, V(0.0), mx.abs() == V(INF));
      V s = (V(0.0) - mx).exp();
      for (int64_t j = 0; j < k - 1; ++j) s = s + (V::loadu(logw.data() + j * n + t, cnt) - mx).exp();
      const V lse = s.log() + mx;
      for (int64_t j = 0; j < k - 1; ++j)
        (V::loadu(logw.data() + j * n + t, cnt) - lse).store(logw.data() + j * n + t, cnt);
      (V(0.0) - lse).store(ref + t, cnt);
    }
  }

  // L(v); its gradient into g (size())
  double operator()(const double* v, double* g) {
    const int64_t ng = (k - 1) * pg, ne = k * pe;
    const double* beta = v + ng;
    const double* gamma = v + ng + ne;
    const double* rho = v + ng + ne + q;
    gate_log_weights(v);
    std::vector<double> sd2(k, 0.0), share(k, 0.0), norm(k, 0.0);
    for (int64_t j = 0; j < k; ++j) {  // linear predictors
      double* e = eta.data() + j * n;
      for (int64_t t = 0; t < n; ++t) e[t] = off != nullptr ? off[t] : 0.0;
      for (int64_t a = 0; a < pe; ++a) {
        const double c = beta[j * pe + a];
        const double* z = Ze + a * n;
        for (int64_t t = 0; t < n; ++t) e[t] += c * z[t];
      }
      for (int64_t a = 0; a < q; ++a) {
        const double c = gamma[a];
        const double* z = Zs + a * n;
        for (int64_t t = 0; t < n; ++t) e[t] += c * z[t];
      }
      if (family == GAUSSIAN) {
        share[j] = std::exp(2.0 * rho[j]);
        sd2[j] = floor2 + share[j];
        norm[j] = 0.5 * std::log(sd2[j]) + HALF_LOG_2PI;
      }
    }
    // per block of observations: log joint densities c_j, l_t, then the gate scores (into lc) and the scores of
    // eta_j (into eta)
    V value(0.0);
    V drho[64];
    for (int64_t j = 0; j < k; ++j) drho[j] = V(0.0);
    for (int64_t t = 0; t < n; t += W) {
      const int64_t cnt = std::min<int64_t>(W, n - t);
      const V yv = V::loadu(y + t, cnt);
      const V wv = w != nullptr ? V::loadu(w + t, cnt) : V(1.0);
      const V mv = m != nullptr ? V::loadu(m + t, cnt) : V(1.0);
      V c[64], u[64], r[64];
      V mx(-INF);
      for (int64_t j = 0; j < k; ++j) {
        const V e = V::loadu(eta.data() + j * n + t, cnt);
        V lf;
        if (family == GAUSSIAN) {
          r[j] = yv - e;
          u[j] = r[j] / V(sd2[j]);
          lf = V(-0.5) * r[j] * u[j] - V(norm[j]);
        } else {
          const V mu = mean_of(family, e);
          u[j] = mv * (yv - mu);
          lf = mv * (yv * e - (family == POISSON ? mu : cumulant(family, e)));
          if (cst != nullptr) lf = lf + V::loadu(cst + t, cnt);
        }
        c[j] = V::loadu(logw.data() + j * n + t, cnt) + lf;
        mx = at::vec::maximum(mx, c[j]);
      }
      mx = V::blendv(mx, V(0.0), mx.abs() == V(INF));  // an infinite maximum shifts by 0, as torch.logsumexp
      V s(0.0);
      for (int64_t j = 0; j < k; ++j) s = s + (c[j] - mx).exp();
      const V l = s.log() + mx;
      value = value + head(wv * l, cnt);
      for (int64_t j = 0; j < k; ++j) {
        const V wtau = wv * (c[j] - l).exp();
        (wtau - wv * V::loadu(logw.data() + j * n + t, cnt).exp()).store(lc.data() + j * n + t, cnt);
        (wtau * u[j]).store(eta.data() + j * n + t, cnt);
        if (family == GAUSSIAN) drho[j] = drho[j] + head(wtau * (r[j] * u[j] - V(1.0)), cnt);
      }
    }
    double total = hsum(value);
    const double scale = -1.0 / static_cast<double>(n);
    for (int64_t j = 0; j < k - 1; ++j)
      for (int64_t a = 0; a < pg; ++a) g[j * pg + a] = scale * dot3(lc.data() + j * n, Zg + a * n, nullptr, n);
    for (int64_t j = 0; j < k; ++j)
      for (int64_t a = 0; a < pe; ++a) g[ng + j * pe + a] = scale * dot3(eta.data() + j * n, Ze + a * n, nullptr, n);
    for (int64_t a = 0; a < q; ++a) {
      double sum = 0.0;
      for (int64_t j = 0; j < k; ++j) sum += dot3(eta.data() + j * n, Zs + a * n, nullptr, n);
      g[ng + ne + a] = scale * sum;
    }
    if (family == GAUSSIAN)
      for (int64_t j = 0; j < k; ++j) g[ng + ne + q + j] = scale * hsum(drho[j]) * share[j] / sd2[j];
    return scale * total;
  }
};

inline double max_abs(const std::vector<double>& g) {
  double s = 0.0;
  for (double x : g) s = std::max(s, std::abs(x));
  return s;
}

// One pair's L-BFGS run from v (overwritten by its end point); returns the status, with the loss, sup-norm of the
// gradient, iterations and evaluations through the references.
int64_t lbfgs_pair(MixtureObjective& obj, double* v, int64_t max_iter, double tol, double gtol, int64_t memory,
                   int64_t max_ls, double c1, double& f, double& gn, int64_t& n_iter, int64_t& evals) {
  const int64_t P = obj.size();
  const double tiny = std::numeric_limits<double>::min();
  std::vector<double> theta(v, v + P), g(P), d(P), trial(P), gt(P), s(P), yv(P), alpha(memory);
  std::vector<double> Sh(memory * P, 0.0), Yh(memory * P, 0.0), rho(memory, 0.0);
  double gamma = 1.0;
  bool has_hist = false;
  int64_t ptr = 0, status = 0;
  f = obj(theta.data(), g.data());
  evals = 1;
  n_iter = 0;
  for (int64_t it = 0; it <= max_iter; ++it) {
    gn = max_abs(g);
    if (gn <= gtol) { status = 1; break; }
    if (it == max_iter) { status = 4; break; }
    // two-loop recursion, newest pair first (a slot with rho = 0 is a no-op)
    d = g;
    for (int64_t i = 0; i < memory; ++i) {
      const int64_t j = ((ptr - 1 - i) % memory + memory) % memory;
      double a = 0.0;
      for (int64_t p = 0; p < P; ++p) a += Sh[j * P + p] * d[p];
      a *= rho[j];
      for (int64_t p = 0; p < P; ++p) d[p] -= a * Yh[j * P + p];
      alpha[j] = a;
    }
    for (int64_t p = 0; p < P; ++p) d[p] *= gamma;
    for (int64_t i = memory - 1; i >= 0; --i) {
      const int64_t j = ((ptr - 1 - i) % memory + memory) % memory;
      double b = 0.0;
      for (int64_t p = 0; p < P; ++p) b += Yh[j * P + p] * d[p];
      b *= rho[j];
      for (int64_t p = 0; p < P; ++p) d[p] += Sh[j * P + p] * (alpha[j] - b);
    }
    double gd = 0.0;
    for (int64_t p = 0; p < P; ++p) {
      d[p] = g[p] == 0.0 ? 0.0 : -d[p];
      gd += d[p] * g[p];
    }
    if (!(gd < 0.0)) {  // not a descent direction: steepest descent, memory cleared
      gd = 0.0;
      for (int64_t p = 0; p < P; ++p) {
        d[p] = -g[p];
        gd += d[p] * g[p];
      }
      std::fill(rho.begin(), rho.end(), 0.0);
      gamma = 1.0;
      has_hist = false;
    }
    double dn = 0.0;
    for (double x : d) dn += x * x;
    double t = has_hist ? 1.0 : std::min(1.0 / std::sqrt(dn), 1.0);
    bool pending = true;
    double fn = f;
    for (int64_t ls = 0; ls < max_ls; ++ls) {
      double dec = 0.0;
      for (int64_t p = 0; p < P; ++p) {
        trial[p] = theta[p] + t * d[p];
        dec += g[p] * (trial[p] - theta[p]);
      }
      const double ft = obj(trial.data(), gt.data());
      ++evals;
      if (std::isfinite(ft) && ft <= f + c1 * dec) {
        pending = false;
        fn = ft;
        break;
      }
      const double denom = 2.0 * (ft - f - t * gd);
      const double tq = std::isfinite(ft) && denom > 0.0 ? -gd * t * t / denom : 0.1 * t;
      t = std::min(std::max(tq, 0.1 * t), 0.5 * t);
    }
    ++n_iter;
    double sy = 0.0, ss = 0.0, yy = 0.0;
    if (!pending) {
      for (int64_t p = 0; p < P; ++p) {
        s[p] = trial[p] - theta[p];
        yv[p] = gt[p] - g[p];
        sy += s[p] * yv[p];
        ss += s[p] * s[p];
        yy += yv[p] * yv[p];
      }
    }
    const bool curv = !pending && sy > 1e-10 * std::sqrt(ss) * std::sqrt(yy);
    for (int64_t p = 0; p < P; ++p) {
      Sh[ptr * P + p] = curv ? s[p] : 0.0;
      Yh[ptr * P + p] = curv ? yv[p] : 0.0;
    }
    rho[ptr] = curv ? 1.0 / sy : 0.0;
    if (curv) gamma = sy / std::max(yy, tiny);
    has_hist = has_hist || curv;
    ptr = (ptr + 1) % memory;
    if (pending) { status = 5; gn = max_abs(g); break; }
    const bool small = (f - fn) <= tol * std::max(std::max(std::abs(f), std::abs(fn)), tiny);
    theta.swap(trial);
    g.swap(gt);
    f = fn;
    if (small) { status = 2; gn = max_abs(g); break; }
  }
  std::copy(theta.begin(), theta.end(), v);
  return status;
}

// The batch's data (every pair its own copy, as the callers gather it) and the objective of pair b.
struct MixtureData {
  at::Tensor y, w, Zg, Ze, Zs, trials, offset, constant, floor2;
  int64_t family, k, B, n, pg, pe, q;

  MixtureData(at::Tensor y_, at::Tensor w_, at::Tensor Zg_, at::Tensor Ze_, at::Tensor Zs_, at::Tensor trials_,
              at::Tensor offset_, at::Tensor constant_, at::Tensor floor2_, int64_t family_, int64_t k_)
      : y(y_.contiguous()), w(w_.contiguous()), Zg(Zg_.contiguous()), Ze(Ze_.contiguous()), Zs(Zs_.contiguous()),
        trials(trials_.contiguous()), offset(offset_.contiguous()), constant(constant_.contiguous()),
        floor2(floor2_.contiguous()), family(family_), k(k_) {
    TORCH_CHECK(y.scalar_type() == at::kDouble && y.device().is_cpu(), "lbfgs_softmax: float64 CPU tensors");
    TORCH_CHECK(family >= GAUSSIAN && family <= BINOMIAL, "lbfgs_softmax: family 0, 1 or 2");
    TORCH_CHECK(k >= 1 && k <= 64, "lbfgs_softmax: 1 to 64 experts");
    B = y.size(0); n = y.size(1); pg = Zg.size(1); pe = Ze.size(1); q = Zs.numel() > 0 ? Zs.size(1) : 0;
  }

  int64_t size() const { return packed_size(k, pg, pe, q, family); }

  static const double* row(const at::Tensor& a, int64_t b, int64_t rows, int64_t n) {
    return a.numel() > 0 ? a.data_ptr<double>() + b * rows * n : nullptr;
  }

  MixtureObjective objective(int64_t b) const {
    MixtureObjective obj;
    obj.y = row(y, b, 1, n); obj.w = row(w, b, 1, n); obj.Zg = row(Zg, b, pg, n); obj.Ze = row(Ze, b, pe, n);
    obj.Zs = row(Zs, b, q, n); obj.m = row(trials, b, 1, n); obj.off = row(offset, b, 1, n);
    obj.cst = row(constant, b, 1, n);
    obj.n = n; obj.k = k; obj.pg = pg; obj.pe = pe; obj.q = q; obj.family = family;
    obj.floor2 = floor2.data_ptr<double>()[b];
    obj.logw.assign(k * n, 0.0); obj.eta.assign(k * n, 0.0); obj.lc.assign(k * n, 0.0);
    return obj;
  }
};

}  // namespace

// L-BFGS on the negative mean log-likelihood (comment above) from the packed starts v (B, P), every pair with its own
// data: y (B, n), w (B, n) or empty, Zg (B, pg, n), Ze (B, pe, n), Zs (B, q, n) or empty, trials, offset and
// constant (B, n) or empty, floor2 (B,) the Gaussian variance floor.  Returns [v, loss (B,), grad_norm (B,),
// n_iter (B,), status (B,), evals (B,)].
std::vector<at::Tensor> lbfgs_softmax(at::Tensor v, at::Tensor y, at::Tensor w, at::Tensor Zg, at::Tensor Ze,
                                      at::Tensor Zs, at::Tensor trials, at::Tensor offset, at::Tensor constant,
                                      at::Tensor floor2, int64_t family, int64_t k, int64_t max_iter, double tol,
                                      double gtol, int64_t memory, int64_t max_ls, double c1) {
  const MixtureData data(y, w, Zg, Ze, Zs, trials, offset, constant, floor2, family, k);
  const int64_t B = data.B, P = data.size();
  TORCH_CHECK(v.size(0) == B && v.size(1) == P, "lbfgs_softmax: v has ", v.size(1), " columns, the layout ", P);
  v = v.contiguous().clone();
  at::Tensor loss = at::empty({B}, v.options()), gnorm = at::empty({B}, v.options());
  at::Tensor n_iter = at::zeros({B}, v.options().dtype(at::kLong)), status = at::zeros_like(n_iter),
             evals = at::zeros_like(n_iter);
  double* vp = v.data_ptr<double>();
  double* lp = loss.data_ptr<double>();
  double* gp = gnorm.data_ptr<double>();
  int64_t* ip = n_iter.data_ptr<int64_t>();
  int64_t* sp = status.data_ptr<int64_t>();
  int64_t* ep = evals.data_ptr<int64_t>();
  each_pair(B, [&](int64_t b) {
    MixtureObjective obj = data.objective(b);
    sp[b] = lbfgs_pair(obj, vp + b * P, max_iter, tol, gtol, memory, max_ls, c1, lp[b], gp[b], ip[b], ep[b]);
  });
  return {v, loss, gnorm, n_iter, status, evals};
}

// The objective's value and gradient alone at v (B, P) (arguments as lbfgs_softmax): [loss (B,), grad (B, P)].
std::vector<at::Tensor> mixture_value_grad(at::Tensor v, at::Tensor y, at::Tensor w, at::Tensor Zg, at::Tensor Ze,
                                           at::Tensor Zs, at::Tensor trials, at::Tensor offset, at::Tensor constant,
                                           at::Tensor floor2, int64_t family, int64_t k) {
  const MixtureData data(y, w, Zg, Ze, Zs, trials, offset, constant, floor2, family, k);
  TORCH_CHECK(v.size(0) == data.B && v.size(1) == data.size(), "mixture_value_grad: v has ", v.size(1),
              " columns, the layout ", data.size());
  v = v.contiguous();
  at::Tensor loss = at::empty({data.B}, v.options()), grad = at::empty_like(v);
  for (int64_t b = 0; b < data.B; ++b) {
    MixtureObjective obj = data.objective(b);
    loss.data_ptr<double>()[b] = obj(v.data_ptr<double>() + b * v.size(1), grad.data_ptr<double>() + b * v.size(1));
  }
  return {loss, grad};
}
