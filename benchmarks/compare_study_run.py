"""A run of the flagship study on other hardware against the checked-in run: row by row, then verdict by verdict.

    PYTHONPATH=. python benchmarks/compare_study_run.py CELLS [--reference docs/vignettes/sigmoid-vs-softmax]

CELLS is a study's cell folder (``OUT/cells/*.parquet``, as ``benchmarks/study_fig1.py --full --out OUT`` leaves it)
or one parquet file of its rows.  Rows are matched by truth, gate, n and replicate (the cell id's last part is a
hash of the options, which a timed run may change, e.g. ``--gbar-compile``).  Printed: the fits' statuses in both
runs, the relative difference of their objectives, and the vignette's rate table and paired gate comparison
computed from both frames, with the verdicts side by side.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import pandas as pd

import moestat as ms
from moestat import _vignette_index


def read_rows(path: Path) -> pd.DataFrame:
    """The rows of a cell folder or of one parquet file, with a fresh index."""
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise SystemExit(f"{path}: no parquet files")
    return pd.concat((pd.read_parquet(f) for f in files), ignore_index=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cells", type=Path)
    ap.add_argument("--reference", type=Path, default=Path("docs/vignettes/sigmoid-vs-softmax"))
    args = ap.parse_args()
    vignette = _vignette_index.load(_vignette_index.find("sigmoid-vs-softmax"))
    run = ms.lowest_objective(read_rows(args.cells), vignette.RESPONSES, names=("newton", "lm"))
    ref = pd.read_csv(args.reference / "results.csv")
    for frame in (run, ref):
        frame["match"] = frame["cell"].str.rsplit("__", n=1).str[0]
    rows = run.merge(ref, on=["match", "rep"], suffixes=("_run", "_ref"))
    print(f"rows: {len(run)} in the run, {len(ref)} in the reference, {len(rows)} matched")
    print(pd.crosstab(rows["status_run"], rows["status_ref"]).to_string())
    rel = (rows["objective_run"] / rows["objective_ref"] - 1).abs()
    ok = (rows["status_run"] == "ok") & (rows["status_ref"] == "ok")
    print(f"|relative objective difference| where both are ok ({ok.sum()} rows): median {rel[ok].median():.2g}, "
          f"max {rel[ok].max():.2g}; rows above 1e-6: {(rel > 1e-6).sum()}")
    if "device_run" in rows:
        print(rows[ok].assign(rel=rel[ok]).groupby("device_run")["rel"].agg(["count", "median", "max"]).to_string())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rates, _, comparison = vignette.rate_tables(run)
    ref_rates = pd.read_csv(args.reference / "rates.csv")
    ref_comparison = pd.read_csv(args.reference / "comparison.csv")
    key = ["expert", "gate", "response", "solver"]
    both = rates.merge(ref_rates, on=key, suffixes=("_run", "_ref"))
    pd.set_option("display.width", 250)
    print(both[[*key, "exponent_run", "exponent_ref", "verdict_run", "verdict_ref"]].to_string(index=False))
    key_c = ["expert", "response", "solver"]
    both_c = comparison.merge(ref_comparison, on=key_c, suffixes=("_run", "_ref"))
    print(both_c[[*key_c, "difference_run", "difference_ref", "p_value_run", "p_value_ref", "verdict_run",
                  "verdict_ref"]].to_string(index=False))
    for name, table in (("rate", both), ("comparison", both_c)):
        same = table["verdict_run"] == table["verdict_ref"]
        headline = table["solver"] == "lowest objective"
        print(f"{name} verdicts equal: {same.sum()} of {len(table)} (headline, lowest objective: "
              f"{(same & headline).sum()} of {headline.sum()})")


if __name__ == "__main__":
    main()
