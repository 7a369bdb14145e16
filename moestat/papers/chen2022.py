r"""Chen, Deng, Wu, Gu & Li (2022), "Towards Understanding Mixture of Experts in Deep Learning" (NeurIPS 2022).

Its data are clustered patches (:func:`moestat.simulate_clusters`); its models a mixture of two-layer CNN experts
with a top-1 router and a single CNN (:mod:`moestat.deep`).  The paper proves accuracy statements rather than
rates, so it adds no rows to :func:`moestat.rates.theory_rates`.
"""

from __future__ import annotations

__all__ = ["REFERENCE"]

REFERENCE = ("Chen, Z., Deng, Y., Wu, Y., Gu, Q. and Li, Y. (2022). Towards understanding mixture of experts in deep "
             "learning. Advances in Neural Information Processing Systems 35.")
