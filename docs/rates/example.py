"""Worked example of docs/rates.md: a B.8-like fragile loss, its rate fits and window profile.

    PYTHONPATH=. python docs/rates/example.py   (writes the PNGs next to this file and prints the tables)
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

import moestat as ms

HERE = Path(__file__).parent
pd.set_option("display.width", 140)
rng = np.random.default_rng(2024)

# Two "gates" on the same n grid, 40 replicates each (the CRPE-SGaME design of peers-and-conventions B.1/B.8).
ns = np.geomspace(1e2, 1e5, 12).round()
rows = []
for n in ns:
    for r in range(40):
        noise = np.exp(0.5 * rng.standard_normal(2))
        # a clean n^-1/2 loss, and a fragile one: a fast pre-asymptotic term that hands over to a slow tail
        rows.append({"gate": "sigmoid", "n": n, "rep": r, "D1": 2.0 * n ** -0.5 * noise[0]})
        rows.append({"gate": "softmax", "n": n, "rep": r, "D1": (20 * n ** -1.2 + 0.004 * n ** -0.1) * noise[1]})
frame = pd.DataFrame(rows)

res = ms.fit_rate(frame, y="D1", by="gate", model="all")
print(res.summary())
papers = ms.fit_rate(frame, y="D1", by="gate", agg="mean")
print(papers.table[["gate", "model", "exponent", "ci_low", "ci_high"]].to_string(index=False))
print(ms.compare_rates(frame, y="D1", between="gate").to_string(index=False))
ws = ms.window_sensitivity(frame, y="D1", by="gate", drop="smallest", n_resamples=1000)
print(ws.table[["gate", "dropped", "x_min", "exponent", "ci_low", "ci_high"]].to_string(index=False))
print(ws.glance().to_string(index=False))
print(ms.test_exponent(ms.fit_rate(frame[frame.gate == "sigmoid"], y="D1"), 0.5).to_string(index=False))

fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
fig.subplots_adjust(wspace=0.4)
ms.fit_rate(frame, y="D1", by="gate").plot(ax=axes[0])
ws.plot(ax=axes[1])
fig.savefig(HERE / "fragile.png", dpi=110, bbox_inches="tight")
