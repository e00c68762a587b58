#!/usr/bin/env bash
# The prepared GPU check of issue 20, as one command from the repository root of a fresh GPU
# machine: bash benchmarks/gpu_check.sh            (at most 9 minutes: each step has its timeout)
#          bash benchmarks/gpu_check.sh --cpu-smoke (tiny sizes on the CPU; or GPU_CHECK_SMOKE=1)
# Installs nothing. Python: $PYTHON, else .venv/bin/python where it exists, else python3 (a GPU
# machine's own, with a CUDA torch); the repository and any pure-Python wheels in .whl/ (mixle,
# for distributed_em_bench.py's HMM comparison) go on PYTHONPATH. The report goes to stdout and,
# when $OUT is set, to $OUT/gpu_check.txt. Exit status: the number of steps that failed.
set -u
cd "$(dirname "$0")/.."
smoke=""
if [ "${1:-}" = "--cpu-smoke" ] || [ "${GPU_CHECK_SMOKE:-}" = "1" ]; then smoke="--smoke"; fi
if [ -n "${PYTHON:-}" ]; then py=$PYTHON; elif [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
path=$PWD
for wheel in .whl/*.whl; do [ -e "$wheel" ] && path="$path:$PWD/$wheel"; done
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; report="$OUT/gpu_check.txt"; : >"$report"
else report=$(mktemp); trap 'rm -f "$report"' EXIT; fi
line() { echo "$*" | tee -a "$report"; }

failed=0
step() {  # step SECONDS NAME: one subcommand of gpu_check.py under its own timeout
    local limit=$1 name=$2 start=$SECONDS rc
    line "== $name (limit ${limit} s)"
    timeout --kill-after=10 "$limit" "$py" benchmarks/gpu_check.py "$name" $smoke 2>&1 | tee -a "$report"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        failed=$((failed + 1))
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then line "FAIL  $name: killed at its ${limit} s limit"
        else line "FAIL  $name: exit status $rc"; fi
    fi
    line "== $name took $((SECONDS - start)) s"
}

line "gpu_check: $py, ${smoke:-full run}"
step 30 env
step 75 agree
step 170 em-speed
step 90 lm
step 115 fixed-cost
step 60 float32
count() { grep -c "^$1" "$report"; }
line "== summary: $(count PASS) PASS, $(count MISS) MISS, $(count FAIL) FAIL, $(count SKIP) SKIP;" \
     "$failed step(s) failed; ${SECONDS} s in all"
exit "$failed"
