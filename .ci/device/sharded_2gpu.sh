#!/usr/bin/env bash
# Issue 37 on a 2-GPU machine (nvidia-h100-x2), from the repository root, in one device call:
#   1. python3 -m pytest -m multi_gpu -q          (wall time; one process per GPU included)
#   2. the device clock against a profiler trace file (all-gather, 256 MiB per rank)
#   3. the collectives table, nccl-tests' algbw/busbw, 256 MiB .. 1 GiB per rank
#   4. the overlap script at its default size (bf16 16384 x 8192 x 8192, mesh 1x2)
#   5. strong and weak scaling of sharded_matmul and moe on 1 and 2 GPUs
# then a short summary table. Every step runs under a watchdog (timeout, SIGINT first so
# pytest still prints its summary) cut to what is left of a 530 s budget, so the script ends
# within 9 minutes. Cut to fit: scaling covers sharded_matmul and moe only (sharded_vmap and
# transformer_block: `python3 -m kernels.bench.scaling` runs them all), forward only, with
# half-second sampling budgets; the collectives table starts at 256 MiB (nccl-tests' sweep
# from 1 MiB: drop --min-bytes); the overlap script samples for 1 s per variant.
# Logs (one per step) and the summary go to $OUT; STEPS="clock overlap" runs a subset. Needs no wheels: pytest, flax and jax
# 0.11.2 are in the machine's image. NVLink multicast stays off (NCCL_NVLS_ENABLE=0),
# here and in every process started from here.
set -uo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-/tmp/kp-sharded}
BUDGET=${BUDGET:-530}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
START=$(date +%s)

{ nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,temperature.gpu,power.draw \
      --format=csv; nvidia-smi topo -m; env | grep -E '^(NCCL|XLA|CUDA)' | sort
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())"; } > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

STEPS=${STEPS:-pytest clock collectives overlap scaling}
declare -A STATUS WALL
step() {  # $1: name, $2: limit in seconds, the rest: the command; log in $OUT/$1.log
    local name=$1 limit=$2; shift 2
    STATUS[$name]="not run"; WALL[$name]=0
    [[ " $STEPS " == *" $name "* ]] || return
    local left=$((BUDGET - ($(date +%s) - START)))
    (( limit > left )) && limit=$left
    if (( limit < 10 )); then
        echo "=== $name: skipped, ${left}s of the ${BUDGET}s budget left"
        STATUS[$name]=skipped; WALL[$name]=0; return
    fi
    echo "=== $(date +%T) $name (watchdog ${limit}s): $*"
    local t0; t0=$(date +%s%N)
    timeout -s INT -k 15 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local status=$?
    local ms=$((($(date +%s%N) - t0) / 1000000))
    STATUS[$name]=$status; WALL[$name]=$((ms / 1000)).$(printf "%03d" $((ms % 1000)))
    (( status == 124 || status == 130 )) && STATUS[$name]="$status (watchdog)"
    echo "    exit ${STATUS[$name]} after ${WALL[$name]} s"
    tail -n 4 "$OUT/$name.log" | sed 's/^/    | /'
}

step pytest 200 python3 -m pytest -m multi_gpu -q
step clock 50 python3 -m kernels.sharding.collectives --check-clock --bytes 256M
step collectives 75 python3 -m kernels.sharding.collectives --min-bytes 256M --max-bytes 1G
KERNELPERF_TIME_BUDGET=1 step overlap 110 python3 -m kernels.ops.sharded_matmul.overlap
KERNELPERF_TIME_BUDGET=0.5 step scaling 130 python3 -m kernels.bench.scaling \
    --ops sharded_matmul moe --counts 1 2 --modes strong weak

{
echo
echo "=== summary (issue 37, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x" \
     "$(nvidia-smi -L | wc -l), $(( $(date +%s) - START )) s in all)"
printf "%-12s %-16s %9s  %s\n" step exit "wall s" result
printf "%-12s %-16s %9s  %s\n" pytest "${STATUS[pytest]}" "${WALL[pytest]}" \
    "$(grep -E '(passed|failed|error)' "$OUT/pytest.log" 2>/dev/null | tail -n 1)"
printf "%-12s %-16s %9s  %s\n" clock "${STATUS[clock]}" "${WALL[clock]}" \
    "$(grep -E '^device clock vs trace' "$OUT/clock.log" || tail -n 1 "$OUT/clock.log")"
printf "%-12s %-16s %9s  %s\n" collectives "${STATUS[collectives]}" "${WALL[collectives]}" \
    "busbw GB/s at 1 GiB: $(awk '$3 == "1" && $4 == "GiB" { printf "%s %s  ", $1, $7 }' \
        "$OUT/collectives.log")"
printf "%-12s %-16s %9s  %s\n" overlap "${STATUS[overlap]}" "${WALL[overlap]}" \
    "hidden on 1x2: $(awk '$1 == "1x2" && $3 ~ /^[0-9.]+$/ { printf "%s %s  ", $2, $6 }' \
        "$OUT/overlap.log")"
printf "%-12s %-16s %9s  %s\n" scaling "${STATUS[scaling]}" "${WALL[scaling]}" \
    "efficiency at n=2: $(awk '$3 == "2" && $2 ~ /strong|weak/ && $6 ~ /^[0-9.]+$/ \
        { split($4, c, "-mesh"); printf "%s %s %s %s  ", $1, $2, c[2], $9 }' \
        "$OUT/scaling.log")"
awk '/dispatch [0-9-]+ \// && $6 ~ /^[0-9.]+$/ { split($4, c, "-mesh")
    print "  moe exchanges (busbw GB/s in op / alone): " $1, $2, "n=" $3, "mesh" c[2] ": " \
        substr($0, index($0, "dispatch")) }' "$OUT/scaling.log" | head -n 4
grep -hE "device clock vs trace|^timing|trace file" "$OUT/clock.log" | sed 's/^/  clock: /'
} | tee "$OUT/summary.txt"
