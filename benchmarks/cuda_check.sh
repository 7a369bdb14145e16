#!/usr/bin/env bash
# The CUDA checks, in one script for a GPU machine lent for a few minutes: the CPU-vs-CUDA equality tests, the
# converged least-squares fit of R replicates against one on CUDA, the Newton loop's kernel launches per iteration,
# fit_lse's memory budget on the device,
# the flagship study at full size on CUDA, then
# the study's rows against the vignette's checked-in run (benchmarks/compare_study_run.py), then
# the whole test suite with device="auto" resolving to CUDA (given the time left before DEADLINE seconds).
#
#   bash benchmarks/cuda_check.sh [LOG_DIR]        (default out/cuda-check; one log per part, each part with
#                                                   its own time limit; the suite log lists every test's result
#                                                   as it finishes, so a part cut short still reports)
#
# Needs a python3 with moestat's dependencies and a CUDA build of torch; nothing is downloaded.  Without
# cvxpy the tests of the exact gate solver are deselected; without mkdocs, the docs-site build test.
set -u
LOG=${1:-out/cuda-check}
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
DEADLINE=${DEADLINE:-540}  # seconds from the start by which the suite must end

part() {  # part NAME SECONDS COMMAND...: run with a time limit, log to $LOG/NAME.log, report the exit status
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc, $((SECONDS - t0)) s (limit $limit s)"
  tail -n "${TAIL:-25}" "$LOG/$name.log"
}

{
  nvidia-smi -L
  $PY -c "import torch, numpy, pandas; print('torch', torch.__version__, 'numpy', numpy.__version__, 'pandas',
pandas.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
  $PY -c "import cvxpy; print('cvxpy', cvxpy.__version__)" 2>&1 | tail -1
  nproc
} > "$LOG/env.log" 2>&1
cat "$LOG/env.log"
SELECT=(--ignore tests/test_docs_site.py)
$PY -c "import cvxpy" 2>/dev/null || SELECT+=(-k "not cvxpy")

part cuda_tests "${CUDA_TESTS_LIMIT:-150}" $PY -m pytest -q -p no:cacheprovider -rf tests/test_cuda.py
TAIL=16 part converged "${CONVERGED_LIMIT:-110}" $PY benchmarks/lse_batched.py --parts converged --devices cuda \
  --ns 1000,10000 --reps 20
# kernel launches and milliseconds per Newton iteration of one replicate (the host-bound cost of a converged fit)
TAIL=8 part newton_ops "${OPS_LIMIT:-60}" $PY benchmarks/lse_newton_ops.py --device cuda
# fit_lse's memory budget on the GPU: 20 flagship replicates x 4 restarts, the device allocator's peak under each
# budget (in the same log: a device call brings back at most 8 files)
timeout "${MEMORY_LIMIT:-60}" $PY benchmarks/peak_memory.py --quick --parts lse-blocks --device cuda \
  --budgets none,2GB,256MB >>"$LOG/newton_ops.log" 2>&1
tail -n 6 "$LOG/newton_ops.log"
# the C++ kernels and loops, built once here (cached for the parts below) so that no timed part pays the build
TAIL=4 part native_build "${BUILD_LIMIT:-240}" $PY -c "from moestat.fit import _native as n
print('built:', [f.__name__ for f in (n.load, n.load_newton, n.load_em) if f() is not None])"
rm -rf /tmp/cuda-check-fig1
CPU_WORKERS=$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))
# By default a pool of 2 processes on the GPU (the largest cells) and one of the host's other cores (the smallest
# cells; nproc - 2 of them); the G-bar estimates' Newton in C++ on the host (--gbar-compile, not the vignette's
# setting), each estimate's six starts on six threads (--gbar-threads 6): the first cell of a sigmoid-gelu truth
# computes it in whichever worker runs it, often one of the GPU's, whose lane is the study's critical path.
# STUDY_ARGS="--workers 1" runs the study in one process on the GPU, as the first loans did;
# STUDY_ARGS="--workers 1 --gbar-compile --gbar-threads 6" with each estimate's starts at once on the host's cores.
TAIL=14 part study_full "${STUDY_LIMIT:-170}" $PY benchmarks/study_fig1.py --full --device cuda \
  --out /tmp/cuda-check-fig1 ${STUDY_ARGS:---workers cuda=2,cpu=$CPU_WORKERS --gbar-compile --gbar-threads 6}
# cells finished (all of them, or those done when the limit struck), and their own wall times by n
LOG=$LOG $PY - >>"$LOG/study_full.log" 2>&1 <<'EOF'
import glob
import os

import pandas as pd
files = glob.glob("/tmp/cuda-check-fig1/cells/*.parquet")
print(f"cells finished: {len(files)}")
if files:
    frame = pd.concat((pd.read_parquet(f) for f in files), ignore_index=True)
    print(frame.groupby(["device", "n"])["wall_time"].agg(["count", "sum"]).to_string())
    frame.to_parquet(os.path.join(os.environ["LOG"], "study_cells.parquet"))
EOF
tail -n 16 "$LOG/study_full.log"
# the finished study against the vignette's checked-in run: statuses, objectives, rate and comparison verdicts
# (in the study's log: a device call brings back at most 8 files)
if [ -f "$LOG/study_cells.parquet" ]; then
  timeout 60 $PY benchmarks/compare_study_run.py "$LOG/study_cells.parquet" >>"$LOG/study_full.log" 2>&1
  tail -n 2 "$LOG/study_full.log"
fi
left=$((DEADLINE - SECONDS))
if [ "$left" -gt 30 ]; then
  part suite_auto_cuda "$left" $PY -m pytest -p no:cacheprovider -n "${WORKERS:-14}" -v -rf \
    -o console_output_style=classic "${SELECT[@]}"
  grep -c " PASSED" "$LOG/suite_auto_cuda.log" | sed 's/^/passed so far: /'
  grep -E " FAILED| ERROR" "$LOG/suite_auto_cuda.log" | head -40
else
  echo "== suite_auto_cuda: skipped, $left s left before the deadline"
fi
