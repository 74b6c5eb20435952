#!/usr/bin/env bash
# Run the GPU suite, then `python -m benchmarks gpu`, on a machine with a CUDA device (about
# 4 minutes on one H100), each under a timeout so that a hang cannot eat a lent machine's time:
# the suite within PFT_GPU_SUITE_TIMEOUT seconds (default 170), the benchmark within
# PFT_GPU_BENCH_TIMEOUT (default 170), and the whole run within PFT_GPU_RUN_BUDGET (default 290:
# each limit is cut to what the budget has left). A timeout says so in a line "== TIMEOUT ...".
# PFT_GPU_BENCH_ARGS: the benchmark's arguments; default --rounds 2 (~2.3 minutes with the
# ~1.9 GB state on a ~1.5 GB/s disk); empty: the benchmark's own 3 rounds; --quick: a ~0.5 GB
# state, under a minute.
# Usage: tests/gpu/run.sh [log file]   (default: gpu-run-<date>.log in the current directory)
# Everything printed also goes to the log; the exit status is the suite's (124: it timed out).
set -uo pipefail
cd "$(dirname "$0")/../.."
log="${1:-gpu-run-$(date -u +%Y%m%dT%H%M%SZ).log}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
budget_s="${PFT_GPU_RUN_BUDGET:-290}"
suite_s="${PFT_GPU_SUITE_TIMEOUT:-170}"
bench_s="${PFT_GPU_BENCH_TIMEOUT:-170}"
bench_args="${PFT_GPU_BENCH_ARGS---rounds 2}"
start=$(date +%s)

# limited SECONDS WHAT COMMAND...: COMMAND under `timeout -k 10 SECONDS` (SIGTERM, then SIGKILL 10 s
# later), its process group killed after it ends (no child left holding the GPU); its status.
limited() {
  local secs=$1 what=$2 rc pid
  shift 2
  timeout -k 10 "$secs" "$@" &  # timeout makes itself a process group leader: $pid is the group
  pid=$!
  wait "$pid"
  rc=$?
  kill -KILL -- "-$pid" 2>/dev/null
  if [ "$rc" -eq 124 ]; then
    echo "== TIMEOUT: $what ran past its limit of $secs s and was stopped (exit 124)"
  elif [ "$rc" -eq 137 ]; then
    echo "== TIMEOUT: $what was killed (SIGKILL, exit 137): still running 10 s after its $secs s limit, or out of memory"
  fi
  return "$rc"
}

# left CAP: CAP, or the seconds the run's budget has left if fewer (10 s kept for the kill
# grace), at least 1 (`timeout 0` would mean no limit).
left() {
  local rest=$((budget_s - ($(date +%s) - start) - 10))
  rest=$((rest < $1 ? rest : $1))
  echo $((rest < 1 ? 1 : rest))
}

{
  echo "== $(date -u) $(hostname)"
  limited 30 nvidia-smi nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  limited 90 "the versions' check" python -c 'import sys, torch, pyfastensor, json; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available()); print("cufile", json.dumps(pyfastensor.info()["engines"]["cufile"])); sys.exit(0 if torch.cuda.is_available() else 3)'
  cuda=$?
  echo "== tests/gpu (limit $(left "$suite_s") s)"
  limited "$(left "$suite_s")" "pytest tests/gpu" python -m pytest -q -rs --durations=8 -o faulthandler_timeout=100 tests/gpu
  status=$?
  echo "== tests/gpu: exit status $status after $(($(date +%s) - start)) s"
  if [ "$cuda" -ne 0 ]; then
    echo "== no CUDA device here (or the check above failed): the suite skipped, no GPU benchmark run"
    exit $status
  fi
  bench_limit=$(left "$bench_s")
  if [ "$bench_limit" -lt 30 ]; then
    echo "== TIMEOUT: no time left in the run's budget of $budget_s s for the benchmark: not run"
  else
    echo "== python -m benchmarks gpu $bench_args (limit $bench_limit s)"
    # shellcheck disable=SC2086  # the arguments split on spaces
    limited "$bench_limit" "python -m benchmarks gpu" python -m benchmarks gpu $bench_args
  fi
  echo "== tests/gpu: exit status $status; run.sh took $(($(date +%s) - start)) s"
  exit $status
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
