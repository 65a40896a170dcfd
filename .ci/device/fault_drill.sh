#!/usr/bin/env bash
# Issue #33 on the GPU, in one device call of under 9 minutes (each stage under a watchdog:
# timeout sends TERM, the drill then prints the rows it has):
#   1. the fault drill on the out-of-bounds store in the CUDA softmax (sticky
#      CUDA_ERROR_ILLEGAL_ADDRESS): pytest with isolation, pytest with --no-isolation (the
#      issue's failure, at small scale), and asv;                                 <= 150 s
#   2. the drill's pytest runs on an endless Triton loop and on a Pallas (Mosaic GPU) kernel
#      waiting on a barrier nobody arrives at;                                     <= 180 s
#   2a. (asv-hangs) the drill's asv runs on the same two hangs;                    <= 300 s
#   3. `pytest -m "gpu and small" -k softmax` with isolation and with --no-isolation, A B B A: the
#      cost per item of the device check (torch.cuda.synchronize() and a tiny JAX computation
#      after each item's call and teardown; the plugin prints its hooks' CPU time per item)
#      and both wall times, on the same warm caches. The full `pytest -m gpu` (8 min cold on
#      an H100) does not fit twice in one call.                                4 x 60 s
# First run on an H100 2026-11-26 (perf_tests/RESULTS.md, "evening"): the three planted kernels
# fault there as in their CPU interpreters, torch and XLA word the sticky error as
# isolation.STICKY_ERRORS knows it, every fault was contained (316 s in all; the quick arms
# took 42 and 34 s). Logs (the drill's clones' logs included) go to $OUT.
#
#   bash .ci/device/fault_drill.sh        (REV=<revision> to drill another commit than HEAD;
#                                          STAGES="asv-hangs" runs the named stages only, of
#                                          cuda hangs asv-hangs quick; default all but asv-hangs)
set -uo pipefail
cd "$(dirname "$0")/../.."
. .ci/device/common.sh
cd "$REPO" && git checkout -q "${REV:-HEAD}" && git log --oneline -1

stage() {  # $1: name, $2: seconds; the rest: the command
    local name=$1 limit=$2; shift 2
    stamp "$name (limit $limit s): $*"
    local start; start=$(date +%s)
    timeout -s TERM -k 20 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local status=$?
    echo "exit $status after $(($(date +%s) - start)) s$([ $status = 124 ] && echo ' (watchdog)')"
}

STAGES=" ${STAGES:-cuda hangs quick} "
wanted() { [[ $STAGES == *" $1 "* ]]; }

# 30 s per item: one small case, compiled, takes seconds (a fresh worker's first item
# starts JAX and torch and compiles too).
if wanted cuda; then
stage drill-cuda 150 python3 -m kernels fault-drill --faults cuda-oob --item-limit 30 \
    --without-isolation --keep
sed -n '/^fault /,$p' "$OUT/drill-cuda.log"
fi
if wanted hangs; then
stage drill-hangs 180 python3 -m kernels fault-drill --faults triton-loop pallas-barrier \
    --tools pytest --item-limit 30 --keep
sed -n '/^fault /,$p' "$OUT/drill-hangs.log"
fi
if wanted asv-hangs; then
stage drill-asv-hangs 300 python3 -m kernels fault-drill --faults triton-loop pallas-barrier \
    --tools asv --item-limit 30 --keep
sed -n '/^fault /,$p' "$OUT/drill-asv-hangs.log"
fi
for logs in /tmp/kernelperf-drill-*/drill-logs; do cp -r "$logs" "$OUT/$(basename "$(dirname "$logs")")"; done

# A B B A: each arm once on colder caches and once on warmer ones (the first run of 2026-11-26
# put isolation first only, and read 33.6 s against 25.1 s).
wanted quick || exit 0
for run in isolation-1 no-isolation-1 no-isolation-2 isolation-2; do
    flag=$([[ $run = no-isolation* ]] && echo --no-isolation)
    stage "quick-$run" 60 python3 -m pytest -m "gpu and small" -k softmax -p no:cacheprovider \
        $flag
    grep -E "^kernelperf isolation|^kernelperf: .*workers| passed| failed" "$OUT/quick-$run.log"
done
