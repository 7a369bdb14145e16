"""ADEMP reports of a study (moestat study report) and its performance table (moestat study performance)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomllib

from moestat.cli import main
from moestat.study import Study
from moestat.study_report import markdown_table, metric_columns

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]

STUDY_TOML = """
name = "tiny-likelihood"
seed = 4
reps = 3
n = [40, 80, 160]
metrics = ["gaussian_voronoi", "tests.study_cells:slope_error"]
max_failures = 0.5

[ademp]
aims = "Check that the MLE of a one-expert Gaussian regression converges at the parametric rate."
estimands = ["the Voronoi loss D1", "the expert slopes"]

[truth]
label = "lin"
gate = "softmax"
expert = "linear"
k = 1
d = 3
noise_sd = 0.5
model = "mixture"
params = { gate_bias = [0.0], gate_weight = [[0.0, 0.0, 0.0]], expert_weight = [[1.0, -2.0, 0.5]], expert_bias = [0.3] }

[[fit]]
label = "mle"
estimator = "mle"
options = { init = "near_truth", restarts = 1 }

[[fit]]
label = "picky"
estimator = "tests.study_cells:picky_ols"
options = { y0_below = 0.0 }
"""

SECTIONS = ["Aims", "Data-generating mechanisms", "Estimands", "Methods", "Performance measures"]


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    toml = folder / "tiny.toml"
    toml.write_text(STUDY_TOML)
    out = folder / "out"
    with pytest.warns(Warning):  # the picky fit's not-converged replicates are reported (StudyFailureWarning)
        assert main(["study", "run", str(toml), "--out", str(out), "--quiet"]) == 0
    return out


def _section(text: str, title: str) -> str:
    """The body of the markdown section ``title``, up to the next heading of the same or a higher level."""
    m = re.search(rf"^(#+) {re.escape(title)}\n", text, flags=re.M)
    assert m, f"section {title!r} missing"
    end = re.search(rf"^#{{1,{len(m.group(1))}}} ", text[m.end():], flags=re.M)
    return text[m.end(): m.end() + end.start() if end else None].strip()


def test_report_fills_every_ademp_section(study_dir, capsys):
    assert main(["study", "report", str(study_dir)]) == 0
    assert "report.md" in capsys.readouterr().out
    text = (study_dir / "report.md").read_text()
    for title in SECTIONS:
        body = _section(text, title)
        assert len(body) > 40, (title, body)
    # given in [ademp]: verbatim, not marked derived; absent: derived from the configuration
    assert _section(text, "Aims").startswith("Check that the MLE of a one-expert Gaussian regression")
    assert "- the Voronoi loss D1\n- the expert slopes" in _section(text, "Estimands")
    assert "derived from the configuration" not in _section(text, "Aims")
    for title in ("Data-generating mechanisms", "Methods", "Performance measures"):
        assert "_(derived from the configuration)_" in _section(text, title)
    dgm = _section(text, "Data-generating mechanisms")
    assert "| lin | explicit | softmax | linear | 1 | 3 | 0.5 | mixture | uniform |" in dgm
    assert "n in {40, 80, 160}, 3 replicate" in dgm
    methods = _section(text, "Methods")
    assert "| mle | mle |" in methods and "| picky | picky_ols |" in methods


def test_report_failures_performance_and_rates(study_dir):
    assert main(["study", "report", str(study_dir)]) == 0
    text = (study_dir / "report.md").read_text()
    frame = pd.read_parquet(study_dir / "results.parquet")
    status = frame["status"]
    failures = _section(text, "Failures")
    assert f"{(status == 'ok').sum()} fits ok, {(status == 'not_converged').sum()} not converged, 0 errors" in failures
    picky = frame[frame["fit"] == "picky"]
    for n, sub in picky.groupby("n"):  # the failure table counts every cell's statuses
        ok, nc = (sub["status"] == "ok").sum(), (sub["status"] == "not_converged").sum()
        assert f"| lin | picky | {n} | {ok} | {nc} | 0 |" in failures
    perf = _section(text, "Performance")
    assert "| truth | fit | n | kind | quantity | measure | estimate | mcse | n_reps |" in perf
    assert "| lin | mle | 40 | parameter | expert[0]:x1 | coverage |" in perf
    table = pd.read_csv(study_dir / "performance.csv")
    assert {"metric", "parameter"} == set(table["kind"])
    rates = _section(text, "Convergence rates")
    assert "| truth | fit | model | exponent | ci_low | ci_high | verdict |" in rates
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):  # every linked figure exists
        assert (study_dir / link).is_file() and (study_dir / link).stat().st_size > 1000
    assert (study_dir / "report" / "rate_gaussian_voronoi.png").is_file()
    assert set(pd.read_csv(study_dir / "rates.csv")["y"]) == {"gaussian_voronoi", "slope_error"}


def test_performance_command_prints_and_writes_csv(study_dir, capsys):
    out = study_dir / "perf.csv"
    assert main(["study", "performance", str(study_dir), "--converged-only", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gaussian_voronoi" in printed and "mcse" in printed
    table = pd.read_csv(out)
    frame = pd.read_parquet(study_dir / "results.parquet")
    # --converged-only: each picky cell's metric rows use only its converged replicates
    for n, sub in frame[frame["fit"] == "picky"].groupby("n"):
        ok = sub[sub["status"] == "ok"]["slope_error"].to_numpy()
        row = table[(table["fit"] == "picky") & (table["n"] == n) & (table["quantity"] == "slope_error")
                    & (table["measure"] == "mean")]
        if len(ok):
            np.testing.assert_allclose(row["estimate"], ok.mean(), rtol=1e-9)
            assert int(row["n_reps"].iloc[0]) == len(ok)
        else:
            assert row.empty
    assert main(["study", "performance", str(study_dir), "--metrics", "D7"]) == 2
    assert "metrics ['D7'] are not columns" in capsys.readouterr().err
    assert main(["study", "report", str(study_dir / "nowhere")]) == 2


def test_markdown_table_and_metric_columns():
    frame = pd.DataFrame({"a": [1.0, np.nan], "b": ["x|y", "z"]})
    assert markdown_table(frame) == "| a | b |\n|---|---|\n| 1 | x\\|y |\n|  | z |"
    assert markdown_table(frame.iloc[:0]) == "_(none)_"
    cols = pd.DataFrame({"err_over_gate_bias": [1.0], "err_exact_expert": [1.0], "D1": [1.0], "D1_alt": [1.0],
                         "loss": ["x"]})
    assert metric_columns(cols, ["parameter_errors", "D1", "loss"]) == ["err_over_gate_bias", "err_exact_expert",
                                                                       "D1"]


def test_the_documented_toml_example_is_a_valid_study():
    """docs/studies.md's example with [ademp], estimator = "mle" and max_failures parses and validates."""
    text = (ROOT / "docs" / "studies.md").read_text()
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", text, flags=re.S) if "[ademp]" in b]
    assert blocks, "docs/studies.md lost its TOML example with [ademp]"
    doc = tomllib.loads(blocks[0])
    study = Study.from_dict(doc)
    assert study.ademp and study.max_failures is not None
    assert any(f["estimator"] == "mle" for f in study.fits)


def test_rate_section_by_cell_pattern_fits_the_patterns_seen_at_enough_sizes(tmp_path):
    """One Voronoi cell pattern at five sample sizes, a rare one at two: the rare pattern no longer blanks the
    by-pattern fit; it is listed with its replicates.  The losses are exact powers of n (slope 1/2) times a fixed
    lognormal factor per replicate, so the fitted exponent is 1/2 up to the noise of 4 replicates per n."""
    from moestat.study_report import _rate_section

    rng = np.random.default_rng(3)
    rows = []
    for n in (1000, 2000, 4000, 8000, 16000):
        for rep in range(4):
            rows.append({"truth": "t", "fit": "K3", "n": n, "rep": rep, "cell_sizes": "2,1",
                         "gaussian_voronoi": n ** -0.5 * np.exp(0.1 * rng.normal())})
    for n, rep in ((1000, 4), (2000, 5)):
        rows.append({"truth": "t", "fit": "K3", "n": n, "rep": rep, "cell_sizes": "1,1,1",
                     "gaussian_voronoi": 0.05})
    frame = pd.DataFrame(rows)
    fig_dir = tmp_path / "report"
    fig_dir.mkdir()
    text, tables = _rate_section(frame, ["gaussian_voronoi"], fig_dir, tmp_path, 0.95)
    assert "No rate fit" not in text
    by_pattern = [t for t in tables if "cell_sizes" in t.columns]
    assert len(by_pattern) == 1 and list(by_pattern[0]["cell_sizes"]) == ["2,1"]
    # 4 replicates x 5 sizes with log-noise sd 0.1: the exponent's SE is ~0.03, so 0.1 is > 3 SE
    assert abs(float(by_pattern[0]["exponent"].iloc[0]) - 0.5) < 0.1
    assert "fewer than 3 sample sizes" in text and "1,1,1" in text
