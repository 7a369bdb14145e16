"""The softmax-gaussian-moe vignette: its design is the peer's benchmark, a tiny size runs end to end, and its reader
of the peer's stored fits computes the peer's loss (checked against a loop transcribing the peer's definition)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import moestat._vignette_index as vindex


@pytest.fixture(scope="module")
def mod():
    return vindex.load(vindex.find("softmax-gaussian-moe"))


def test_design_is_the_peers_benchmark_and_prespecified(mod):
    assert mod.NAME == "softmax-gaussian-moe" and mod.TITLE and callable(mod.run)
    quick, full = mod.make_study("quick"), mod.make_study("full")
    (truth,) = quick.truths
    # CRPE-SGaME models.py, model 1: gate -8 + 25x against the reference, experts 15 - 20x and -5 + 20x, sds 0.3, 0.4
    assert truth["params"]["gate_bias"] == [-8.0, 0.0] and truth["params"]["gate_weight"] == [[25.0], [0.0]]
    assert truth["params"]["expert_bias"] == [15.0, -5.0] and truth["params"]["expert_weight"] == [[-20.0], [20.0]]
    assert truth["params"]["noise_sd"] == [0.3, 0.4]
    assert truth["design"] == "linspace" and (truth["low"], truth["high"]) == (0.0, 1.0) and truth["model"] == "mixture"
    ks = {f["label"]: (f["k"], f["options"].get("duplicate", []), f["options"]["init"]) for f in quick.fits}
    assert ks["K2"] == (2, [], "near_truth") and ks["K3 split 2"] == (3, [1], "near_truth")
    assert {v[0] for v in ks.values()} == {2, 3, 4} and all(v[2] == "near_truth" for v in ks.values())
    # quick: >= 5 sample sizes over >= 1 decade; full: 2 decades, more replicates
    assert len(quick.n) >= 5 and max(quick.n) / min(quick.n) >= 10 and quick.reps >= 20
    assert max(full.n) / min(full.n) >= 100 and full.reps > quick.reps
    assert [f["label"] for f in full.fits] == [f["label"] for f in quick.fits]
    with pytest.raises(ValueError, match="size='huge'"):
        mod.make_study("huge")
    with pytest.raises(ValueError, match="not fits of this vignette"):
        mod.make_study("tiny", fits=["K5"])


def test_tiny_size_runs_end_to_end(mod, tmp_path):
    frame = mod.run(tmp_path, size="tiny", workers=1, progress=False)
    for f in ["results.csv", "rates.csv", "rates_k.csv", "rates_cells.csv", "peer_method.csv", "windows.csv",
              "fits.csv", "checks.csv", "performance.csv", "loss_k2.png", "loss_k3.png",
              "provenance.json", "study/report.md", "study/study.toml"]:
        assert (tmp_path / f).is_file(), f
    assert len(frame) == 3 * 3 * 3 and set(frame["fit"]) == {"K2", "K3 split 1", "K3 split 2, EM 1e-6"}
    assert (frame["gaussian_voronoi"] >= 0).all() and set(frame.loc[frame["fit"] == "K2", "cell_sizes"]) == {"1-1"}
    assert set(frame.loc[frame["fit"] == "K2", "voronoi_kind"]) == {"exact"}
    assert set(frame.loc[frame["fit"] != "K2", "voronoi_kind"]) == {"over"}
    # the check fit runs the peer's EM settings: no quasi-Newton phase, relative tolerance 1e-6
    check = frame[frame["fit"] == "K3 split 2, EM 1e-6"]
    assert (check["tol"] == 1e-6).all() and (check["switch_after"] == 2000).all()
    assert (check["init_scale"] == 0.005).all()
    rates = pd.read_csv(tmp_path / "rates.csv")
    assert list(rates["fit"]) == ["K2", "K3 split 1", "K3 split 2, EM 1e-6"] and (rates["theory"] == 0.5).all()
    assert list(rates["peer_exponent"]) == [0.638, 1.181, 1.181]
    # three n values over 0.6 decade: the verdict must refuse to call it a rate
    assert (rates["verdict"] == "range too narrow").all()
    cells = pd.read_csv(tmp_path / "rates_cells.csv")
    assert set(cells["fit"]) == {"K3 split 1", "K3 split 2, EM 1e-6"}
    assert cells.groupby("fit")["share"].sum().to_numpy() == pytest.approx([1.0, 1.0])
    report = (tmp_path / "study" / "report.md").read_text()
    for section in ("### Aims", "### Data-generating mechanisms", "### Estimands", "### Methods",
                    "### Performance measures", "## Failures", "## Performance"):
        assert section in report, section
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["config"]["sizes"]["n"] == [300, 600, 1200] and prov["config"]["seed"] == mod.SEED


def _peer_loss(betas, As, Sigmas, beta, A, Sigma, rbar=(0, 1, 4, 6)):
    """A transcription of CRPE-SGaME's discrepancies.loss_SGaME_exact (commit 53c4234) for one fit: gates
    ``beta`` (2, K) with the last column zero, experts ``A`` (2, K) (intercept, slope), variances ``Sigma`` (1, K);
    truth likewise with variances.  Written as loops from the peer's definition, independently of moestat."""
    ks, k = betas.shape[1], beta.shape[1]
    dist = np.empty((k, ks))
    for i in range(k):
        for j in range(ks):
            dist[i, j] = (abs(betas[1, j] - beta[1, i]) + abs(As[0, j] - A[0, i]) + abs(As[1, j] - A[1, i])
                          + abs(Sigmas[0, j] - Sigma[0, i]))
    vor = [int(np.argmin(dist[i])) for i in range(k)]  # no ties in these fits
    counts = np.bincount(vor, minlength=ks)
    total = 0.0
    for i in range(k):
        j = vor[i]
        if counts[j] == 1:
            total += np.exp(beta[0, i]) * dist[i, j]
        elif k != ks:
            r = rbar[counts[j]]
            slope_and_bias = abs(beta[1, i] - betas[1, j]) ** r + abs(A[0, i] - As[0, j]) ** r
            expert_slope_and_var = abs(A[1, i] - As[1, j]) ** (r / 2) + abs(Sigma[0, i] - Sigmas[0, j]) ** (r / 2)
            total += np.exp(beta[0, i]) * (slope_and_bias + expert_slope_and_var)
    for j in range(ks):
        total += abs(sum(np.exp(beta[0, i]) for i in range(k) if vor[i] == j) - np.exp(betas[0, j]))
    return total


def _write_peer(folder, k, beta, A, var, loss):
    """Arrays in the peer's layout: beta (n, reps, 2, k-1), A (n, reps, 2, k), Sigma (n, reps, 1, k), loss (n, reps)."""
    base = folder / "results_SGaME"
    base.mkdir(parents=True, exist_ok=True)
    prefix = {2: "result_model1_K2_ns_min100_ns_max100000_n_num200_rep40_ntries1_",
              3: "result_model1_K3_ns_min10000_ns_max100000_n_num200_rep40_ntries5_",
              4: "result_model1_K4_ns_min10000_ns_max100000_n_num200_rep40_ntries5_"}[k]
    for part, arr in (("beta", beta), ("A", A), ("Sigma", var), ("loss", loss)):
        np.save(base / f"{prefix}{part}.npy", arr)


def test_peer_reader_computes_the_peers_loss(mod, tmp_path):
    """Fits in the peer's layout (two n values x 3 replicates per k, jittered around splits of the truth): the loss
    moestat computes in the peer's convention equals the transcribed loop, and the stored loss is carried through."""
    rng = np.random.default_rng(7)
    betas = np.array([[-8.0, 0.0], [25.0, 0.0]])
    As = np.array([[15.0, -5.0], [-20.0, 20.0]])
    sig2 = np.array([[0.09, 0.16]])
    src = {2: [0, 1], 3: [0, 0, 1], 4: [0, 1, 1, 1]}  # the last fitted atom copies the reference, as meteoritsSim
    expected = {}
    for k, atoms in src.items():
        shape = (200, 3)
        beta = np.empty((*shape, 2, k - 1))
        A = np.empty((*shape, 2, k))
        var = np.empty((*shape, 1, k))
        for i, j in enumerate(atoms):
            if i < k - 1:
                beta[..., i] = betas[:, j] + rng.normal(0, 0.05, (*shape, 2))
            A[..., i] = As[:, j] + rng.normal(0, 0.05, (*shape, 2))
            var[..., i] = sig2[:, j] + np.abs(rng.normal(0, 0.005, (*shape, 1)))
        full_beta = np.concatenate([beta, np.zeros((*shape, 2, 1))], -1)
        direct = np.array([[_peer_loss(betas, As, sig2, full_beta[a, b], A[a, b], var[a, b]) for b in range(3)]
                           for a in range(200)])
        expected[k] = direct
        # the stored loss differs by 1: it must be carried through, not recomputed
        _write_peer(tmp_path, k, beta, A, var, direct + 1.0)
    pf = mod.peer_frame(tmp_path)
    for k in src:
        sub = pf[pf["k"] == k]
        np.testing.assert_allclose(sub["peer_convention"].to_numpy(), expected[k].ravel(), rtol=1e-10)
        np.testing.assert_allclose(sub["peer_loss"].to_numpy(), expected[k].ravel() + 1.0, rtol=1e-12)
        assert sub["n"].iloc[0] == (100 if k == 2 else 10000) and sub["n"].iloc[-1] == 100000
    assert set(pf.loc[pf["k"] == 4, "peer_cells"]) == {"1-3"}


def test_peer_convention_charges_an_exact_split_of_the_reference_expert(mod, tmp_path):
    """Hand calculation: expert 2 (the reference) split in two equal copies is the true model exactly; with the last
    gate fixed at 0 the copies' gates are 0 and 0 and expert 1's is -8 + log 2, so the peer's loss is
    |1 + 1 - 1| + |2 e^-8 - e^-8| = 1 + e^-8, while the translation-centred loss is 0."""
    shape = (200, 3)
    # columns: expert 1, the copy of expert 2, expert 2 (last, gate fixed at 0); gate rows (intercept, slope)
    beta = np.broadcast_to(np.array([[-8.0 + np.log(2.0), 0.0], [25.0, 0.0]]), (*shape, 2, 2)).copy()
    A = np.broadcast_to(np.array([[15.0, -5.0, -5.0], [-20.0, 20.0, 20.0]]), (*shape, 2, 3)).copy()
    var = np.broadcast_to(np.array([[0.09, 0.16, 0.16]]), (*shape, 1, 3)).copy()
    experts, variances = np.array([[15.0, -5.0], [-20.0, 20.0]]), np.array([[0.09, 0.16]])
    # k = 2: the truth itself; k = 4: expert 2 split in three copies (expert 1's gate -8 + log 3)
    for k, atoms, gates in ((2, [0, 1], [[-8.0], [25.0]]), (4, [0, 1, 1, 1], [[-8.0 + np.log(3.0), 0.0, 0.0],
                                                                              [25.0, 0.0, 0.0]])):
        _write_peer(tmp_path, k, np.broadcast_to(np.array(gates), (*shape, 2, k - 1)).copy(),
                    np.broadcast_to(experts[:, atoms], (*shape, 2, k)).copy(),
                    np.broadcast_to(variances[:, atoms], (*shape, 1, k)).copy(), np.zeros(shape))
    _write_peer(tmp_path, 3, beta, A, var, np.zeros(shape))
    pf = mod.peer_frame(tmp_path)
    k3 = pf[pf["k"] == 3]
    np.testing.assert_allclose(k3["peer_convention"], 1.0 + np.exp(-8.0), rtol=1e-12)
    np.testing.assert_allclose(k3["peer_weight_gap"], 1.0 + np.exp(-8.0), rtol=1e-12)
    assert set(k3["cell_sizes"]) == {"1-2"} and k3["gaussian_voronoi"].max() < 1e-12
    k4 = pf[pf["k"] == 4]  # three copies of the reference: |3 - 1| + |3 e^-8 - e^-8|
    np.testing.assert_allclose(k4["peer_convention"], 2.0 + 2.0 * np.exp(-8.0), rtol=1e-12)
    assert pf.loc[pf["k"] == 2, "peer_convention"].max() < 1e-12


def test_peer_reader_names_a_wrong_folder(mod, tmp_path):
    with pytest.raises(ValueError, match="results_SGaME"):
        mod.peer_frame(tmp_path)
