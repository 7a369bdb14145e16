"""Ctrl-C (SIGINT) to a ``moestat study run --workers 2`` process: it stops at once instead of waiting for the
running cells, ends and reaps its workers, records the interruption, exits with code 130, and a ``--resume`` run
returns the frame of an uninterrupted run."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

import moestat.study as study_mod
from moestat.checkpoint import read_frame
from moestat.cli import main
from moestat.study import Study, _end_workers
from tests.study_cells import LINEAR_TRUTH, NAP_ENV, stubborn_sleep

ROOT = Path(__file__).resolve().parents[1]
TIMING = ["wall_time", "fit_wall_time"]

# How long a Ctrl-C'd run may take to exit.  After SIGINT the run cancels its pending cells, ends its two napping
# workers (SIGTERM ends a sleeping process at once), reaps them, writes provenance.json and exits: well under a
# second on an idle machine, a few seconds on a loaded 2-core one (interpreter teardown with torch loaded).  60 s
# leaves a margin of 10x and more, yet it is 10x below the 600 s that the running cells nap, which is what the
# old behaviour (waiting for every running cell) takes; so the bound separates the two without flaking.
EXIT_BOUND_S = 60.0
NAP_S = 600
# The stubborn cells ignore SIGTERM; the run kills them (SIGKILL) after its grace period (a few seconds) or at
# once on a second Ctrl-C.  Either way it exits within the same bound.

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals and /proc (Linux)")


def _study_toml(path: Path) -> Path:
    """Six cells; with the nap on, every cell but the largest (n = 60, handed out first) sleeps ``NAP_S``."""
    study = Study(truth={"label": "normal", "data": {"mu": 0.5}}, fit={"label": "mean"},
                  n=[10, 20, 30, 40, 50, 60], reps=3, seed=5, cell="tests.study_cells:napping_cell",
                  name="interruptible")
    study.to_toml(path)
    return path


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.drop(columns=TIMING, errors="ignore").reset_index(drop=True),
                                  b.drop(columns=TIMING, errors="ignore").reset_index(drop=True))


def _env(nap: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            NAP_ENV: nap}


def _workers(pid: int) -> list:
    """The pool workers among the children of ``pid``: psutil processes if psutil is installed (their identity
    includes the start time, so a reused pid is not mistaken for a worker), else pids from /proc."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            kids = psutil.Process(pid).children()
        except psutil.NoSuchProcess:
            return []
        found = []
        for kid in kids:
            with contextlib.suppress(psutil.Error):
                if "spawn_main" in " ".join(kid.cmdline()):
                    found.append(kid)
        return found
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if int(fields[1]) == pid and "spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return found


def _running(worker) -> bool:
    """Whether a recorded worker (psutil process or pid) still exists as a process that is not a zombie."""
    if isinstance(worker, int):
        try:
            return Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    import psutil

    try:
        return worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _start_and_wait_for_first_cell(argv: list[str], out: Path, nap: str, logs: Path) -> tuple[subprocess.Popen, list]:
    """Start the study process, wait until its first cell is stored and both workers run; return it and them."""
    logs.mkdir(exist_ok=True)
    # SIGINT as a terminal gives it: a test run started in the background of a non-interactive shell (as CI jobs
    # often are) ignores SIGINT, and an ignored disposition is inherited, so Ctrl-C would never reach the study
    proc = subprocess.Popen(argv, env=_env(nap), stdout=open(logs / "stdout", "wb"),
                            stderr=open(logs / "stderr", "wb"),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # generous: spawning two workers that import torch can take a minute on a loaded 2-core machine
    deadline, workers = time.monotonic() + 300, []
    while time.monotonic() < deadline and proc.poll() is None:
        workers = _workers(proc.pid)
        if len(workers) >= 2 and out.is_dir() and any((out / "cells").glob("*.parquet")):
            break
        time.sleep(0.1)
    if proc.poll() is not None or len(workers) < 2:
        _stop(proc)
        pytest.fail(f"the study did not get going (exit {proc.returncode}): {(logs / 'stderr').read_text()}")
    time.sleep(1.0)  # the worker that finished the quick cell takes its next (napping) one
    return proc, workers


def _stop(proc: subprocess.Popen) -> None:
    """SIGKILL the process this test started, if it still runs (its workers end with it: parent-death signal)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def _interrupt(proc: subprocess.Popen, times: int = 1) -> float:
    """Send ``times`` SIGINTs (0.5 s apart) to the study process; return the seconds until it exited."""
    t0 = time.monotonic()
    for i in range(times):
        if i:
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        _stop(proc)
        pytest.fail(f"the study was still running {EXIT_BOUND_S:.0f} s after Ctrl-C (waiting for its running cells?)")
    return time.monotonic() - t0


def _cli(toml: Path, out: Path, *extra: str, workers: str = "2") -> list[str]:
    return [sys.executable, "-m", "moestat", "study", "run", str(toml), "--out", str(out), "--workers", workers,
            "--quiet", *extra]


# "meta=1,cpu=1": a pool per device ('meta' stands for a second device; the napping cells ignore theirs), the first
# taking the largest cell (n = 60, which does not nap) and the second the smallest
@pytest.mark.parametrize("pools", ["2", "meta=1,cpu=1"])
def test_ctrl_c_stops_a_pool_run_at_once_and_resume_equals_an_uninterrupted_run(tmp_path, monkeypatch, pools):
    monkeypatch.delenv(NAP_ENV, raising=False)
    toml = _study_toml(tmp_path / "study.toml")
    out = tmp_path / "out"
    proc, workers = _start_and_wait_for_first_cell(_cli(toml, out, workers=pools), out, f"{NAP_S}:60",
                                                   tmp_path / "logs")
    assert proc.poll() is None
    stored = sorted((out / "cells").glob("*.parquet"))
    assert len(stored) == 1 and "__n60__" in stored[0].name  # the other five cells nap or wait

    elapsed = _interrupt(proc)
    err = (tmp_path / "logs" / "stderr").read_text()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err, err
    # the run ended and reaped its workers before it exited (checked at once, not after a grace period)
    assert not [w for w in workers if _running(w)], f"workers outlived the interrupted run ({elapsed:.1f} s)"

    prov = json.loads((out / "provenance.json").read_text())["config"]
    assert prov["status"] == "interrupted"
    assert prov["cells_finished"] == 1 and prov["n_cells"] == 6
    assert not (out / "results.parquet").exists()
    assert not list((out / "cells").glob(".*tmp*"))

    # the finished cell is intact: its checksum holds and its rows are those of an uninterrupted run
    reference = Study.from_toml(toml).run(progress=False)
    cell = read_frame(stored[0])
    _same(cell.drop(columns="device"), reference[reference["cell"] == cell["cell"].iloc[0]].drop(columns="device"))

    # a resumed run (no nap) finishes the other five cells and returns the uninterrupted frame
    assert main(["study", "run", str(toml), "--out", str(out), "--workers", pools, "--quiet", "--resume"]) == 0
    _same(pd.read_parquet(out / "results.parquet").drop(columns="device"), reference.drop(columns="device"))
    assert json.loads((out / "provenance.json").read_text())["config"]["status"] == "complete"


_REPORTING_CLI = textwrap.dedent("""
    import json, sys
    from moestat.cli import main
    from tests.test_study_interrupt import _children_left
    rc = main(sys.argv[2:])
    with open(sys.argv[1], "w") as fh:
        json.dump(_children_left(), fh)
    sys.exit(rc)
""")


def _children_left() -> list[str]:
    """This process's children that are pool workers or zombies (the resource tracker lives until we exit)."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and (fields[0] == "Z" or "resource_tracker" not in cmdline):
            left.append(f"{stat.parent.name} state {fields[0]} {cmdline!r}")
    return left


@pytest.mark.parametrize("sigints", [1, 2])
def test_workers_that_ignore_sigterm_are_killed_and_reaped_even_on_a_second_ctrl_c(tmp_path, monkeypatch, sigints):
    """Cells that ignore SIGTERM: the run kills them after its grace period (one Ctrl-C) or at once (a second Ctrl-C,
    sent while the first one's cleanup runs); either way it exits with 130 and leaves no worker and no zombie.  The
    children are listed by the study process itself after the CLI returned, where an unreaped worker would show up
    as a zombie (after the process exits its orphans are reaped by init, which would hide one)."""
    monkeypatch.delenv(NAP_ENV, raising=False)
    toml = _study_toml(tmp_path / "study.toml")
    out, report = tmp_path / "out", tmp_path / "children.json"
    argv = [sys.executable, "-c", _REPORTING_CLI, str(report), *_cli(toml, out)[3:]]
    proc, workers = _start_and_wait_for_first_cell(argv, out, f"{NAP_S}:60:stubborn", tmp_path / "logs")
    elapsed = _interrupt(proc, times=sigints)
    err = (tmp_path / "logs" / "stderr").read_text()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert json.loads(report.read_text()) == [], f"children left after {elapsed:.1f} s"
    assert not [w for w in workers if _running(w)]
    assert json.loads((out / "provenance.json").read_text())["config"]["status"] == "interrupted"


# ------------------------------------------------------------------ in-process pieces

def _stubborn_processes(count: int) -> list:
    ctx = multiprocessing.get_context("spawn")
    ready = [ctx.Event() for _ in range(count)]
    procs = [ctx.Process(target=stubborn_sleep, args=(r, 600.0)) for r in ready]
    for p in procs:
        p.start()
    # SIGTERM must find the handler installed, else the process would end at once and test nothing
    assert all(r.wait(120) for r in ready), "the stubborn processes did not start"
    return procs


@pytest.mark.parametrize("hurried", [False, True])
def test_end_workers_kills_what_sigterm_spares_after_the_grace_or_at_once_when_hurried(hurried):
    """Processes that ignore SIGTERM are SIGKILLed after the grace period, or as soon as ``hurry`` is set (a second
    Ctrl-C), and reaped; a plain process ends at SIGTERM."""
    ctx = multiprocessing.get_context("spawn")
    plain = ctx.Process(target=time.sleep, args=(600.0,))
    plain.start()
    procs = [*_stubborn_processes(2), plain]
    hurry = threading.Event()
    # hurried: a grace of 600 s that the second Ctrl-C (0.5 s in) cuts short; not hurried: a 1 s grace to wait out
    grace = 600.0 if hurried else 1.0
    timer = threading.Timer(0.5, hurry.set) if hurried else None
    if timer is not None:
        timer.start()
    t0 = time.monotonic()
    _end_workers(procs, hurry, grace=grace)
    elapsed = time.monotonic() - t0
    # ending three sleeping processes takes milliseconds; 60 s is a loaded machine's margin and 10x below the
    # 600 s grace that an ignored hurry would wait
    assert elapsed < 60.0, elapsed
    if not hurried:
        assert elapsed >= 1.0  # the stubborn ones outlived SIGTERM for the whole grace
    assert [p.exitcode for p in procs] == [-signal.SIGKILL, -signal.SIGKILL, -signal.SIGTERM]  # set once reaped


def test_a_given_executor_only_has_its_pending_cells_cancelled(tmp_path):
    """Ctrl-C (here raised by the executor, as the signal would be in the main thread) while a caller's executor
    runs cells: the pending cells are cancelled, the running one is left alone, the executor is not shut down, and
    the folder records the interruption."""
    gate = threading.Event()

    class Interrupted(cf.ThreadPoolExecutor):
        def __init__(self) -> None:
            super().__init__(max_workers=1)
            self.futures: list[cf.Future] = []

        def submit(self, fn, *args, **kwargs):
            if len(self.futures) == 3:  # the fourth cell's submission is interrupted
                raise KeyboardInterrupt
            self.futures.append(super().submit(lambda: (gate.wait(120), fn(*args, **kwargs))[1]))
            return self.futures[-1]

    study = Study(truth=LINEAR_TRUTH, fit={"estimator": "ols"}, n=[50, 60, 70, 80], reps=2, seed=3, threads=1)
    with Interrupted() as ex:
        with pytest.raises(KeyboardInterrupt):
            study.run(tmp_path, executor=ex, progress=False)
        # the one thread holds the first cell (gated), so the second and third were still pending
        assert not ex.futures[0].cancelled() and ex.futures[1].cancelled() and ex.futures[2].cancelled()
        gate.set()
        assert ex.futures[0].result(timeout=120).frame["rep"].tolist() == [0, 1]  # the running cell went on
        assert cf.ThreadPoolExecutor.submit(ex, lambda: 42).result(timeout=120) == 42  # not shut down
    prov = json.loads((tmp_path / "provenance.json").read_text())["config"]
    assert prov["status"] == "interrupted" and prov["cells_finished"] == 0


def test_serial_interrupt_records_finished_cells_and_resume_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    """In-process cells: Ctrl-C in the third cell; two cells are stored, provenance says so, the exception says how
    to go on (Python >= 3.11), and a resume returns the uninterrupted frame."""
    study = Study(truth=LINEAR_TRUTH, fit={"estimator": "ols"}, n=[50, 60, 70, 80], reps=2, seed=3, threads=1)
    reference = study.run(progress=False)
    real, calls = study_mod.run_cell, []

    def interrupted_at_third(payload):
        calls.append(payload["cell"]["id"])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(payload)

    monkeypatch.setattr(study_mod, "run_cell", interrupted_at_third)
    with pytest.raises(KeyboardInterrupt) as info:
        study.run(tmp_path, progress=False)
    monkeypatch.setattr(study_mod, "run_cell", real)
    prov = json.loads((tmp_path / "provenance.json").read_text())["config"]
    assert prov["status"] == "interrupted" and prov["cells_finished"] == 2
    assert len(list((tmp_path / "cells").glob("*.parquet"))) == 2
    if sys.version_info >= (3, 11):
        assert "2 of 4 cells finished" in str(info.value.__notes__) and "resume=True" in str(info.value.__notes__)
    _same(study.run(tmp_path, progress=False), reference)


_SLOW_STARTING_MAIN = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path

    if __name__ == "__mp_main__":  # a pool worker re-imports the main script before its initializer runs
        # deaf to SIGTERM, so the run's ending of its workers cannot kill one before a traceback would be printed
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        Path(os.environ["MARKS"], f"worker-{os.getpid()}").touch()
        time.sleep(120.0)

    if __name__ == "__main__":
        from moestat.study import Study
        study = Study.from_toml(sys.argv[1])
        try:
            study.run(sys.argv[2], executor="processes", workers=2, progress=False)
        except KeyboardInterrupt:
            sys.exit(130)
""")


def test_ctrl_c_while_workers_still_start_prints_no_worker_traceback(tmp_path, monkeypatch):
    """Ctrl-C at a terminal reaches the whole process group, the workers too, and a worker that is still starting
    (importing the main script, before the pool's initializer has made it ignore SIGINT) would print a
    KeyboardInterrupt traceback.  Here the workers take 120 s to start and ignore SIGTERM meanwhile (the run then
    SIGKILLs them after its grace period, which leaves a traceback time to appear); the group gets SIGINT while they
    start, and the run must end quietly with its workers gone."""
    monkeypatch.delenv(NAP_ENV, raising=False)
    toml = _study_toml(tmp_path / "study.toml")
    script, marks, logs = tmp_path / "slow_start.py", tmp_path / "marks", tmp_path / "logs"
    script.write_text(_SLOW_STARTING_MAIN)
    marks.mkdir()
    logs.mkdir()

    def terminal_like() -> None:  # its own process group with SIGINT at its default, as a shell job at a terminal
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, str(script), str(toml), str(tmp_path / "out")],
                            env={**_env(""), "MARKS": str(marks)}, stdout=open(logs / "stdout", "wb"),
                            stderr=open(logs / "stderr", "wb"), preexec_fn=terminal_like)
    deadline = time.monotonic() + 300  # spawning two interpreters on a loaded 2-core machine
    while time.monotonic() < deadline and proc.poll() is None and len(list(marks.iterdir())) < 2:
        time.sleep(0.1)
    if proc.poll() is not None or len(list(marks.iterdir())) < 2:
        _stop(proc)
        pytest.fail(f"the workers did not start (exit {proc.returncode}): {(logs / 'stderr').read_text()}")
    workers = [int(p.name.split("-")[1]) for p in marks.iterdir()]
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        _stop(proc)
        pytest.fail(f"the run was still going {EXIT_BOUND_S:.0f} s after Ctrl-C")
    err = (logs / "stderr").read_text()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert not [w for w in workers if _running(w)]
