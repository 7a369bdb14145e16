"""The shared vignette command line: plain options, and the optional --size, --workers and --peer."""

from __future__ import annotations

from pathlib import Path

import pytest

from moestat._vignette import vignette_cli


def _recorders():
    calls: list[tuple[str, tuple, dict]] = []

    def run(out, **kwargs):
        calls.append(("run", (out,), kwargs))

    def run_peer(peer, out):
        calls.append(("peer", (peer, out), {}))

    return calls, run, run_peer


def test_plain_vignette_gets_quick_and_resume_only():
    calls, run, _ = _recorders()
    assert vignette_cli(run, "demo", ["--quick", "--out", "o", "--no-resume"]) == 0
    assert calls == [("run", (Path("o"),), {"quick": True, "resume": False})]
    with pytest.raises(SystemExit):
        vignette_cli(run, "demo", ["--workers", "2"])  # not offered to a vignette that does not take it


def test_size_workers_and_peer_reach_run_and_peer_alone_reanalyses_only():
    calls, run, run_peer = _recorders()
    opts = dict(sizes=["full", "quick"], workers=True, peer=(run_peer, "github.com/owner/repo"))
    vignette_cli(run, "demo", ["--size", "full", "--workers", "2", "--peer", "clone"], **opts)
    vignette_cli(run, "demo", ["--peer", "clone", "--out", "o"], **opts)
    vignette_cli(run, "demo", ["--quick"], **opts)
    assert calls == [
        ("run", (Path("out/demo"),), {"quick": False, "resume": True, "size": "full", "workers": 2, "peer": "clone"}),
        ("peer", ("clone", "o"), {}),
        ("run", (Path("out/demo"),), {"quick": True, "resume": True, "size": None, "workers": None, "peer": None}),
    ]
    calls.clear()
    vignette_cli(run, "demo", ["--quick", "--workers", "cpu=2"], **opts)  # a pool per device
    assert calls[0][2]["workers"] == {"cpu": 2}
    with pytest.raises(SystemExit):
        vignette_cli(run, "demo", ["--quick", "--workers", "cpu=two"], **opts)
    with pytest.raises(SystemExit):
        vignette_cli(run, "demo", ["--size", "huge"], **opts)
