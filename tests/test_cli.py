"""The moestat console script: --version and simulate."""

import subprocess
import sys

import moestat as ms
from moestat.cli import main


def test_version_via_console_entry():
    out = subprocess.run([sys.executable, "-m", "moestat.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"moestat {ms.__version__}"


def test_simulate_prints_a_tidy_frame_and_writes_files(tmp_path, capsys):
    assert main(["simulate", "--n", "20", "--reps", "2", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "rep  atom     block  coord" in printed and "per-replicate summary" in printed
    assert (tmp_path / "data.csv").exists() and (tmp_path / "truth.csv").exists()


def test_bad_arguments_exit_nonzero(capsys):
    assert main(["simulate", "--n", "0"]) == 2
    assert "n must be" in capsys.readouterr().err
    assert main([]) == 2
