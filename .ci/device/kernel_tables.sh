#!/usr/bin/env bash
# Issue 51's tables on one GPU in one device call: every implementation of each operation in
# one process (`python -m kernels time`, CUPTI, cold L2, same run), then compact tables of the
# ratios the issue's goals are written in (`--versus`):
#
#   attention  bf16, batch 4, seq 4096: hd128 (16 heads) and hd64 (8 heads), causal and not,
#              fwd and bwd; every implementation's ratio to cuDNN (cuDNN's time over its)
#   softmax    f32 4096x32768 and the vocabulary row 2048x50257, fwd and bwd; GB/s, and each
#              time against the copy bound (the case's bytes at the measured copy ceiling)
#              and against the fastest
#   matmul     bf16 8192^3 and 4096^3, f32 4096^3, forward; TFLOP/s, ratio to XLA and to the
#              fastest (a row of another precision is named, never divided by, once
#              measurements carry their precision)
#
# after the ceilings (`python -m kernels ceilings`: the measured copy ceiling the softmax
# ratios use) and, in the background, the CUDA libraries built ahead (nvcc, CPU only).
#
#   bash .ci/device/kernel_tables.sh                  # ~6-7 min on a fresh H200 (docs/kernels.md)
#   TUNE=1 bash .ci/device/kernel_tables.sh           # tune the f32 matmul and wide-row softmax
#                                                     # grids first, then time softmax and f32
#                                                     # matmul with what they chose (~6 min)
#   OPS="softmax" BUDGET=2 bash .ci/device/kernel_tables.sh
#   DRY_RUN=1 bash .ci/device/kernel_tables.sh        # CPU: the same commands on CPU cases
#
# Each step is cut at its own limit with SIGINT, which `kernels time` answers by printing the
# rows measured so far (a tune cut short records nothing); the limits add up to 550 s (520 s
# with TUNE=1). $OUT (7 files): gpu.txt, tables.log (every
# step's stdout: the full tables and the ratios), stderr.log (progress, warnings), cuda_build.log,
# and with TUNE=1 tune.log and the tuned.json of matmul and softmax (commit them, reviewed, as
# kernels/ops/<op>/tuned.json). Needs no wheels and no bundle: it runs the working tree.
set -uo pipefail
cd "$(dirname "$0")/../.."
WORKTREE_ONLY=1 . .ci/device/common.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
BUDGET=${BUDGET:-1}  # seconds of sampling per point at most; big kernels converge sooner
export KERNELPERF_TIME_BUDGET=$BUDGET  # the ceilings and the tunes sample by it too
TUNE=${TUNE:-0}
DRY_RUN=${DRY_RUN:-0}
if [ "$TUNE" = 1 ]; then
    OPS=${OPS:-"softmax matmul"}
else
    OPS=${OPS:-"attention softmax matmul"}
fi
TABLES=$OUT/tables.log
ERRORS=$OUT/stderr.log
: > "$TABLES"
: > "$ERRORS"

# The cases of each step: the issue's on a GPU; small "cpu" ones for a dry run here. (From
# here to TUNE_MATMUL, correctness_tests/test_device_scripts.py reads these lines.)
if [ "$DRY_RUN" = 1 ]; then
    ATTENTION=(--tags cpu --case f32-2x37x2x64 f32-1x80x2x64 --impl xla pallas_triton triton
               --versus xla fastest)
    SOFTMAX=(--tags cpu --case f32-5x4097 f32-3x50257 --versus copy fastest)
    MATMUL=(--tags cpu --case f32-129x130x257 --impl xla torch triton pallas_triton
            --versus xla fastest)
else
    ATTENTION=(--tags gpu --case 4x4096 --dtype bf16 --versus cudnn fastest)
    SOFTMAX=(--tags gpu --case f32-4096x32768 f32-2048x50257 --versus copy fastest)
    if [ "$TUNE" = 1 ]; then  # the tunes change the f32 products only
        MATMUL=(--tags gpu --case f32-4096x4096x4096 --versus xla fastest)
        MATMUL_LIMIT=80
    else
        MATMUL=(--tags gpu --case bf16-8192x8192x8192 bf16-4096x4096x4096 f32-4096x4096x4096
                --versus xla fastest)
    fi
fi
MATMUL_LIMIT=${MATMUL_LIMIT:-170}
TUNE_MATMUL=(--impl triton:f32 --impl pallas_triton:f32)  # without a GPU, tune says so (exit 2)

# step LIMIT_S NAME COMMAND...: the command's stdout to tables.log (and the screen), stderr
# (tqdm's carriage returns made lines) to stderr.log; SIGINT at the limit, SIGKILL 20 s on.
step() {
    local limit=$1 name=$2
    shift 2
    local start=$SECONDS
    stamp "$name" | tee -a "$TABLES"
    echo "=== $name" >> "$ERRORS"
    timeout -s INT -k 20 "$limit" "$@" 2> >(tr '\r' '\n' >> "$ERRORS") | tee -a "$TABLES"
    local status=${PIPESTATUS[0]}
    echo "$name: exit $status in $((SECONDS - start)) s (limit $limit s)" | tee -a "$TABLES"
}

stamp "cuda build (background, CPU only)"
python3 -m kernels.cuda.build > "$OUT/cuda_build.log" 2>&1 &
build=$!
step 70 ceilings python3 -m kernels ceilings
if [ "$TUNE" = 1 ]; then
    TUNE_LOG=$OUT/tune.log
    : > "$TUNE_LOG"
    stamp tune | tee -a "$TABLES"
    # A tune that ends records what it chose in kernels/ops/<op>/tuned.json: that file comes
    # back as tuned_<op>.json.
    tune() {  # LIMIT_S OP ARGS...
        local limit=$1 op=$2
        shift 2
        timeout -s INT -k 20 "$limit" python3 -m kernels tune "$op" "$@" 2>&1 | tee -a "$TUNE_LOG"
        local status=${PIPESTATUS[0]}
        echo "tune $op: exit $status" | tee -a "$TABLES"
        if [ "$status" = 0 ]; then cp "kernels/ops/$op/tuned.json" "$OUT/tuned_$op.json"; fi
    }
    tune 150 matmul "${TUNE_MATMUL[@]}"
    tune 130 softmax
fi
wait "$build"
echo "cuda build: exit $? ($(tail -1 "$OUT/cuda_build.log"))" | tee -a "$TABLES"
for op in $OPS; do
    case $op in
        attention) step 220 "time attention" python3 -m kernels time attention \
                       --direction fwd bwd --budget "$BUDGET" "${ATTENTION[@]}" ;;
        softmax) step 90 "time softmax" python3 -m kernels time softmax \
                     --direction fwd bwd --budget "$BUDGET" "${SOFTMAX[@]}" ;;
        matmul) step "$MATMUL_LIMIT" "time matmul" python3 -m kernels time matmul \
                    --direction fwd --budget "$BUDGET" "${MATMUL[@]}" ;;
        *) echo "kernel_tables.sh: OPS: expected attention, softmax or matmul, got $op" >&2
           exit 2 ;;
    esac
done
# Last, what the reply's tail shows: the ratio tables and each step's exit (the full tables,
# with TFLOP/s and GB/s per row, are in tables.log).
echo
echo "=== the ratios (full tables: $TABLES)"
awk '/^=== /{print; keep=0} /^vs /{keep=1} /: exit [0-9]+/{keep=0; print; next} keep' \
    "$TABLES"
