#!/usr/bin/env bash
# Issues 37 and 38 on a machine of N >= 2 GPUs (nvidia-h100-x2, nvidia-h100-x4), from the
# repository root, in one device call:
#   pytest       python3 -m pytest -m multi_gpu over all N GPUs, [PYTEST_ARGS] (wall time; the
#                jax.distributed test's processes included: one per GPU, or per pair on 4+)
#   clock        the device clock against a profiler trace file (all-gather, 256 MiB per
#                rank), on 2 GPUs and on N
#   collectives  nccl-tests' algbw/busbw, 256 MiB .. 1 GiB per rank, on 2 GPUs and on N
#   overlap      the overlap script at its default size (bf16 16384 x 8192 x 8192) on the
#                meshes 1x2 and 2x1, and 1x4, 2x2, 4x1 where N >= 4
#   scaling      strong and weak scaling of sharded_matmul and moe on 1, 2 and 4 GPUs
# then a short summary table. Every step runs under a watchdog (timeout, SIGINT first so
# pytest still prints its summary) cut to what is left of a 530 s budget (BUDGET), so the
# script ends within 9 minutes; STEPS="clock overlap" runs a subset, in that order. Cut to
# fit: scaling covers sharded_matmul and moe only (`python3 -m kernels.bench.scaling` runs
# every sharded op), forward only, with half-second sampling budgets; the collectives table
# starts at 256 MiB (nccl-tests' sweep from 1 MiB: drop --min-bytes); the overlap script
# samples for 1 s per variant. Logs (one per step) and the summary go to $OUT. Needs no
# wheels: pytest, flax and jax 0.11.2 are in the machine's image. NVLink multicast stays off
# (NCCL_NVLS_ENABLE=0), here and in every process started from here.
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
    [[ " $STEPS " == *" ${name%%[0-9]*} "* ]] || return
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

GPUS=$(nvidia-smi -L | wc -l)
COUNTS="2"; (( GPUS > 2 )) && COUNTS="2 $GPUS"
MESHES="--mesh 1x2 --mesh 2x1"; (( GPUS >= 4 )) && MESHES="$MESHES --mesh 1x4 --mesh 2x2 --mesh 4x1"
SCALE="1 2"; (( GPUS >= 4 )) && SCALE="1 2 4"

# -rA lists every item's outcome and faulthandler_timeout prints the stacks of an item still
# running after 90 s: after d916c4e the run never ended under xdist (every test passed alone;
# 2026-11-27, 4 and 2 GPUs), and -q's dots could not say which item. The suspect, two
# workers' NCCL collectives on the same GPUs at once, is now ruled out by a lock (conftest.py,
# scheduling.several_devices_held); these flags stay until a run confirms it.
# shellcheck disable=SC2086  # PYTEST_ARGS: extra pytest flags, e.g. --durations=20
step pytest "${PYTEST_LIMIT:-200}" python3 -m pytest -m multi_gpu -q -rA \
    -o faulthandler_timeout=90 ${PYTEST_ARGS:-}
for n in $COUNTS; do
    step clock$n 40 python3 -m kernels.sharding.collectives --check-clock --bytes 256M \
        --devices "$n"
done
for n in $COUNTS; do
    step collectives$n 60 python3 -m kernels.sharding.collectives --min-bytes 256M \
        --max-bytes 1G --devices "$n"
done
# shellcheck disable=SC2086  # MESHES is a list of flags
KERNELPERF_TIME_BUDGET=1 step overlap 160 python3 -m kernels.ops.sharded_matmul.overlap $MESHES
# shellcheck disable=SC2086
KERNELPERF_TIME_BUDGET=0.5 step scaling 130 python3 -m kernels.bench.scaling \
    --ops sharded_matmul moe --counts $SCALE --modes strong weak
row() { printf "%-14s %-16s %9s  %s\n" "$1" "${STATUS[$1]:-not run}" "${WALL[$1]:-0}" "$2"; }
{
echo
echo "=== summary (issues 37/38, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
     "x $GPUS, $(( $(date +%s) - START )) s in all)"
printf "%-14s %-16s %9s  %s\n" step exit "wall s" result
row pytest "$(grep -E '(passed|failed|error)' "$OUT/pytest.log" 2>/dev/null | tail -n 1)"
for n in $COUNTS; do
    row clock$n "$(grep -hE '^device clock vs trace' "$OUT/clock$n.log" 2>/dev/null ||
                   tail -n 1 "$OUT/clock$n.log" 2>/dev/null)"
done
for n in $COUNTS; do
    row collectives$n "busbw GB/s at 1 GiB: $(awk '$3 == "1" && $4 == "GiB" \
        { printf "%s %s  ", $1, $7 }' "$OUT/collectives$n.log" 2>/dev/null)"
done
row overlap "hidden: $(awk '$1 ~ /^[0-9]+x[0-9]+$/ && $3 ~ /^[0-9.]+$/ \
    { printf "%s %s %s  ", $1, $2, $6 }' "$OUT/overlap.log" 2>/dev/null)"
row scaling "efficiency: $(awk '$2 ~ /strong|weak/ && $3 != "1" && $6 ~ /^[0-9.]+$/ \
    { split($4, c, "-mesh"); printf "%s %s n=%s %s %s  ", $1, $2, $3, c[2], $9 }' \
    "$OUT/scaling.log" 2>/dev/null)"
awk '/dispatch [0-9-]+ \// && $6 ~ /^[0-9.]+$/ { split($4, c, "-mesh")
    print "  moe exchanges (busbw GB/s in op / alone): " $1, $2, "n=" $3, "mesh" c[2] ": " \
        substr($0, index($0, "dispatch")) }' "$OUT/scaling.log" 2>/dev/null | head -n 6
for n in $COUNTS; do
    grep -hE "device clock vs trace|^timing|trace file" "$OUT/clock$n.log" 2>/dev/null |
        sed "s/^/  clock on $n: /"
done
} | tee "$OUT/summary.txt"
