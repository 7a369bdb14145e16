"""Checkpoints of long jobs (moestat.checkpoint): atomic writes and the store of finished cells."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moestat.checkpoint import CellStore, config_hash, write_atomic, write_frame
from moestat.exceptions import CheckpointWarning


def _frame(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"n": [100, 200, 400], "rep": [0, 0, 1], "loss": rng.random(3), "model": ["a", "b", "c"]})


def test_a_writer_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "cell.csv"
    write_frame(_frame(0), path)
    before = path.read_bytes()

    def torn(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write("n,rep,lo")  # half a header, then the process "dies"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(path, torn)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cell.csv", "cell.csv.sha256"]  # no temporary left


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_store_computes_once_and_gives_back_the_stored_frame(tmp_path, fmt):
    calls = []

    def compute() -> pd.DataFrame:
        calls.append(1)
        return _frame(len(calls))

    store = CellStore(tmp_path / "cells", config={"T": 10}, fmt=fmt)
    first = store.get("moe-cubic", compute)
    again = CellStore(tmp_path / "cells", config={"T": 10}, fmt=fmt).get("moe-cubic", compute)
    assert len(calls) == 1
    pd.testing.assert_frame_equal(first, again)  # a fresh and a resumed run return identical frames
    fresh = CellStore(tmp_path / "cells", config={"T": 10}, fmt=fmt, resume=False).get("moe-cubic", compute)
    assert len(calls) == 2 and not fresh.equals(first)


def test_a_changed_setting_recomputes_instead_of_reusing_a_stale_cell(tmp_path):
    calls = []
    store = CellStore(tmp_path, config={"T": 10, "eta": 0.01})
    store.get("cell", lambda: calls.append(1) or _frame(1))
    CellStore(tmp_path, config={"eta": 0.01, "T": 10}).get("cell", lambda: calls.append(1) or _frame(1))
    assert len(calls) == 1  # key order does not matter
    CellStore(tmp_path, config={"T": 20, "eta": 0.01}).get("cell", lambda: calls.append(1) or _frame(2))
    store.get("cell", lambda: calls.append(1) or _frame(3), key={"block": 2})
    assert len(calls) == 3 and len(list(tmp_path.glob("cell-*.csv"))) == 3


def test_store_errors_name_the_problem(tmp_path):
    store = CellStore(tmp_path)
    assert not store.done("missing")
    with pytest.raises(FileNotFoundError, match="cell 'missing' is not stored"):
        store.read("missing")
    with pytest.raises(ValueError, match="fmt must be 'csv' or 'parquet'"):
        CellStore(tmp_path, fmt="json")
    with pytest.raises(ValueError, match=r"path must end in \.parquet or \.csv"):
        write_frame(_frame(), tmp_path / "cell.txt")
    assert config_hash({"a": np.float64(1.0), "b": (1, 2)}) == config_hash({"b": [1, 2], "a": 1.0})


def test_a_frame_file_changed_after_writing_fails_its_checksum(tmp_path):
    from moestat.checkpoint import ChecksumError, read_frame, write_frame

    frame = pd.DataFrame({"rep": [0, 1, 2], "loss": [0.5, 0.25, 0.125]})
    path = tmp_path / "cell.parquet"
    write_frame(frame, path)
    assert (tmp_path / "cell.parquet.sha256").is_file()
    pd.testing.assert_frame_equal(read_frame(path), frame)
    edited = frame.assign(loss=[0.5, 0.25, 0.126])  # same shape and columns, one value changed
    edited.to_parquet(path, index=False)
    with pytest.raises(ChecksumError, match=r"cell\.parquet does not match its recorded SHA-256"):
        read_frame(path)
    (tmp_path / "cell.parquet.sha256").unlink()  # a file written before checksums is read as it is
    pd.testing.assert_frame_equal(read_frame(path), edited)


def test_cell_store_recomputes_a_cell_whose_checksum_fails(tmp_path):
    from moestat.checkpoint import CellStore

    store = CellStore(tmp_path, config={"n": 10}, fmt="parquet")
    first = store.get("a", lambda: pd.DataFrame({"x": [1.0, 2.0]}))
    path = store.path("a")
    pd.DataFrame({"x": [1.0, 3.0]}).to_parquet(path, index=False)
    with pytest.warns(CheckpointWarning, match="stored cell 'a'.*Recomputing"):
        again = store.get("a", lambda: pd.DataFrame({"x": [1.0, 2.0]}))
    pd.testing.assert_frame_equal(again, first)
