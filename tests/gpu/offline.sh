#!/usr/bin/env bash
# The GPU run (tests/gpu/run.sh: the GPU suite, then `python -m benchmarks gpu`) on a machine
# with a CUDA device but no network and no Go: its image has Python 3.12 and torch with its own
# dependencies, and nothing else that the run needs.
#
#   tests/gpu/offline.sh prepare [DIR]   here, with network and Go: download a curated set of
#       wheels (--no-deps, cp312 manylinux x86_64 or pure Python) into DIR (default .gpu-offline,
#       git-ignored): pyfastensor's own dependencies, safetensors, pytest, just enough of TRL
#       for `OffloadActivations()`, and lightning + torchdata for the example test; build
#       pyfastensor/_native.so; check that DIR and the library fit what a run may carry; print
#       the command to run on the GPU machine and the paths to carry with it.
#   tests/gpu/offline.sh run [DIR]       there, from the repository root, with $OUT set:
#       install DIR's wheels offline into a folder of their own under /tmp (put on PYTHONPATH
#       after the repository; the preinstalled torch is left as it is), record the versions and
#       nvidia-smi in $OUT, check the imports the run needs, run tests/gpu/run.sh
#       "$OUT/gpu-run.log", then, while the overall budget allows (T_ALL seconds from the start,
#       default 420), the Pareto front of offload's policy="auto" against checkpointing,
#       selective checkpointing, torch.compile's memory budget and TRL
#       (`python -m benchmarks offload --pareto --device cuda --rounds 3`: $OUT/pareto.json,
#       $OUT/pareto.log). It goes on past failures; its exit status is run.sh's.
#       Everything it prints is also in $OUT/offline-run.log.
#
# Environment: PYTHON (default python), T_ALL (run: seconds, default 420), T_EXTRA_MIN (run: the
# least time left that starts the extra benchmark, default 60), PFT_OFFLINE_SITE (run: where the
# wheels go, default /tmp/pft-offline-site).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"

# The bundle, --no-deps: each pin was installed together with torch 2.11.0 in a Python 3.12
# venv holding nothing else, and the imports below checked with it (tests/gpu/README.md).
WHEELS=(
  # pyfastensor (pyproject.toml; torch is the machine's)
  numpy==2.1.3 tqdm==4.70.1
  # the GPU benchmark's checkpoint peer and tests/gpu/test_gpu_safetensors.py
  safetensors==0.8.0
  # run.sh's test runner
  pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.20.0 packaging==26.4
  # trl.models.activation_offloading: trl imports accelerate and transformers; transformers
  # checks huggingface-hub, tokenizers, regex, requests, pyyaml at import (no datasets, pandas,
  # pyarrow: they are not imported on that path)
  trl==1.16.0 accelerate==1.15.0 transformers==4.57.6 huggingface-hub==0.36.2 tokenizers==0.22.2
  psutil==7.2.2 pyyaml==6.0.3 regex==2026.5.9
  requests==2.34.2 urllib3==2.8.0 idna==3.13 certifi==2026.5.20 charset-normalizer==3.4.7
  # tests/gpu/test_gpu_example.py (examples/train_lightning.py); torchmetrics imports
  # transformers' AutoModel when transformers is there, hence tokenizers above
  lightning==2.6.6 lightning-utilities==0.15.3 torchmetrics==1.9.0 torchdata==0.11.0
)
PLATFORMS=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64)
LIMIT_MIB=60  # the run tool carries 64 MiB at most, the library included
LIB=pyfastensor/_native.so
PY=${PYTHON:-python}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 2
}

log() { printf '== %s\n' "$*"; }

prepare() {
  local dir=$1 tmp rel bytes mib
  case "$dir" in
    /*) rel=${dir#"$ROOT"/}; [[ $rel != "$dir" ]] || { echo "prepare: DIR must be inside $ROOT (the run carries it)" >&2; exit 2; } ;;
    *) rel=${dir%/} ;;
  esac
  command -v go >/dev/null || { echo "prepare: needs Go (go.mod) and gcc to build $LIB" >&2; exit 1; }
  tmp=$(mktemp -d /tmp/pft-offline-prepare.XXXXXX)
  trap "rm -rf '$tmp'" EXIT

  log "downloading ${#WHEELS[@]} wheels (cp312, manylinux x86_64 or pure Python, --no-deps)"
  mkdir "$tmp/wheels"
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" --dest "$tmp/wheels" --disable-pip-version-check --quiet "${WHEELS[@]}"
  local n
  n=$(find "$tmp/wheels" -name '*.whl' | wc -l)
  [[ $n -eq ${#WHEELS[@]} ]] || { echo "prepare: got $n wheels for ${#WHEELS[@]} pins" >&2; exit 1; }
  (cd "$tmp/wheels" && sha256sum -- *.whl > SHA256SUMS)
  rm -rf "$rel"
  mkdir -p "$rel"
  mv "$tmp/wheels"/* "$rel"/
  if [[ -z $(git -C "$ROOT" check-ignore "$rel" 2>/dev/null) ]]; then
    echo "prepare: warning: $rel is not git-ignored: the run would copy it as an untracked file, not through carry" >&2
  fi

  log "building $LIB (go build -buildmode=c-shared)"
  local version
  version=$("$PY" -c 'import re, sys; print(re.search(r"__version__\s*=\s*\"([^\"]+)\"", open(sys.argv[1]).read()).group(1))' pyfastensor/_version.py)
  CGO_ENABLED=1 go build -buildmode=c-shared -trimpath -ldflags "-s -w -X main.version=$version" \
    -o "$tmp/_native.so" ./gofastensor
  # The Python side declares the library's functions from pyfastensor/_abi.py: it must be the
  # table of the header this build wrote (else `pip install -e .` rewrites it: commit that).
  "$PY" - "$tmp/_native.h" pyfastensor/_abi.py <<'PYEOF'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_cheader", "pyfastensor/_cheader.py")
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
from pathlib import Path
if m.render(m.parse(Path(sys.argv[1]).read_text())) != Path(sys.argv[2]).read_text():
    sys.exit("prepare: pyfastensor/_abi.py is not the table of the Go exports: run pip install -e . and commit it")
PYEOF
  if cmp -s "$tmp/_native.so" "$LIB"; then
    log "$LIB unchanged"
  else
    cp "$tmp/_native.so" "pyfastensor/._native.so.$$.tmp"
    mv -f "pyfastensor/._native.so.$$.tmp" "$LIB"  # a rename in one folder: atomic
    log "$LIB replaced"
  fi

  bytes=$(du -cb "$rel" "$LIB" | tail -1 | cut -f1)
  mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
  ls -l "$rel" "$LIB" | sed 's/^/  /'
  log "total to carry: $mib MiB ($rel $(du -sb "$rel" | cut -f1) B + $LIB $(stat -c %s "$LIB") B), limit $LIMIT_MIB MiB"
  if (( bytes > LIMIT_MIB * 1048576 )); then
    echo "prepare: over $LIMIT_MIB MiB: trim the list in $0" >&2
    exit 1
  fi
  cat <<EOF

The run tool call (the GPU machine; about 7 minutes, T_ALL=420 s of work under a 480 s limit):
  command:   bash tests/gpu/offline.sh run $rel
  timeout_s: 480
  carry:     ["$rel", "$LIB"]
Then read \$OUT's files: offline-run.log, gpu-run.log, versions.txt, nvidia-smi.txt, pareto.log, pareto.json.
EOF
}

# Install DIR's wheels into $1 without pip: a wheel is a zip whose *.data/{purelib,platlib}
# go to the top (the fallback where the machine's Python has no pip).
unzip_wheels() {
  "$PY" - "$1" "${@:2}" <<'PYEOF'
import os, shutil, sys, zipfile
target = sys.argv[1]
for whl in sys.argv[2:]:
    with zipfile.ZipFile(whl) as z:
        z.extractall(target)
for name in os.listdir(target):
    if name.endswith(".data"):
        for sub in ("purelib", "platlib"):
            src = os.path.join(target, name, sub)
            if os.path.isdir(src):
                shutil.copytree(src, target, dirs_exist_ok=True)
        shutil.rmtree(os.path.join(target, name))
PYEOF
}

run_all() {
  local dir=$1 start=$SECONDS t_all=${T_ALL:-420} site=${PFT_OFFLINE_SITE:-/tmp/pft-offline-site}
  local rc=0 status=0 left
  log "$(date -u) $(hostname): tests/gpu/offline.sh run $dir (T_ALL=${t_all}s)"
  if ! command -v "$PY" >/dev/null; then  # run.sh and the tests call `python`
    if command -v python3 >/dev/null; then
      mkdir -p /tmp/pft-offline-bin && ln -sf "$(command -v python3)" /tmp/pft-offline-bin/python
      export PATH="/tmp/pft-offline-bin:$PATH"
      PY=python
      log "no python on PATH: python -> $(command -v python3)"
    else
      log "ERROR: no python nor python3 on PATH"
    fi
  fi
  log "$("$PY" --version 2>&1) at $(command -v "$PY")"

  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
  "$PY" -m pip list --disable-pip-version-check > "$OUT/pip-list-image.txt" 2>&1 || true
  [[ -f $LIB ]] && log "$LIB: $(stat -c %s "$LIB") bytes" \
    || log "ERROR: $LIB missing: carry it (tests/gpu/offline.sh prepare prints the call)"
  if [[ -f $dir/SHA256SUMS ]]; then
    (cd "$dir" && sha256sum --quiet -c SHA256SUMS) && log "wheels: $(ls "$dir"/*.whl | wc -l), checksums match" \
      || log "ERROR: wheels in $dir do not match SHA256SUMS"
  else
    log "ERROR: no $dir/SHA256SUMS: carry DIR (tests/gpu/offline.sh prepare)"
  fi

  log "installing $dir's wheels into $site (offline, --no-deps; torch untouched)"
  rm -rf "$site" && mkdir -p "$site"
  if "$PY" -m pip --version >/dev/null 2>&1; then
    PIP_NO_INDEX=1 "$PY" -m pip install --no-index --no-deps --no-compile --disable-pip-version-check \
      --quiet --target "$site" "$dir"/*.whl || log "ERROR: pip install exited $?"
  else
    log "no pip: unzipping the wheels"
    unzip_wheels "$site" "$dir"/*.whl || log "ERROR: unzipping exited $?"
  fi
  export PYTHONPATH="$ROOT:$site${PYTHONPATH:+:$PYTHONPATH}"
  export PIP_NO_INDEX=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
  log "PYTHONPATH=$PYTHONPATH ($((SECONDS - start)) s)"
  "$PY" -m pip list --disable-pip-version-check --path "$site" > "$OUT/pip-list-bundle.txt" 2>&1 || true

  log "versions and imports"
  "$PY" - <<'PYEOF' 2>&1 | tee "$OUT/versions.txt" || true
import importlib, sys, traceback
print("python", sys.version.split()[0], sys.executable)
for name in ("torch", "numpy", "tqdm", "safetensors", "pytest", "transformers", "accelerate", "trl",
             "lightning", "torchmetrics", "torchdata", "pyfastensor"):
    try:
        m = importlib.import_module(name)
        print(f"{name:<13}{getattr(m, '__version__', '?'):<16}{m.__file__}")
    except Exception as e:
        print(f"{name:<13}IMPORT FAILED: {e!r}")
try:
    import torch
    print("torch.cuda", torch.version.cuda, "available", torch.cuda.is_available(),
          torch.cuda.get_device_name() if torch.cuda.is_available() else "")
except Exception as e:
    print("torch.cuda: FAILED", repr(e))
checks = {
    "safetensors.torch": "import safetensors.torch",
    "pyfastensor": "import pyfastensor, json; print(json.dumps(pyfastensor.info()['engines']['cufile']))",
    "lightning.pytorch + torchdata": "import lightning.pytorch, torchdata.stateful_dataloader",
    "trl OffloadActivations import": "from trl.models.activation_offloading import OffloadActivations",
}
for what, code in checks.items():
    try:
        exec(code, {})
        print(f"check OK   {what}")
    except Exception:
        print(f"check FAIL {what}:\n{traceback.format_exc(limit=-4)}")
try:
    from trl.models.activation_offloading import OffloadActivations
    import torch
    if torch.cuda.is_available():
        ctx = OffloadActivations()
        print("check OK   OffloadActivations() constructed, on", ctx.accelerator_type)
    else:  # the default one makes a CUDA stream: only the stream-less one is made without a device
        ctx = OffloadActivations(use_streams=False)
        print("check OK   OffloadActivations(use_streams=False) constructed, on", ctx.accelerator_type,
              "(no CUDA device: the default one needs a CUDA stream)")
except Exception:
    print(f"check FAIL OffloadActivations:\n{traceback.format_exc(limit=-4)}")
PYEOF

  log "tests/gpu/run.sh $OUT/gpu-run.log ($((SECONDS - start)) s)"
  bash tests/gpu/run.sh "$OUT/gpu-run.log" || status=$?
  log "run.sh: exit status $status ($((SECONDS - start)) s)"

  left=$((t_all - (SECONDS - start)))
  if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    log "no CUDA device: no Pareto front"
  elif (( left < ${T_EXTRA_MIN:-60} )); then
    log "${left} s left of T_ALL=${t_all}: no Pareto front"
  else
    # torch.compile's rows compile each model three times (minutes): they come last, if time is left.
    log "python -m benchmarks offload --pareto --device cuda --rounds 3 (at most ${left} s)"
    timeout -k 10 "$left" "$PY" -m benchmarks offload --pareto --device cuda --rounds 3 --json "$OUT/pareto.json" \
      --no-plot --peers "${PFT_PARETO_PEERS:-none,checkpoint,sac,save_on_cpu,trl,trl+checkpoint}" 2>&1 \
      | tee "$OUT/pareto.log" || rc=${PIPESTATUS[0]}
    left=$((t_all - (SECONDS - start)))
    if (( left >= ${T_EXTRA_MIN:-60} )); then
      log "torch.compile's rows (at most ${left} s)"
      timeout -k 10 "$left" "$PY" -m benchmarks offload --pareto --device cuda --rounds 3 --no-plot \
        --json "$OUT/pareto-compile.json" --peers "compile@0.8,compile@0.5,compile@0.2,compile-blocks" 2>&1 \
        | tee "$OUT/pareto-compile.log" || true
    fi
    log "Pareto front: exit status $rc$( ((rc == 124 || rc == 137)) && echo ' (out of time)')"
  fi
  log "done in $((SECONDS - start)) s; exit status $status (run.sh's)"
  return "$status"
}

run() {
  local dir=${1%/}
  : "${OUT:?run: set OUT to the folder the logs go to}"
  mkdir -p "$OUT"
  local status=0
  run_all "$dir" 2>&1 | tee -a "$OUT/offline-run.log" || status=${PIPESTATUS[0]}
  exit "$status"
}

case "${1:-}" in
  prepare) prepare "${2:-.gpu-offline}" ;;
  run) run "${2:-.gpu-offline}" ;;
  *) usage ;;
esac
