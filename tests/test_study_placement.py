"""Where a study's cells run: a device per cell (a rule), and one process pool per device handing out cells from both
ends of the size order (:mod:`moestat._placement`)."""

from __future__ import annotations

import concurrent.futures as cf
import json

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moestat._placement import HOLD_BACK_MARGIN, CellLanes, parse_workers, resolve_device_name
from moestat.study import Study
from tests.study_cells import LINEAR_TRUTH

TIMING = ["wall_time", "fit_wall_time"]


def _ols_study(**kw) -> Study:
    # the 'ols' estimator solves on the CPU whatever device it is given, so a frame computed with any placement
    # equals the serial one apart from the device column
    base = dict(truth=LINEAR_TRUTH, fit={"estimator": "ols", "grid": {"options.ridge": [0.0, 5.0]}},
                n=[50, 100, 200, 400], reps=3, seed=5, threads=1)
    base.update(kw)
    return Study(**base)


def _same_but_device(a: pd.DataFrame, b: pd.DataFrame) -> None:
    drop = [*TIMING, "device"]
    pd.testing.assert_frame_equal(a.drop(columns=drop, errors="ignore"), b.drop(columns=drop, errors="ignore"))


def _cells(ns):
    return [{"id": f"c{i}", "n": n} for i, n in enumerate(ns)]


# ------------------------------------------------------------------ the lanes


def test_lanes_two_ends_meet():
    lanes = CellLanes(_cells([100, 800, 400, 200, 1600]), ["gpu", "cpu"])
    assert lanes.take("gpu")["n"] == 1600 and lanes.take("cpu")["n"] == 100
    assert lanes.take("cpu")["n"] == 200 and lanes.take("gpu")["n"] == 800
    assert lanes.take("gpu")["n"] == 400
    assert lanes.take("cpu") is None and lanes.take("gpu") is None


def test_lanes_ties_keep_design_order_and_one_device_takes_largest_first():
    lanes = CellLanes(_cells([5, 9, 9, 5]), ["cpu"])
    assert [lanes.take("cpu")["id"] for _ in range(4)] == ["c1", "c2", "c0", "c3"]


def test_small_end_declines_what_the_other_end_finishes_sooner():
    """The CPU's worker holds back from the smallest cell left when the GPU, at its measured speed, would get through
    every cell left before the CPU finished that one; before the GPU has finished a cell it is served."""
    lanes = CellLanes(_cells([100, 200, 400, 800]), ["gpu", "cpu"], workers={"gpu": 1, "cpu": 1})
    big, small = lanes.take("gpu"), lanes.take("cpu")
    assert (big["n"], small["n"]) == (800, 100)
    lanes.record("cpu", small, 50.0)
    assert lanes.take("cpu")["n"] == 200  # nothing known of the GPU yet
    lanes.record("gpu", big, 1.0)
    # left: n = 400 (the GPU: 1 s, its smallest size's time, not scaled down); the CPU: 50 s x 4 from n = 100
    assert lanes.estimate("gpu", 400) == 1.0 and lanes.estimate("cpu", 400) == 200.0
    assert lanes.take("cpu") is None and lanes.waiting("cpu") == 1
    assert lanes.take("gpu")["n"] == 400


@pytest.mark.parametrize(("cpu_seconds", "served"), [(1.0, True), (2.0, True), (2.5, False), (3.9, False)])
def test_small_end_takes_its_cell_only_with_the_margin(cpu_seconds, served):
    """The GPU needs (4 + 4) s over its 2 workers = 4 s for the two cells left (n = 200, 300); the CPU's estimate for
    n = 200 is twice its time at n = 100.  It takes the cell only if that is at most 4 s / HOLD_BACK_MARGIN = 2 s:
    a CPU that would be faster than the GPU, but not by the margin, still holds back."""
    assert HOLD_BACK_MARGIN == 2.0
    lanes = CellLanes(_cells([100, 200, 300, 800]), ["gpu", "cpu"], workers={"gpu": 2, "cpu": 1})
    lanes.take("gpu"), lanes.take("cpu")  # n = 800 and 100 handed out
    lanes.record("gpu", {"n": 800}, 4.0)
    lanes.record("cpu", {"n": 100}, cpu_seconds / 2)
    taken = lanes.take("cpu")
    assert (taken is not None and taken["n"] == 200) if served else taken is None


def test_estimates_use_the_median_time_of_a_size():
    lanes = CellLanes(_cells([100]), ["cpu"])
    for seconds in (1.0, 9.0, 2.0):  # e.g. a first cell that paid a start-up
        lanes.record("cpu", {"n": 100}, seconds)
    assert lanes.estimate("cpu", 100) == 2.0 and lanes.estimate("cpu", 300) == 6.0 and lanes.estimate("cpu", 50) == 2.0
    assert CellLanes(_cells([100]), ["cpu"]).estimate("cpu", 100) is None


@settings(max_examples=60, deadline=None)
@given(ns=st.lists(st.integers(1, 10**6), min_size=1, max_size=30),
       order=st.lists(st.sampled_from(["gpu", "mid", "cpu"]), min_size=1, max_size=80),
       pinned=st.booleans(), times=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=10), declines=st.booleans())
def test_lanes_hand_out_every_cell_once(ns, order, pinned, times, declines):
    """Property: whatever the order in which workers ask and the times cells take, each cell is handed out once; with
    a placement, only to its own device and largest first; without one, the last device gets the smallest cell
    left (or, weighing speeds, declines), the others the largest."""
    cells = _cells(ns)
    devices = ["gpu", "mid", "cpu"]
    place = (lambda c: devices[int(c["id"][1:]) % 3]) if pinned else None
    lanes = CellLanes(cells, devices, place, workers=dict.fromkeys(devices, 2) if declines else None)
    taken: dict[str, list[dict]] = {d: [] for d in devices}
    for i, d in enumerate(order + devices * len(cells)):  # then drain
        waiting = lanes.waiting(d)
        c = lanes.take(d)
        assert (c is None) == (waiting == 0) or (declines and not pinned and d == "cpu")
        if c is None:
            continue
        lanes.record(d, c, times[i % len(times)])
        if not pinned:
            left = [x["n"] for x in cells if all(x is not y for ys in taken.values() for y in ys) and x is not c]
            if d == "cpu":
                assert all(c["n"] <= n for n in left)
            else:
                assert all(c["n"] >= n for n in left)
        taken[d].append(c)
    handed = [c["id"] for ys in taken.values() for c in ys]
    assert sorted(handed) == sorted(c["id"] for c in cells)
    if pinned:
        for d, ys in taken.items():
            assert all(place(c) == d for c in ys)
            assert [c["n"] for c in ys] == sorted((c["n"] for c in ys), reverse=True)


# ------------------------------------------------------------------ workers and device arguments


def test_parse_workers_forms():
    assert parse_workers(None) is None and parse_workers(3) == 3 and parse_workers("4") == 4
    assert parse_workers({"cpu": 2}) == {"cpu": 2}
    assert parse_workers("cpu=2, meta=1") == {"cpu": 2, "meta": 1}


@pytest.mark.parametrize(("workers", "match"), [
    (0, "positive number"), (True, "number of processes"), ("cuda", "DEVICE=N"), ("cpu=two", "DEVICE=N"),
    ({}, "non-empty mapping"), ({"cpu": 0}, r"workers\['cpu'\] must be a positive"),
    ({"gpu0": 1}, "not a device"),
])
def test_parse_workers_errors_name_the_argument(workers, match):
    with pytest.raises(ValueError, match=match):
        parse_workers(workers)


def test_parse_workers_refuses_a_device_named_twice():
    """"auto" is the device this host resolves it to (CUDA on a GPU host, else the CPU): named beside that device,
    one device gets two pools."""
    here = resolve_device_name("auto", "device")
    with pytest.raises(ValueError, match=f"names device '{here}' twice"):
        parse_workers({here: 1, "auto": 1})


def test_device_rule_places_each_cell():
    study = _ols_study()
    serial = study.run(progress=False)
    ruled = study.run(progress=False, device=lambda cell: "meta" if cell["n"] >= 200 else "cpu")
    _same_but_device(serial, ruled)
    assert (ruled["device"] == ruled["n"].map(lambda n: "meta" if n >= 200 else "cpu")).all()


def test_device_rule_errors():
    study = _ols_study(n=[50])
    with pytest.raises(ValueError, match=r"device\(cell\) for cell .* not a device"):
        study.run(progress=False, device=lambda cell: "gpu0")
    with pytest.raises(ValueError, match=r"device\(cell\) put cell .* on 'meta', but workers=\{'cpu': 1\} has no pool"):
        study.run(progress=False, device=lambda cell: "meta", workers={"cpu": 1})

    def tamper(cell):
        cell["n"] = 1
        return "cpu"

    with pytest.raises(TypeError):  # the cell's description is read-only
        study.run(progress=False, device=tamper)


def test_pools_need_processes_and_name_the_devices():
    study = _ols_study(n=[50])
    with cf.ThreadPoolExecutor(1) as ex, pytest.raises(ValueError, match="one process pool per device"):
        study.run(progress=False, executor=ex, workers={"cpu": 1})
    with pytest.raises(ValueError, match="the pools name the devices"):
        study.run(progress=False, device="cpu", workers={"cpu": 1, "meta": 1})


# ------------------------------------------------------------------ pools per device, end to end


def test_pools_per_device_split_the_cells_from_both_ends(tmp_path):
    """Two pools ('meta' stands for a second device: the 'ols' cells solve on the CPU whatever they are given): the
    first-named device starts on the largest cell, the last-named on the smallest, every cell runs once and the frame
    is the serial one; the provenance counts the cells per device."""
    study = _ols_study()
    serial = study.run(progress=False)
    pooled = study.run(tmp_path, progress=False, workers={"meta": 1, "cpu": 1})
    _same_but_device(serial, pooled)
    # each pool's first pick is fixed (later ones depend on timing): the largest cell, the first of its ties in the
    # design's order, and the smallest, the last of its ties
    device = pooled.groupby("cell", sort=False)["device"].agg(set)
    assert device.loc[next(c for c in device.index if "__n400__" in c)] == {"meta"}
    assert device.loc[[c for c in device.index if "__n50__" in c][-1]] == {"cpu"}
    prov = json.loads((tmp_path / "provenance.json").read_text())
    assert prov["device"] == "meta+cpu"
    assert prov["config"]["cells_by_device"] == pooled.drop_duplicates("cell")["device"].value_counts().to_dict()
    assert sum(prov["config"]["cells_by_device"].values()) == len(study.cells)


def test_pools_with_a_rule_keep_each_cell_on_its_device(tmp_path):
    study = _ols_study()
    serial = study.run(progress=False)
    rule = lambda cell: "meta" if cell["n"] >= 200 else "cpu"  # noqa: E731
    pooled = study.run(tmp_path, progress=False, workers="meta=2,cpu=1", device=rule)
    _same_but_device(serial, pooled)
    assert (pooled["device"] == pooled["n"].map(lambda n: "meta" if n >= 200 else "cpu")).all()
