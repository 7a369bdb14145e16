"""Study runner: grid, seeds, checkpoints, resume after SIGKILL, executors, config errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import moestat as ms
import moestat.study as study_mod
from moestat.study import Study, StudyConfigError, StudyFailureError, StudyFailureWarning, load_results
from tests.study_cells import LINEAR_TRUTH, normal_equations_cell, slope_error

TIMING = ["wall_time", "fit_wall_time"]
ROOT = Path(__file__).resolve().parents[1]


def _ols_study(**kw) -> Study:
    base = dict(truth=LINEAR_TRUTH, fit={"estimator": "ols", "grid": {"options.ridge": [0.0, 5.0]}},
                n=[50, 200, 800], reps=6, metrics=[slope_error], seed=11, threads=1)
    base.update(kw)
    return Study(**base)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.drop(columns=TIMING, errors="ignore"), b.drop(columns=TIMING, errors="ignore"))


# ------------------------------------------------------------------ grid and seeds

def test_grid_expansion_labels_and_cells():
    s = Study(truth={"preset": "sigmoid_vs_softmax", "regime": 2, "grid": {"expert": ["relu", "linear"]}},
              fit={"k": "truth+1", "grid": {"gate": ["sigmoid", "softmax"]}}, n=[1000, 10000], reps=20,
              metrics=["D1"], seed=1)
    assert [t["label"] for t in s.truths] == ["relu", "linear"]
    assert [f["label"] for f in s.fits] == ["sigmoid", "softmax"]
    assert len(s.cells) == 8
    assert len({c["id"] for c in s.cells}) == 8
    # every fit of one truth and n shares the data stream ("under the same data")
    by_truth_n = {}
    for c in s.cells:
        by_truth_n.setdefault((c["truth"]["label"], c["n"]), set()).add(c["data_key"])
    assert all(len(v) == 1 for v in by_truth_n.values())
    assert len({c["fit_key"] for c in s.cells}) == 8


def test_builtin_ols_matches_independent_normal_equations():
    """The batched torch SVD-solve estimator and a numpy normal-equations cell give the same LSE (float64)."""
    a = Study(truth=LINEAR_TRUTH, fit={"estimator": "ols"}, n=[40, 400], reps=5, metrics=[slope_error], seed=3,
              threads=1).run(progress=False)
    b = Study(truth=LINEAR_TRUTH, fit={"estimator": "ols"}, n=[40, 400], reps=5, seed=3,
              cell=normal_equations_cell).run(progress=False)
    # both cells see the same data streams, so the two least-squares solutions agree to rounding
    np.testing.assert_allclose(a["slope_error"], b["slope_error"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(a["objective"], b["objective"], rtol=1e-9)
    assert (b["estimator"] == "normal_equations_cell").all()


def test_slope_error_shrinks_at_root_n():
    """E||a_hat - a|| is proportional to n^-1/2 for OLS: 64x more data -> 8x smaller mean error."""
    df = Study(truth=LINEAR_TRUTH, fit={"estimator": "ols"}, n=[100, 6400], reps=100, metrics=[slope_error],
               seed=5, threads=1).run(progress=False)
    m = df.groupby("n")["slope_error"].mean()
    ratio = m[100] / m[6400]
    # a chi_3-like error has sd/mean 0.42, so each mean over 100 reps has relative sd 4.2% and the ratio about 6%:
    # 6..10.7 is more than 4 sd either side of 8
    assert 6 < ratio < 10.7, ratio


def test_seeds_are_reproducible_and_keyed_by_label():
    a = _ols_study().run(progress=False)
    b = _ols_study().run(progress=False)
    _same(a, b)
    c = _ols_study(seed=12).run(progress=False)
    assert not np.allclose(a["slope_error"], c["slope_error"])
    # adding a fitted model and a sample size leaves the existing cells unchanged
    d = _ols_study(fit={"estimator": "ols", "grid": {"options.ridge": [0.0, 5.0, 50.0]}}, n=[50, 200, 800, 3200]
                   ).run(progress=False)
    keep = d[d["fit"].isin(a["fit"].unique()) & d["n"].isin(a["n"].unique())]
    np.testing.assert_array_equal(keep.set_index(["fit", "n", "rep"]).sort_index()["slope_error"],
                                  a.set_index(["fit", "n", "rep"]).sort_index()["slope_error"])
    # the two fits of a cell see the same data: same residual-free quantities for ridge 0 vs ridge 0 copies
    assert a["data_seed"].nunique() == 3 * 6


def test_frame_columns_record_every_knob():
    df = _ols_study().run(progress=False)
    for col in ["study", "cell", "truth", "fit", "n", "rep", "truth_preset", "truth_gate", "truth_expert",
                "truth_k", "truth_d", "truth_noise_sd", "estimator", "gate", "expert", "k", "ridge", "seed",
                "data_seed", "fit_seed", "device", "objective", "converged", "slope_error", "wall_time"]:
        assert col in df.columns, col
    assert len(df) == 2 * 3 * 6
    assert set(df["ridge"]) == {0.0, 5.0}
    assert not df.duplicated(["cell", "rep"]).any()


# --------------------------------------------------------------- checkpoint/resume

def test_checkpoint_files_provenance_and_toml(tmp_path):
    s = _ols_study()
    df = s.run(tmp_path, progress=False)
    cells = sorted((tmp_path / "cells").glob("*.parquet"))
    assert len(cells) == len(s.cells)
    _same(df, load_results(tmp_path))
    _same(df, pd.concat([pd.read_parquet(tmp_path / "cells" / f"{c['id']}.parquet") for c in s.cells],
                        ignore_index=True))
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["config"]["status"] == "complete"
    assert prov["config"]["n_cells"] == 6
    assert prov["config"]["study"]["seed"] == 11
    assert (tmp_path / "results.csv").is_file()
    assert not list((tmp_path / "cells").glob(".*tmp*"))


def test_resume_skips_finished_cells_and_rehashes_changed_ones(tmp_path, monkeypatch):
    s = _ols_study()
    full = s.run(tmp_path, progress=False)
    calls = []
    real = study_mod.run_cell

    def spy(payload):
        calls.append(payload["cell"]["id"])
        return real(payload)

    monkeypatch.setattr(study_mod, "run_cell", spy)
    again = s.run(tmp_path, progress=False)
    assert calls == []
    _same(full, again)
    # removing one cell file: only that cell runs
    victim = s.cells[2]["id"]
    (tmp_path / "cells" / f"{victim}.parquet").unlink()
    _same(full, s.run(tmp_path, progress=False))
    assert calls == [victim]
    # a changed knob gives new cell ids for the affected cells only
    calls.clear()
    s2 = _ols_study(fit={"estimator": "ols", "grid": {"options.ridge": [0.0, 6.0]}})
    s2.run(tmp_path, progress=False)
    assert len(calls) == 3 and all("ridge-6.0" in c for c in calls)
    # resume=False recomputes everything
    calls.clear()
    s.run(tmp_path, resume=False, progress=False)
    assert len(calls) == 6


def test_leftover_temporary_files_are_ignored(tmp_path):
    s = _ols_study()
    full = s.run(tmp_path, progress=False)
    cid = s.cells[0]["id"]
    (tmp_path / "cells" / f"{cid}.parquet").unlink()
    (tmp_path / "cells" / f".{cid}.parquet.abc.tmp").write_bytes(b"PAR1 truncated")
    _same(full, s.run(tmp_path, progress=False))
    assert not list((tmp_path / "cells").glob(".*tmp*"))


_KILL_SCRIPT = textwrap.dedent("""
    import sys
    from moestat.study import Study
    study = Study.from_toml(sys.argv[1])
    workers = int(sys.argv[3])
    study.run(sys.argv[2], progress=False, executor="processes" if workers > 1 else None, workers=workers)
""")


def _kill_study_toml(path: Path) -> Path:
    s = Study(truth=LINEAR_TRUTH, fit={"estimator": "ols", "grid": {"options.ridge": [0.0, 0.5, 2.0, 8.0]}},
              n=[400, 800, 1600, 3200, 6400, 12800, 25600], reps=8, seed=7, threads=1, name="killme")
    return Path(s.to_toml(path) and path)


@pytest.mark.parametrize(("workers", "target"), [(1, "main"), (2, "main"), (2, "group")])
def test_sigkill_at_any_moment_then_damage_then_resume_equals_uninterrupted(tmp_path, workers, target):
    """Fault injection: kill a real study with SIGKILL at random moments, resuming each time — the main process only
    (with --workers 2 its workers end with it) or the whole process group (main and workers at once, as an OOM
    killer or a closed session does) — then truncate one stored cell and swap two others before the last resume.
    The final frame equals an uninterrupted run's: no row lost, repeated or changed."""
    toml = _kill_study_toml(tmp_path / "study.toml")
    study = Study.from_toml(toml)
    reference = study.run(tmp_path / "reference", progress=False)
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rng = np.random.default_rng(0)
    kills = 0
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(toml), str(out), str(workers)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        target_cells = len(list((out / "cells").glob("*.parquet"))) + int(rng.integers(1, 5)) if out.exists() else 1
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if out.exists() and len(list((out / "cells").glob("*.parquet"))) >= target_cells:
                time.sleep(float(rng.uniform(0, 0.02)))  # land anywhere, including inside the next write
                break
            time.sleep(0.002)
        if proc.poll() is None:
            if target == "group":
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
        proc.stderr.close()
        if (out / "results.parquet").exists():
            break
    assert kills >= 2, "the study finished before it could be killed twice; make it larger"
    stored = sorted((out / "cells").glob("*.parquet"))
    assert 3 <= len(stored) < len(study.cells) or (out / "results.parquet").exists()
    torn, first, second = stored[0], stored[1], stored[2]
    torn.write_bytes(torn.read_bytes()[: torn.stat().st_size // 2])
    first_bytes = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(first_bytes)
    with pytest.warns(ms.CheckpointWarning) as caught:
        resumed = study.run(out, resume=True, progress=False)
    named = " ".join(str(w.message) for w in caught)
    assert all(p.name in named for p in (torn, first, second)), named
    _same(reference, resumed)
    assert not resumed.duplicated(["cell", "rep"]).any()
    assert len(resumed) == len(study.cells) * study.reps


_STRUCTURAL = ["truncated", "garbage", "swapped", "replicate_missing", "replicate_twice"]


# an edited value in a cell without a checksum is indistinguishable from a genuine one: that pair is not a case
@pytest.mark.parametrize(("damage", "checksums"), [(d, c) for d in _STRUCTURAL for c in (True, False)]
                         + [("edited_value", True)])
def test_resume_recomputes_damaged_or_foreign_cells_with_a_warning(tmp_path, damage, checksums):
    """A resume trusts no cell file blindly: a torn, garbage, swapped, incomplete or edited cell is recomputed (with
    a CheckpointWarning naming it) and the final frame equals an uninterrupted run's, no row lost or repeated.
    With the SHA-256 beside each cell any change is caught; without it (cells written before checksums) the
    structural checks catch all but an edited value, which only a checksum can see."""
    s = _ols_study()
    reference = s.run(tmp_path / "ref", progress=False)
    out = tmp_path / "out"
    s.run(out, progress=False)
    files = sorted((out / "cells").glob("*.parquet"))
    victim, other = files[0], files[1]
    if damage == "truncated":
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    elif damage == "garbage":
        victim.write_bytes(b"not a parquet file")
    elif damage == "swapped":
        victim.write_bytes(other.read_bytes())
    elif damage == "edited_value":
        frame = pd.read_parquet(victim)
        frame.loc[0, "objective"] = frame.loc[0, "objective"] * 0.5
        frame.to_parquet(victim, index=False)
    else:
        frame = pd.read_parquet(victim)
        frame = frame[frame["rep"] != 2] if damage == "replicate_missing" else pd.concat([frame, frame.iloc[:1]])
        frame.to_parquet(victim, index=False)
    if not checksums:
        for sidecar in (out / "cells").glob("*.sha256"):
            sidecar.unlink()
    with pytest.warns(ms.CheckpointWarning, match=rf"stored cell {victim.name} .*recomputing it"):
        resumed = s.run(out, resume=True, progress=False)
    _same(reference, resumed)
    assert not resumed.duplicated(["cell", "rep"]).any()


def test_resume_into_another_studys_folder_is_refused(tmp_path):
    _ols_study(name="first").run(tmp_path, progress=False)
    second = _ols_study(name="second", n=[50])
    with pytest.raises(StudyConfigError, match=r"holds the results of study 'first', not of 'second'.*resume=False"):
        second.run(tmp_path, resume=True, progress=False)
    frame = second.run(tmp_path, resume=False, progress=False)  # explicit overwrite
    assert set(frame["study"]) == {"second"}


_ORPHAN_SCRIPT = textwrap.dedent("""
    import sys
    from moestat.study import Study
    from tests.study_cells import LINEAR_TRUTH
    study = Study(truth=LINEAR_TRUTH, cell="tests.study_cells:sleepy_cell", n=[50, 60, 70, 80], reps=2, seed=1,
                  name="orphans")
    study.run(sys.argv[1], executor="processes", workers=2, progress=False)
""")


def _children(pid: int) -> list[int]:
    """Pids of the live processes whose parent is ``pid`` (Linux /proc)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(stat.parent.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_the_main_process_ends_its_pool_workers(tmp_path):
    """SIGKILL to the main process of a --workers 2 study (no cleanup runs there): its workers end too."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT, str(tmp_path / "out")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, workers = time.time() + 60, []
    while time.time() < deadline and proc.poll() is None:
        # spawn workers are the children running Python (the resource tracker is one more child)
        workers = [p for p in _children(proc.pid)
                   if "multiprocessing" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
        if len(workers) >= 3:  # resource tracker + 2 workers
            break
        time.sleep(0.2)
    assert proc.poll() is None and len(workers) >= 2, "the study's pool did not start"
    time.sleep(2.0)  # let the workers finish their initializer and start their (60 s) cells
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 15
    while time.time() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.2)
    left = [p for p in workers if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"pool workers {left} outlived the killed main process"


# ----------------------------------------------------------------------- executors

def test_frames_identical_serial_and_process_pool(tmp_path):
    s = _ols_study(n=[50, 200])
    serial = s.run(progress=False)
    _same(serial, s.run(tmp_path / "p", executor="processes", workers=2, progress=False))


@pytest.mark.parametrize("processes", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_frames_identical_on_dask_local_cluster(tmp_path, processes):
    distributed = pytest.importorskip("distributed")
    s = _ols_study(n=[50, 200])
    serial = s.run(progress=False)
    with distributed.LocalCluster(n_workers=2 if processes else 1, threads_per_worker=1, processes=processes,
                                  dashboard_address=None) as cl, distributed.Client(cl) as client:
        on_dask = s.run(tmp_path / "d", executor=client.get_executor(), progress=False)
    _same(serial, on_dask)


def test_pool_gets_largest_cells_first_and_frame_keeps_cell_order(tmp_path):
    """Cells go to an executor in decreasing n (longest first); the frame is the serial one."""
    import concurrent.futures as cf

    class Recording(cf.ThreadPoolExecutor):
        def __init__(self):
            super().__init__(max_workers=1)
            self.ns = []

        def submit(self, fn, payload, *args, **kwargs):
            self.ns.append(payload["cell"]["n"])
            return super().submit(fn, payload, *args, **kwargs)

    s = _ols_study(n=[50, 400, 200])
    serial = s.run(progress=False)
    with Recording() as ex:
        pooled = s.run(tmp_path / "r", executor=ex, progress=False)
    assert ex.ns == sorted(ex.ns, reverse=True) and ex.ns[0] == 400
    _same(serial, pooled)


def test_bad_executor():
    with pytest.raises(ValueError, match="executor"):
        _ols_study(n=[50]).run(executor="threads", progress=False)


# --------------------------------------------------------------------- TOML/config

def test_toml_roundtrip(tmp_path):
    s = Study(truth=LINEAR_TRUTH, fit={"estimator": "ols", "grid": {"options.ridge": [0.0, 1.0]}}, n=[30, 60],
              reps=3, seed=9, metrics=["tests.study_cells:slope_error"], name="rt", threads=1)
    path = tmp_path / "s.toml"
    s.to_toml(path)
    s2 = Study.from_toml(path)
    assert [c["id"] for c in s2.cells] == [c["id"] for c in s.cells]
    _same(s.run(progress=False), s2.run(progress=False))
    # from a string, and with a custom cell given as an import path
    text = path.read_text().replace('metrics = [\n    "tests.study_cells:slope_error",\n]',
                                    'metrics = []\ncell = "tests.study_cells:normal_equations_cell"')
    s3 = Study.from_toml(text)
    assert s3.cell is normal_equations_cell
    assert "slope_error" in s3.run(progress=False).columns


@pytest.mark.parametrize("kwargs, match", [
    (dict(truth={"preset": "nope"}),
     r"preset='nope' is not valid; valid values are "
     r"\['gate_comparison', 'local_alternative', 'sigmoid_vs_softmax', 'topk_gaussian'\]"),
    (dict(truth={"preset": "sigmoid_vs_softmax", "regim": 2}), r"unknown key 'regim'; valid keys are"),
    (dict(truth={"preset": "sigmoid_vs_softmax", "regime": 3}), r"regime=3 is not valid; valid values are \[1, 2\]"),
    (dict(truth={"preset": "sigmoid_vs_softmax", "expert": "relux"}), r"expert='relux' is not valid; valid values"),
    (dict(truth={"gate": "softmax", "expert": "linear", "k": 1}), r"missing \['d', 'params'\]"),
    (dict(fit={"gate": "sigmod"}),
     r"study.fit\[0\].gate='sigmod' is not valid; valid values are \['softmax', 'sigmoid', 'topk'"),
    (dict(fit={"estimator": "nls"}), r"estimator='nls' is not known; valid values are \['lse', 'mle', 'ols'"),
    (dict(fit={"k": "nine"}), r"k='nine' is not valid; use a positive integer, 'truth' or 'truth\+m'"),
    (dict(fit={"lr": 0.1}), r"unknown key 'lr'; valid keys are .*'options'"),
    (dict(fit=[{"label": "a"}, {"label": "a"}]), r"labels must be unique, \['a'\] repeat"),
    (dict(n=[100, 0]), r"study.n must be a non-empty list of positive integers"),
    (dict(n=[100, 100]), r"repeated values"),
    (dict(reps=0), r"study.reps must be an integer >= 1"),
    (dict(metrics=["D9"]), r"metrics\[0\]='D9' is not known; valid values are \['D1', 'D2', 'D3'"),
    (dict(metrics="D1"), r"study.metrics must be a list"),
    (dict(device="tpu"), r"device='tpu' is not valid; valid values are \['auto', 'cpu', 'cuda'\]"),
    (dict(fit={"grid": {"gatee": ["sigmoid"]}}), r"grid: unknown key 'gatee'"),
    (dict(metric_options={"D2": {"r": 2}}, metrics=["D1"]), r"metric_options: 'D2' is not among"),
    (dict(truth={"preset": "sigmoid_vs_softmax", "gate_var": -1.0}), r"study.truth\[0\] .*non-negative"),
])
def test_config_errors_name_key_and_valid_values(kwargs, match):
    base = dict(truth={"preset": "sigmoid_vs_softmax"}, fit={}, n=[100], reps=2)
    base.update(kwargs)
    with pytest.raises(StudyConfigError, match=match):
        Study(**base)


def test_toml_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Study.from_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'x'\nn = [1,\n")
    with pytest.raises(StudyConfigError, match="not valid TOML"):
        Study.from_toml(bad)
    with pytest.raises(StudyConfigError, match=r"unknown key 'sed'; valid keys are"):
        Study.from_toml("sed = 1\nn = [10]\n[truth]\npreset = 'sigmoid_vs_softmax'\n")
    with pytest.raises(StudyConfigError, match="needs n"):
        Study.from_toml("seed = 1\n[truth]\npreset = 'sigmoid_vs_softmax'\n")
    with pytest.raises(ValueError, match="not importable"):
        Study(truth=LINEAR_TRUTH, fit={"estimator": "ols"}, n=[10], metrics=[lambda ctx: 0.0]).to_toml()


def test_cell_errors_name_the_cell():
    """Without max_failures the first failed fit stops the study, naming the cell and the estimator's message."""
    s = Study(truth={"preset": "sigmoid_vs_softmax", "expert": "linear", "d": 4}, fit={"estimator": "ols"},
              n=[20], reps=2)
    with pytest.raises(StudyFailureError, match=r"study cell .*__n20__.*'ols' fits the one-expert linear model.*"
                                                r"2 of 2 replicates failed.*max_failures is not set"):
        s.run(progress=False)


def test_study_is_exported():
    assert ms.Study is Study


def test_truths_sharing_a_stream_share_their_data():
    other = {**LINEAR_TRUTH, "label": "lin2", "params": {**LINEAR_TRUTH["params"], "expert_bias": [1.3]}}
    s = Study(truth=[{**LINEAR_TRUTH, "stream": "common"}, {**other, "stream": "common"}, {**other, "label": "lin3"}],
              fit={"estimator": "ols"}, n=[64], reps=3, seed=4, threads=1)
    df = s.run(progress=False)
    slopes = df.pivot(index="rep", columns="truth", values="objective")
    # same inputs and noise, intercepts differing by a constant: OLS residuals (hence objectives) coincide
    np.testing.assert_allclose(slopes["lin"], slopes["lin2"], rtol=1e-10)
    assert not np.allclose(slopes["lin"], slopes["lin3"])
    assert set(df["truth_stream"].dropna()) == {"common"}
    templ = Study(truth={"preset": "sigmoid_vs_softmax", "stream": "{expert}",
                         "grid": {"expert": ["relu", "linear"], "truth_gate": ["sigmoid", "softmax"]}},
                  fit={}, n=[10], reps=1)
    assert [t["stream"] for t in templ.truths] == ["relu", "relu", "linear", "linear"]


def test_process_pool_workers_share_the_cores(monkeypatch):
    """Each pool worker gets cpu_count // workers torch threads (at least one), not one thread per core."""
    import torch

    from moestat.study import _share_cores

    before = torch.get_num_threads()
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    try:
        _share_cores(4)
        assert torch.get_num_threads() == 2
        _share_cores(16)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_vignette_study_timing_survives_a_failure_after_the_study(tmp_path):
    """run_study_timed saves the measured time as soon as the study finishes; a re-render that loads every cell
    (e.g. after a later step of the vignette failed) reports that time, not the seconds spent loading."""
    from moestat._vignette import run_study_timed

    study = Study(truth=LINEAR_TRUTH, fit={"estimator": "ols"}, n=[40, 400], reps=2, metrics=[slope_error],
                  seed=3, threads=1)
    _, first = run_study_timed(study, tmp_path, progress=False, workers=1)
    assert first["cells_computed"] == len(study.cells)
    assert json.loads((tmp_path / "study" / "timing.json").read_text()) == first
    _, again = run_study_timed(study, tmp_path, progress=False, workers=1)
    assert again == first


def test_vignette_study_on_pools_per_device(tmp_path):
    """run_study_timed passes a pool per device through to Study.run and records it in the timing."""
    from moestat._vignette import run_study_timed

    study = Study(truth=LINEAR_TRUTH, fit={"estimator": "ols"}, n=[40, 400], reps=2, metrics=[slope_error],
                  seed=3, threads=1)
    frame, timing = run_study_timed(study, tmp_path, progress=False, workers="meta=1,cpu=1")
    assert timing["workers"] == "meta=1,cpu=1" and timing["cells_computed"] == len(study.cells)
    assert set(frame["device"]) <= {"meta", "cpu"}
    _same(frame.drop(columns="device"), study.run(progress=False).drop(columns="device"))


def test_load_results_reads_only_a_complete_matching_study(tmp_path):
    """An interrupted rerun leaves an old results.parquet beside a 'running' provenance: reading it would report
    another run's frame; load_results (and moestat rates) refuse it unless partial=True, which reads the cells."""
    s = _ols_study()
    full = s.run(tmp_path, progress=False)
    _same(full, load_results(tmp_path))
    prov = tmp_path / "provenance.json"
    doc = json.loads(prov.read_text())
    doc["config"]["status"] = "running"  # what a killed rerun leaves behind
    prov.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"unfinished study \(status 'running'.*--resume.*partial=True"):
        load_results(tmp_path)
    assert len(load_results(tmp_path, partial=True)) == len(full)
    doc["config"]["status"] = "complete"
    prov.write_text(json.dumps(doc))
    listed = json.loads((tmp_path / "cells.json").read_text())
    (tmp_path / "cells.json").write_text(json.dumps({"cells": listed["cells"][:-1]}))
    with pytest.raises(ValueError, match=r"results.parquet does not hold the .* cells the study lists"):
        load_results(tmp_path)


# ------------------------------------------------------------------ fixed designs

def _lin_truth():
    spec = ms.MoE(gate="softmax", expert="linear", k=1, d=3, noise_sd=0.5)
    p = LINEAR_TRUTH["params"]
    return spec, ms.Params(*(np.asarray(p[b], dtype=float) for b in
                            ("gate_bias", "gate_weight", "expert_weight", "expert_bias")))


def test_default_design_is_bit_identical_to_the_documented_draws():
    """design='random' (the default) draws X then the noise from replicate r's stream, exactly as before fixed
    designs existed: recomputed here by hand from SeedSequence(seed).spawn(R)[r] (pins the default output)."""
    spec, params = _lin_truth()
    for model in ("regression", "mixture"):
        data = ms.simulate(spec, params, n=30, reps=3, seed=9, model=model)
        assert np.array_equal(data.X, ms.simulate(spec, params, n=30, reps=3, seed=9, model=model,
                                                  design="random").X)
        for r, child in enumerate(np.random.SeedSequence(9).spawn(3)):
            rng = np.random.default_rng(child)
            X = rng.uniform(-1.0, 1.0, size=(30, 3))
            eps = rng.standard_normal(30)
            assert np.array_equal(data.X[r], X)
            if model == "regression":  # one expert: f(x) = a^T x + b exactly
                assert np.array_equal(data.y[r], X @ params.expert_weight[0] + params.expert_bias[0] + 0.5 * eps)


@pytest.mark.parametrize("model", ["regression", "mixture"])
def test_fixed_designs_share_inputs_and_draw_responses_per_replicate(model):
    spec = ms.MoE(gate="softmax", expert="linear", k=2, d=1)
    truth = ms.Params([1.0, 0.0], [[3.0], [0.0]], [[1.0], [-1.0]], [0.5, -0.5], noise_sd=[0.3, 0.3])
    lin = ms.simulate(spec, truth, n=11, reps=4, seed=2, design="linspace", model=model)
    assert lin.X.shape == (4, 11, 1) and lin.y.shape == (4, 11)
    np.testing.assert_array_equal(lin.X[2, :, 0], np.linspace(-1, 1, 11))  # the same grid in every replicate
    assert all(np.array_equal(lin.X[0], lin.X[r]) for r in range(4))
    assert not np.allclose(lin.y[0], lin.y[1])  # responses are drawn per replicate
    again = ms.simulate(spec, truth, n=11, reps=4, seed=2, design="linspace", model=model)
    np.testing.assert_array_equal(again.y, lin.y)  # reproducible
    np.testing.assert_array_equal(ms.simulate(spec, truth, n=11, reps=2, seed=2, design="linspace",
                                              model=model).y, lin.y[:2])  # adding replicates changes none
    own = np.linspace(0.0, 2.0, 11)[:, None]
    arr = ms.simulate(spec, truth, n=11, reps=3, seed=2, design=own, model=model)
    assert all(np.array_equal(arr.X[r], own) for r in range(3))
    if model == "regression":  # the noise is the replicate stream's first 11 normals (no input draws precede it)
        eps = np.random.default_rng(np.random.SeedSequence(2).spawn(4)[1]).standard_normal(11)
        np.testing.assert_allclose(lin.y[1] - spec.mean(truth, lin.X[1]), 0.3 * eps, atol=1e-12)  # sd: params.noise_sd


def test_linspace_grid_for_several_inputs_and_design_errors():
    spec2 = ms.MoE(gate="softmax", expert="linear", k=1, d=2)
    p2 = ms.Params([0.0], [[0.0, 0.0]], [[1.0, 2.0]], [0.0])
    X = ms.simulate(spec2, p2, n=9, seed=0, design="linspace", low=0.0, high=2.0).X[0]
    # the full 3 x 3 grid on {0, 1, 2}^2, last column fastest
    expect = np.array([[a, b] for a in (0.0, 1.0, 2.0) for b in (0.0, 1.0, 2.0)])
    np.testing.assert_array_equal(X, expect)
    with pytest.raises(ValueError, match=r"n must be m\*\*2; n=10 is not \(nearby valid n: \[4, 9, 16\]\)"):
        ms.simulate(spec2, p2, n=10, seed=0, design="linspace")
    spec, params = _lin_truth()
    with pytest.raises(ValueError, match=r"design='grid' is not supported; valid values are \['linspace', 'random'\]"):
        ms.simulate(spec, params, n=5, seed=0, design="grid")
    with pytest.raises(ValueError, match=r"design array has shape \(4, 3\) but the simulation needs \(n, d\) = "
                                         r"\(5, 3\)"):
        ms.simulate(spec, params, n=5, seed=0, design=np.zeros((4, 3)))
    with pytest.raises(ValueError, match="NaN or infinite"):
        ms.simulate(spec, params, n=2, seed=0, design=np.full((2, 3), np.nan))
    with pytest.raises(TypeError, match="design must be 'random', 'linspace' or a numeric array"):
        ms.simulate(spec, params, n=1, seed=0, design=[["a", "b", "c"]])
    with pytest.raises(ValueError, match="inputs='gaussian' draws random inputs, but design is fixed"):
        ms.simulate(spec, params, n=8, seed=0, design="linspace", inputs="gaussian")


def test_study_truth_with_a_fixed_design():
    design = np.linspace(-1, 1, 24).reshape(8, 3).tolist()
    s = Study(truth={**LINEAR_TRUTH, "design": design}, fit={"estimator": "ols"}, n=[8], reps=3, seed=1,
              threads=1)
    df = s.run(progress=False)
    assert df["truth_design"].str.startswith("array[8, 3]:").all()
    assert "design" in Study.from_toml(s.to_toml()).truths[0]  # the array survives the TOML round trip
    with pytest.raises(StudyConfigError, match=r"study.truth\[0\].design at n=9: design array has shape \(8, 3\).*"
                                               r"single n equal to its number of rows"):
        Study(truth={**LINEAR_TRUTH, "design": design}, fit={"estimator": "ols"}, n=[8, 9], reps=2)
    with pytest.raises(StudyConfigError, match=r"design at n=10: design='linspace' with d=3 .* n must be m\*\*3"):
        Study(truth={**LINEAR_TRUTH, "design": "linspace"}, fit={"estimator": "ols"}, n=[8, 10], reps=2)


# ------------------------------------------------------------------ failures are rows

def _first_responses(study: Study, n: int) -> np.ndarray:
    """y[r, 0] of every replicate of the study's LINEAR_TRUTH cells at n, simulated independently of the runner."""
    spec, params = _lin_truth()
    key = next(c["data_key"] for c in study.cells if c["n"] == n)
    data = ms.simulate(spec, params, n=n, reps=study.reps, seed=np.random.SeedSequence(study.seed, spawn_key=key))
    return data.y[:, 0]


def _picky(**options) -> Study:
    return Study(truth=LINEAR_TRUTH, fit={"label": "picky", "estimator": "tests.study_cells:picky_ols",
                                          "options": options}, n=[40], reps=6, seed=21, threads=1,
                 max_failures=6, metrics=[slope_error])


def test_a_raising_replicate_is_a_row_and_the_others_are_refitted_alone():
    probe = _picky()
    y0 = np.sort(_first_responses(probe, 40))
    cut = float((y0[-3] + y0[-2]) / 2)  # the two replicates with the largest y[0] fail
    s = _picky(y0_above=cut)
    with pytest.warns(StudyFailureWarning, match=r"2 of 6 replicates failed \(2 errors, 0 not converged\)"):
        df = s.run(progress=False)
    failing = _first_responses(s, 40) > cut
    assert list(df["status"]) == ["error" if f else "ok" for f in failing]
    err = df[df["status"] == "error"]
    # each error row carries its own replicate's error (and the batched call's when that differs)
    assert err["message"].str.contains(r"ValueError: y\[0\] = .* is above .*(?:also when refitted alone|refit alone "
                                       r"after the batched fit)").all()
    assert all(f"{v:.3f}" in m for v, m in zip(_first_responses(s, 40)[failing], err["message"], strict=True))
    assert err["objective"].isna().all() and err["slope_error"].isna().all()
    assert err["data_seed"].tolist() == [f"0/{s.cells[0]['data_key'][1]}/40/{r}" for r in err["rep"]]
    ok = df[df["status"] == "ok"]
    assert ok["message"].str.startswith("refit alone after the batched fit of the cell failed").all()
    # OLS is deterministic: a replicate refitted alone has the objective of the plain batched OLS fit
    plain = Study(truth=LINEAR_TRUTH, fit={"label": "picky", "estimator": "ols"}, n=[40], reps=6, seed=21,
                  threads=1).run(progress=False)
    np.testing.assert_allclose(ok["objective"], plain.loc[ok.index, "objective"], rtol=1e-10)


def test_not_converged_rows_and_max_failures_stop_and_resume(tmp_path):
    probe = _picky()
    y0 = np.sort(_first_responses(probe, 40))
    low = float((y0[2] + y0[3]) / 2)  # three replicates flagged not converged
    s = Study(truth=LINEAR_TRUTH, fit={"label": "picky", "estimator": "tests.study_cells:picky_ols",
                                       "options": {"y0_below": low}}, n=[40, 80], reps=6, seed=21, threads=1,
              max_failures=2)
    with pytest.raises(StudyFailureError, match=r"stopped: 3 failed replicates \(0 errors, 3 not converged\) "
                                                r"exceed max_failures=2 .*rep .*: not_converged"):
        s.run(tmp_path, progress=False)
    prov = json.loads((tmp_path / "provenance.json").read_text())["config"]
    assert prov["status"] == "stopped" and prov["failures"]["not_converged"] == 3
    stored = sorted((tmp_path / "cells").glob("*.parquet"))
    assert len(stored) == 1  # the finished (failing) cell is kept
    first = pd.read_parquet(stored[0])
    assert (first["status"] == "not_converged").sum() == 3 and not first["converged"].all()
    # a larger budget (a fraction of the 12 replicates) resumes: the stored cell is reused, not recomputed
    t_stored = stored[0].stat().st_mtime_ns
    relaxed = Study(**{**_kw(s), "max_failures": 0.75})
    with pytest.warns(StudyFailureWarning, match="not converged"):
        df = relaxed.run(tmp_path, progress=False)
    assert stored[0].stat().st_mtime_ns == t_stored
    assert len(df) == 12 and set(df["status"]) == {"ok", "not_converged"}
    _same(df[df["n"] == 40].reset_index(drop=True), first)


def _kw(s: Study) -> dict:
    return dict(truth=s.truth, fit=s.fit, n=s.n, reps=s.reps, seed=s.seed, threads=s.threads,
                metrics=s.metrics, max_failures=s.max_failures)


def test_a_raising_metric_or_cell_marks_rows_as_errors():
    s = Study(truth=LINEAR_TRUTH, fit={"estimator": "ols"}, n=[30], reps=3, seed=2, threads=1, max_failures=3,
              metrics=[slope_error, "tests.study_cells:broken_metric"])
    with pytest.warns(StudyFailureWarning, match="3 errors"):
        df = s.run(progress=False)
    assert (df["status"] == "error").all() and df["converged"].all()
    assert df["message"].str.contains("metric 'broken_metric' failed: RuntimeError: this metric is broken").all()
    assert df["slope_error"].notna().all()  # the fits and the other metrics are kept
    c = Study(truth=LINEAR_TRUTH, n=[30], reps=2, seed=2, cell="tests.study_cells:raising_cell", max_failures=2)
    with pytest.warns(StudyFailureWarning):
        rows = c.run(progress=False)
    assert rows["message"].str.contains("RuntimeError: cell at n=30 cannot run").all() and len(rows) == 2
    with pytest.raises(StudyFailureError, match=r"exceed max_failures=1 "):
        Study(**{**_kw(c), "cell": c.cell, "max_failures": 1}).run(progress=False)


def test_cells_stored_before_status_rows_are_upgraded_on_resume(tmp_path):
    """A cell file of the earlier format (optimiser stop reason in 'status', no 'message') resumes with 'stop'
    holding the stop reason and 'status'/'message' derived from 'converged'."""
    s = _ols_study(n=[50], fit={"estimator": "ols"})
    fresh = s.run(tmp_path, progress=False)
    path = next((tmp_path / "cells").glob("*.parquet"))
    old = pd.read_parquet(path).drop(columns=["status", "message"])
    old.insert(old.columns.get_loc("converged") + 1, "status", ["gtol", "max_iter"] * 3)
    old.loc[1::2, "converged"] = False
    old.to_parquet(path, index=False)
    path.with_name(path.name + ".sha256").unlink()  # cells of that time had no checksum beside them
    with pytest.warns(StudyFailureWarning, match="3 not converged"):
        df = s.run(tmp_path, progress=False)
    assert list(df["stop"]) == ["gtol", "max_iter"] * 3
    assert list(df["status"]) == ["ok", "not_converged"] * 3 and (df["message"] == "").all()
    assert set(fresh.columns) | {"stop"} == set(df.columns)


def test_max_failures_and_ademp_configuration_errors():
    base = dict(truth=LINEAR_TRUTH, fit={"estimator": "ols"}, n=[10], reps=2)
    for bad, match in [(-1, r"max_failures must be a count >= 0"), (1.5, r"max_failures=1.5 is a float, so it is a "
                       r"fraction .* \(0, 1\]"), ("all", "max_failures must be a count"), (True, "must be a count")]:
        with pytest.raises(StudyConfigError, match=match):
            Study(**base, max_failures=bad)
    assert Study(**base, max_failures=0.5).failure_limit() == 1  # half of 1 cell x 2 replicates
    with pytest.raises(StudyConfigError, match=r"study.ademp: unknown key 'aim'; valid keys are \['aims', "):
        Study(**base, ademp={"aim": "x"})
    with pytest.raises(StudyConfigError, match=r"study.ademp.methods must be a string or a list of strings"):
        Study(**base, ademp={"methods": 3})
    s = Study(**base, max_failures=0.25, ademp={"aims": "a", "estimands": ["x", "y"]})
    back = Study.from_toml(s.to_toml())
    assert back.max_failures == 0.25 and back.ademp == {"aims": "a", "estimands": ["x", "y"]}
    assert [c["id"] for c in back.cells] == [c["id"] for c in Study(**base).cells]  # ids do not depend on them


def test_successful_rows_skips_error_rows_with_a_count():
    frame = pd.DataFrame({"n": [10, 10, 20], "status": ["ok", "error", "not_converged"], "D1": [1.0, np.nan, 0.5]})
    with pytest.warns(StudyFailureWarning, match=r"skips 1 error row\(s\) of 3"):
        kept = study_mod.successful_rows(frame)
    assert list(kept["status"]) == ["ok", "not_converged"]


def test_study_rates_skip_error_rows_with_a_count():
    s = Study(truth=LINEAR_TRUTH, fit={"label": "picky", "estimator": "tests.study_cells:picky_ols",
                                       "options": {"y0_above": 1.5}}, n=[40, 80, 160], reps=4, seed=21, threads=1,
              max_failures=12, metrics=[slope_error])
    with pytest.warns(StudyFailureWarning):
        df = s.run(progress=False)
    n_err = int((df["status"] == "error").sum())
    assert 0 < n_err < len(df)  # y[0] ~ N(f(x0), 0.25) exceeds 1.5 in some replicates only (seed 21)
    with pytest.warns(StudyFailureWarning, match=rf"skips {n_err} error row\(s\) of {len(df)}"):
        res = s.rates(df, "slope_error", warn=False)
    assert len(res.data) == len(df) - n_err and list(res.table["fit"]) == ["picky"]
