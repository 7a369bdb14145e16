#!/usr/bin/env bash
# The CUDA checks, in one script for a GPU machine: CPU-vs-CUDA equality tests, the kernel and fit benchmarks
# on CUDA and on the same machine's CPU, then the whole test suite with device="auto" resolving to CUDA.
#
#   bash benchmarks/cuda_check.sh [LOG_DIR]        (default out/cuda-check; each part has its own time limit)
#
# Needs a python3 with moestat's dependencies and a CUDA build of torch; nothing is downloaded.
set -u
LOG=${1:-out/cuda-check}
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

part() {  # part NAME SECONDS COMMAND...: run with a time limit, log to $LOG/NAME.log, report the exit status
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc, $((SECONDS - t0)) s"
  tail -n "${TAIL:-25}" "$LOG/$name.log"
}

nvidia-smi -L
$PY -c "import torch, numpy, pandas; print('torch', torch.__version__, 'numpy', numpy.__version__, 'pandas',
pandas.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"

part cuda_tests 150 $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py
TAIL=14 part bench_kernel_cuda64 60 $PY benchmarks/lse_batched.py --parts kernel --device cuda \
  --ns 10000,160000 --reps 20
TAIL=14 part bench_kernel_cuda32 60 $PY benchmarks/lse_batched.py --parts kernel --device cuda \
  --dtype float32 --ns 10000,160000 --reps 20
TAIL=8 part bench_scaling 60 $PY benchmarks/lse_batched.py --parts scaling --devices cuda --reps 20
# -k: cvxpy (the exact gate solver, CPU only) need not be installed on a GPU image
part suite_auto_cuda "${SUITE_LIMIT:-150}" $PY -m pytest -q -p no:cacheprovider -n "${WORKERS:-12}" -rf \
  -k "not cvxpy"
if [ -n "${VIGNETTE:-}" ]; then
  TAIL=6 part vignette_quick "$VIGNETTE" $PY -m moestat vignette run sigmoid-vs-softmax --quick --out /tmp/cuda-check-vignette
fi
