"""Provenance records name the code that produced a result: the git commit of moestat's source tree."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import moestat
from moestat import provenance as prov


@pytest.fixture(autouse=True)
def _fresh_cache():
    prov.source_revision.cache_clear()
    yield
    prov.source_revision.cache_clear()


def test_provenance_names_the_commit_of_the_source_tree():
    root = Path(moestat.__file__).resolve().parent.parent
    if shutil.which("git") is None or not (root / ".git").exists():  # an installed copy: nothing to name
        assert prov.source_revision() is None
        assert prov.provenance()["source"] is None
        return
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    record = prov.provenance({"seed": 1})
    assert record["source"]["commit"] == head
    assert len(head) == 40
    assert isinstance(record["source"]["uncommitted_changes"], bool)
    json.dumps(record)  # JSON-ready as written by write_provenance


def test_provenance_without_git_records_none(monkeypatch):
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(prov.subprocess, "run", no_git)
    assert prov.source_revision() is None
    assert prov.provenance()["source"] is None


def test_provenance_outside_a_checkout_records_none(monkeypatch):
    def not_a_repo(*args, **kwargs):
        raise subprocess.CalledProcessError(128, args[0], stderr="fatal: not a git repository")

    monkeypatch.setattr(prov.subprocess, "run", not_a_repo)
    assert prov.source_revision() is None


def test_only_code_changes_count(tmp_path):
    """Results a run writes (docs/, benchmarks/results/) and tests are not the code behind a result; the package,
    the scripts and the pins are."""
    if shutil.which("git") is None:  # without git no revision can be read, whatever the tree holds
        assert prov.source_revision(tmp_path) is None
        return

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    files = ["docs/table.csv", "benchmarks/results/run.csv", "tests/test_x.py", "moestat/core.py",
             "vignettes/v.py", "benchmarks/b.py", "constraints.txt"]
    for f in files:
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")

    def changed_after_editing(f):
        git("checkout", "-q", "--", ".")
        (tmp_path / f).write_text("2\n")
        prov.source_revision.cache_clear()
        return prov.source_revision(tmp_path)["uncommitted_changes"]

    assert prov.source_revision(tmp_path)["uncommitted_changes"] is False
    for f in files[:3]:
        assert changed_after_editing(f) is False, f
    for f in files[3:]:
        assert changed_after_editing(f) is True, f


def _record(out, commit):
    out.mkdir(parents=True, exist_ok=True)
    source = None if commit is None else {"commit": commit, "uncommitted_changes": False}
    (out / "provenance.json").write_text(json.dumps({"moestat": "0.1.0", "source": source, "config": {}}))


def test_stale_outputs_note_names_both_commits(tmp_path, monkeypatch):
    now = {"commit": "b" * 40, "uncommitted_changes": False}
    monkeypatch.setattr(prov, "source_revision", lambda root=None: now)
    _record(tmp_path / "old", "a" * 40)
    note = prov.stale_outputs_note(tmp_path / "old")
    assert "aaaaaaaaaa" in note and "bbbbbbbbbb" in note and "--no-resume" in note
    _record(tmp_path / "same", "b" * 40)
    assert prov.stale_outputs_note(tmp_path / "same") is None
    _record(tmp_path / "unrecorded", None)  # written before commits were recorded
    assert prov.stale_outputs_note(tmp_path / "unrecorded") is None
    assert prov.stale_outputs_note(tmp_path / "missing") is None
    monkeypatch.setattr(prov, "source_revision", lambda root=None: None)  # not a checkout now
    assert prov.stale_outputs_note(tmp_path / "old") is None


class _FinishedStudy:
    """A study whose cells are all on disk already: run() only reads them back."""

    cells = ("c0", "c1")

    def run(self, path, **kwargs):
        import pandas as pd

        return pd.DataFrame({"cell": list(self.cells)})


def test_resumed_study_warns_when_its_cells_come_from_other_code(tmp_path, monkeypatch):
    from moestat import _vignette
    from moestat.exceptions import MoestatWarning

    cells = tmp_path / "study" / "cells"
    cells.mkdir(parents=True)
    for c in _FinishedStudy.cells:
        (cells / f"{c}.parquet").write_bytes(b"")
    monkeypatch.setattr(prov, "source_revision", lambda root=None: {"commit": "b" * 40, "uncommitted_changes": False})
    _record(tmp_path, "a" * 40)
    with pytest.warns(MoestatWarning, match="2 finished study cells are reused: .*aaaaaaaaaa"):
        _vignette.run_study_timed(_FinishedStudy(), tmp_path, workers=1)
    _record(tmp_path, "b" * 40)  # the same code: silent
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", MoestatWarning)
        _vignette.run_study_timed(_FinishedStudy(), tmp_path, workers=1)


def test_provenance_names_the_processor_and_the_instruction_set_torch_uses(tmp_path, monkeypatch):
    """Bit-for-bit reproduction of a fit depends on the processor's rounding: the record names both."""
    import torch

    record = prov.provenance()
    assert record["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert isinstance(record["cpu"], str)
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Example CPU 9000 @ 3.0GHz\nflags\t: fpu\n")
    real_path = prov.Path
    monkeypatch.setattr(prov, "Path", lambda p: real_path(info) if p == "/proc/cpuinfo" else real_path(p))
    assert prov.cpu_model() == "Example CPU 9000 @ 3.0GHz"
    monkeypatch.setattr(prov, "Path", lambda p: real_path(tmp_path / "missing"))
    monkeypatch.setattr(prov.platform, "processor", lambda: "x86_64")
    assert prov.cpu_model() == "x86_64"  # no /proc/cpuinfo (macOS, Windows): the platform's answer
