#!/usr/bin/env bash
# Run the Python test suite on other torch and Python versions than the
# development environment's, each in its own virtual environment.
#
# Usage: tests/compat/run.sh TORCH:PYTHON [TORCH:PYTHON ...]
#   e.g. tests/compat/run.sh 2.4.1:3.10 2.11.0:3.12
# Each pair gets .venv-compat/torch-TORCH-py-PYTHON/ (reused when it exists and
# holds that torch), pyfastensor installed editable from this tree with
# tests/requirements.txt, torch pinned by a constraint so nothing upgrades it,
# and pip's cache shared with every other install. PYTHON is found as
# pythonPYTHON on PATH, or under pyenv's versions/. Extra pytest arguments go
# in PYTEST_ARGS. With COMPAT_REMOVE_VENV=1 each environment is deleted once
# its suite has run (a torch with its CUDA libraries takes about 6 GB; pip's
# cache keeps the downloads). Exits non-zero if any version's suite fails; a
# summary line per version ends the output.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -gt 0 ] || { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

find_python() {  # the interpreter of Python $1 (3.10), or nothing
  local v=$1 p
  local root
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for p in "python$v" "$root"/versions/"$v"*/bin/"python$v"; do
    if "$p" -c 'import sys, venv' >/dev/null 2>&1; then command -v "$p"; return; fi
  done
}

summary=()
status=0
for pair in "$@"; do
  torch_v=${pair%%:*}
  py_v=${pair#*:}
  [ "$torch_v" != "$pair" ] || { echo "not TORCH:PYTHON: $pair" >&2; exit 2; }
  py=$(find_python "$py_v")
  if [ -z "$py" ]; then
    echo "Python $py_v not found (python$py_v on PATH, or pyenv's versions/$py_v*)" >&2
    summary+=("torch $torch_v, Python $py_v: NOT RUN (no Python $py_v)"); status=1; continue
  fi
  venv=".venv-compat/torch-$torch_v-py-$py_v"
  echo "== torch $torch_v on Python $py_v ($py), in $venv"
  constraint=$(mktemp)
  echo "torch==$torch_v" >"$constraint"
  if ! { [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"; } ||
     ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -c "$constraint" \
         -e . -r tests/requirements.txt; then
    rm -f "$constraint"
    [ "${COMPAT_REMOVE_VENV:-0}" = 1 ] && rm -rf "$venv"
    summary+=("torch $torch_v, Python $py_v: INSTALL FAILED"); status=1; continue
  fi
  rm -f "$constraint"
  "$venv/bin/python" -c 'import sys, torch; print("torch", torch.__version__, "python", sys.version.split()[0])'
  log=$(mktemp)
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  result=$(grep -E '^(=+ )?[0-9]+ (passed|failed)' "$log" | tail -n1 | sed 's/=//g; s/^ *//; s/ *$//')
  rm -f "$log"
  [ "${COMPAT_REMOVE_VENV:-0}" = 1 ] && rm -rf "$venv"
  [ -n "$result" ] || result="no count printed (a -q in PYTEST_ARGS makes pytest's -qq)"
  summary+=("torch $torch_v, Python $py_v: $result (exit $rc)")
  [ "$rc" -eq 0 ] || status=1
done
echo "== compatibility matrix"
printf '%s\n' "${summary[@]}"
exit $status
