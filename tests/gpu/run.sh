#!/usr/bin/env bash
# Run the GPU suite, then `python -m benchmarks gpu`, on a machine with a CUDA device (about
# 5 minutes on one H100; PFT_GPU_BENCH_ARGS=--quick for a shorter benchmark).
# Usage: tests/gpu/run.sh [log file]   (default: gpu-run-<date>.log in the current directory)
# Everything printed also goes to the log; the exit status is the suite's.
set -uo pipefail
cd "$(dirname "$0")/../.."
log="${1:-gpu-run-$(date -u +%Y%m%dT%H%M%SZ).log}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  echo "== $(date -u) $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  python -c 'import torch, pyfastensor, json; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available()); print("cufile", json.dumps(pyfastensor.info()["engines"]["cufile"]))'
  echo "== tests/gpu"
  python -m pytest -q -rs --durations=8 tests/gpu
  status=$?
  if ! python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "== no CUDA device here: the suite skipped, no GPU benchmark run"
    exit $status
  fi
  echo "== python -m benchmarks gpu"
  python -m benchmarks gpu ${PFT_GPU_BENCH_ARGS:-}
  echo "== tests/gpu: exit status $status"
  exit $status
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
