"""The moestat command line: study run/check, rates, vignette list/run, exit codes, --help."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import moestat._vignette_index as vindex
from moestat.cli import main
from moestat.study import Study
from tests.study_cells import LINEAR_TRUTH

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def study_toml(tmp_path) -> Path:
    s = Study(truth=LINEAR_TRUTH, fit={"estimator": "ols", "grid": {"options.ridge": [0.0, 4.0]}}, n=[40, 160, 640],
              reps=4, seed=2, name="cli", metrics=["tests.study_cells:slope_error"], threads=1)
    path = tmp_path / "cli.toml"
    s.to_toml(path)
    return path


def test_study_run_writes_results_and_refuses_to_clobber(study_toml, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["study", "run", str(study_toml), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "means over replicates" in printed and "slope_error" in printed
    frame = pd.read_parquet(out / "results.parquet")
    assert len(frame) == 2 * 3 * 4
    assert (out / "results.csv").is_file() and (out / "provenance.json").is_file() and (out / "study.toml").is_file()
    # a second run without --resume/--overwrite refuses and says what to do
    assert main(["study", "run", str(study_toml), "--out", str(out), "--quiet"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["study", "run", str(study_toml), "--out", str(out), "--quiet", "--resume"]) == 0
    assert main(["study", "run", str(study_toml), "--out", str(out), "--quiet", "--overwrite"]) == 0
    pd.testing.assert_frame_equal(frame.drop(columns=["wall_time", "fit_wall_time"]),
                                  pd.read_parquet(out / "results.parquet").drop(columns=["wall_time", "fit_wall_time"]))


def test_study_check_lists_cells(study_toml, capsys):
    assert main(["study", "check", str(study_toml)]) == 0
    out = capsys.readouterr().out
    assert "6 cells x 4 replicates" in out and "lin__ridge-4.0__n640" in out


def test_errors_have_messages_and_exit_codes(tmp_path, capsys):
    assert main(["study", "run", str(tmp_path / "none.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("n = [10]\nreps = 2\n[truth]\npreset = 'sigmoid_vs_softmax'\n[fit]\ngate = 'sigmod'\n")
    assert main(["study", "run", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moestat: error: study.fit[0].gate='sigmod' is not valid; valid values are")
    assert main([]) == 2
    assert main(["study"]) == 2
    assert main(["vignette"]) == 2
    assert main(["vignette", "run", "no-such-vignette"]) == 2
    assert "no vignette named 'no-such-vignette'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["study", "run"])
    assert exc.value.code == 2


@pytest.mark.parametrize("argv", [[], ["study"], ["study", "run"], ["study", "check"], ["study", "performance"],
                                  ["study", "report"], ["rates"], ["vignette"], ["vignette", "list"],
                                  ["vignette", "run"], ["simulate"]])
def test_help_everywhere(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    assert "usage: moestat" in capsys.readouterr().out


def test_console_entry_point_via_subprocess(study_toml, tmp_path):
    paths = [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    run = subprocess.run([sys.executable, "-m", "moestat", "--version"], env=env, capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("moestat ")
    out = tmp_path / "sub"
    run = subprocess.run([sys.executable, "-m", "moestat", "study", "run", str(study_toml), "--out", str(out),
                          "--quiet"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert len(pd.read_parquet(out / "results.parquet")) == 24
    run = subprocess.run([sys.executable, "-m", "moestat", "study", "run", str(tmp_path / "x.toml")], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 2 and "moestat: error:" in run.stderr and "Traceback" not in run.stderr


# ------------------------------------------------------------------------- vignettes

_FAKE = '''# %% [markdown]
# A tiny vignette used to test discovery.
# %%
from pathlib import Path

NAME = "tiny-demo"
TITLE = "A tiny demonstration"


SIZES = {"quick": {}, "full": {}, "wide": {}}


def run(out, quick: bool = False, resume: bool = True, size=None) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.csv").write_text(f"quick,resume,size\\n{quick},{resume},{size}\\n")
'''


@pytest.fixture
def fake_vignettes(tmp_path, monkeypatch) -> Path:
    pkg = tmp_path / "vigs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tiny-demo.py").write_text(_FAKE)
    (pkg / "_private.py").write_text("NAME = 'hidden'\n")
    (pkg / "notes.py").write_text("x = 1\n")  # no NAME: not a vignette
    monkeypatch.setattr(vindex, "_roots", lambda: [pkg])
    return pkg


def test_vignette_list_and_run_from_a_package_folder(fake_vignettes, tmp_path, capsys):
    assert main(["vignette", "list"]) == 0
    listed = capsys.readouterr().out
    assert "tiny-demo" in listed and "A tiny demonstration" in listed and "hidden" not in listed
    out = tmp_path / "v"
    assert main(["vignette", "run", "tiny-demo", "--quick", "--out", str(out)]) == 0
    assert (out / "results.csv").read_text().splitlines()[1] == "True,True,None"
    assert main(["vignette", "run", "tiny-demo", "--out", str(out), "--no-resume"]) == 0
    assert (out / "results.csv").read_text().splitlines()[1] == "False,False,None"
    assert main(["vignette", "run", "tiny-demo", "--size", "wide", "--out", str(out)]) == 0
    assert (out / "results.csv").read_text().splitlines()[1] == "False,True,wide"
    assert main(["vignette", "run", "tiny-demo", "--size", "huge", "--out", str(out)]) == 2
    assert "valid sizes are ['full', 'quick', 'wide']" in capsys.readouterr().err
    assert main(["vignette", "run", "tiny-demo", "--size", "wide", "--quick", "--out", str(out)]) == 2
    assert "exclusive" in capsys.readouterr().err
    # the fake vignette's run() has no workers parameter: --workers is refused with the reason
    assert main(["vignette", "run", "tiny-demo", "--workers", "2", "--out", str(out)]) == 2
    assert "runs in one process" in capsys.readouterr().err
    assert main(["vignette", "run", "tiny-demo", "--workers", "0", "--out", str(out)]) == 2
    assert "--workers must be a positive" in capsys.readouterr().err


def test_vignette_run_passes_workers(monkeypatch, tmp_path, capsys):
    import moestat._vignette_index as vindex

    seen = {}

    class Fake:
        @staticmethod
        def run(out, quick=False, resume=True, size=None, workers=None):
            seen.update(workers=workers, quick=quick)

    monkeypatch.setattr(vindex, "find", lambda name: vindex.VignetteInfo(name, "t", tmp_path / "x.py"))
    monkeypatch.setattr(vindex, "load", lambda info: Fake)
    assert main(["vignette", "run", "any", "--quick", "--workers", "2", "--out", str(tmp_path / "o")]) == 0
    assert seen == {"workers": 2, "quick": True}
    if not torch.cuda.is_available():  # the pools' devices are checked before the vignette starts
        assert main(["vignette", "run", "any", "--workers", "cuda=1,cpu=1", "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert "--workers' device='cuda': CUDA is not available on this machine; use 'cpu' or 'auto'." in err
    assert main(["vignette", "run", "any", "--quick", "--workers", "cpu=3", "--out", str(tmp_path / "o")]) == 0
    assert seen == {"workers": {"cpu": 3}, "quick": True}


def test_package_resource_root_is_scanned(fake_vignettes, monkeypatch):
    """Installed from a wheel (no checkout beside the package), importlib.resources finds the vignettes."""
    monkeypatch.undo()
    monkeypatch.setattr(vindex.importlib.resources, "files", lambda package: fake_vignettes)
    monkeypatch.setattr(vindex, "__file__", "/nonexistent/site-packages/moestat/_vignette_index.py")
    assert [v.name for v in vindex.discover()] == ["tiny-demo"]


def test_installed_vignettes_are_discovered():
    """Every vignettes/*.py with NAME is found and importable without computing anything."""
    names = {p.stem for p in (ROOT / "vignettes").glob("*.py") if not p.name.startswith("_")}
    found = {v.path.stem: v for v in vindex.discover()}
    assert names <= set(found)
    for v in found.values():
        mod = vindex.load(v)
        assert mod.NAME == v.name and callable(mod.run)


def test_rates_command_prints_table_and_writes_csv_and_png(study_toml, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["study", "run", str(study_toml), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["rates", str(out), "--y", "slope_error", "--by", "fit"]) == 0
    printed = capsys.readouterr().out
    assert "exponent" in printed and "ridge=0.0" in printed
    table = pd.read_csv(out / "rates_slope_error.csv")
    assert set(table["fit"]) == {"ridge=0.0", "ridge=4.0"}
    # OLS slope errors shrink like n^-1/2: 4 replicates x 3 n values give a wide but informative interval
    ols = table[table["fit"] == "ridge=0.0"].iloc[0]
    assert ols["ci_low"] < 0.5 < ols["ci_high"]
    assert (out / "rates_slope_error.png").stat().st_size > 1000
    assert main(["rates", str(out), "--y", "nope"]) == 2
    assert "columns ['nope'] are not in the results" in capsys.readouterr().err


@pytest.mark.parametrize(("options", "message"), [
    ({"max_iters": 5}, "options.max_iters is not an option of estimator 'lse' (did you mean 'max_iter'?)"),
    ({"optimizer": "bfgs"}, "options.optimizer must be one of the valid values"),
    ({"restarts": 0}, "options.restarts must be an integer >= 1, got 0"),
])
def test_study_check_refuses_options_the_estimator_would_reject(tmp_path, capsys, options, message):
    """`moestat study check` and Study() refuse a misspelled option or a bad value before any cell runs (they
    used to pass the check and fail mid-run)."""
    text = ('name = "opts"\nseed = 1\nreps = 2\nn = [100]\n[[truth]]\npreset = "sigmoid_vs_softmax"\nregime = 2\n'
            'd = 2\nk = 2\n[[fit]]\nestimator = "lse"\n[fit.options]\n'
            + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in options.items()))
    path = tmp_path / "opts.toml"
    path.write_text(text)
    assert main(["study", "check", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_study_run_refuses_bad_workers_and_a_file_as_out(study_toml, tmp_path, capsys):
    for bad in ("0", "-3"):
        assert main(["study", "run", str(study_toml), "--workers", bad, "--out", str(tmp_path / "o")]) == 2
        assert "--workers must be a positive number of processes" in capsys.readouterr().err
    assert main(["study", "run", str(study_toml), "--workers", "cpu=x", "--out", str(tmp_path / "o")]) == 2
    assert "--workers='cpu=x' is not a number of processes or a list of DEVICE=N pools" in capsys.readouterr().err
    afile = tmp_path / "taken.txt"
    afile.write_text("x")
    assert main(["study", "run", str(study_toml), "--out", str(afile), "--quiet"]) == 2
    assert "is a file; give a folder" in capsys.readouterr().err


def test_study_run_with_a_pool_per_device(study_toml, tmp_path, capsys):
    """--workers DEVICE=N,...: one pool per device ('meta' stands for a second device; the 'ols' cells solve on the
    CPU whatever they are given); the largest cells start on the first-named device, the smallest on the last."""
    out = tmp_path / "o"
    capsys.readouterr()
    assert main(["study", "run", str(study_toml), "--workers", "meta=1,cpu=1", "--out", str(out), "--quiet"]) == 0
    summary = capsys.readouterr().out.split("means over replicates:")[1]
    assert "device" in summary.splitlines()[1] and " meta" in summary and " cpu" in summary
    frame = pd.read_parquet(out / "results.parquet")
    first_large = frame.loc[frame["n"] == 640, "cell"].iloc[0]  # the first pick of each pool (ties: design order)
    last_small = frame.loc[frame["n"] == 40, "cell"].iloc[-1]
    assert set(frame.loc[frame["cell"] == first_large, "device"]) == {"meta"}
    assert set(frame.loc[frame["cell"] == last_small, "device"]) == {"cpu"}
    assert json.loads((out / "provenance.json").read_text())["device"] == "meta+cpu"


def test_study_stopped_by_failed_fits_exits_3_and_keeps_its_cells(tmp_path, capsys):
    """A fit that raises stops a study without max_failures: exit code 3, the message names the cell, the failed
    cell is kept on disk and the folder is not a complete study."""
    toml = tmp_path / "fail.toml"
    toml.write_text("name = 'fail'\nn = [20]\nreps = 2\n[truth]\npreset = 'sigmoid_vs_softmax'\nexpert = 'linear'\n"
                    "d = 4\n[fit]\nestimator = 'ols'\n")
    out = tmp_path / "out"
    assert main(["study", "run", str(toml), "--out", str(out), "--quiet"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("moestat: error: study cell ") and "max_failures is not set" in err
    cells = list((out / "cells").glob("*.parquet"))
    assert len(cells) == 1 and set(pd.read_parquet(cells[0])["status"]) == {"error"}
    assert main(["study", "report", str(out)]) == 2  # an unfinished study: say how to finish it
    assert "unfinished study (status 'stopped'" in capsys.readouterr().err
    assert main(["study", "report", str(out), "--partial"]) == 0
    assert "0 fits ok, 0 not converged, 2 errors" in (out / "report.md").read_text()
