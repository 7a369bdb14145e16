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
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("moestat is not running from a git checkout")
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
    if shutil.which("git") is None:
        pytest.skip("git is not installed")

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
