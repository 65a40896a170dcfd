#!/usr/bin/env bash
# Issue #33 on the GPU, in one device call of about 9 minutes (each stage under a watchdog):
#   1. the fault drill's pytest runs: an out-of-bounds store in the CUDA softmax (sticky
#      CUDA_ERROR_ILLEGAL_ADDRESS; with a --no-isolation run beside it, the issue's failure),
#      an endless Triton loop and a Pallas (Mosaic GPU) barrier nobody arrives at;
#   2. the drill's asv runs for the out-of-bounds store and the Triton loop;
#   3. `pytest -m "gpu and small" -k softmax` with isolation and with --no-isolation: the
#      isolation's per-item cost on the GPU (its device check is a torch.cuda.synchronize()
#      and a tiny JAX computation after every item's call and teardown; the plugin prints
#      its hooks' CPU time per item), and the wall time of each.
# Unverified before this call (no GPU time was left): that the three planted kernels fault on
# an H100 as they do in their CPU interpreters; that torch/XLA report the sticky error in
# words isolation.STICKY_ERRORS knows; the device check's cost.
#
#   bash .ci/device/fault_drill.sh        (REV=<revision> to drill another commit than HEAD)
set -uo pipefail
cd "$(dirname "$0")/../.."
. .ci/device/common.sh
cd /tmp/repo && git checkout -q "${REV:-HEAD}" && git log --oneline -1

stage() {  # $1: name, $2: seconds; the rest: the command
    local name=$1 limit=$2; shift 2
    stamp "$name (limit $limit s): $*"
    local start; start=$(date +%s)
    timeout -s TERM -k 20 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local status=$?
    echo "exit $status after $(($(date +%s) - start)) s$([ $status = 124 ] && echo ' (watchdog)')"
}

# 1 and 2: the drill (30 s per item: a small case, compiled, takes seconds; --keep for logs).
stage drill-pytest 210 python3 -m kernels fault-drill --tools pytest --item-limit 30 \
    --faults cuda-oob triton-loop pallas-barrier --without-isolation --keep
sed -n '/^fault /,$p' "$OUT/drill-pytest.log"
stage drill-asv 150 python3 -m kernels fault-drill --tools asv --item-limit 30 \
    --faults cuda-oob triton-loop --keep
sed -n '/^fault /,$p' "$OUT/drill-asv.log"
cp -r /tmp/kernelperf-drill-*/drill-logs "$OUT/" 2>/dev/null

# 3: the cost of isolation on a clean run, both ways on the same warm caches.
for arm in isolation no-isolation; do
    flag=$([ $arm = no-isolation ] && echo --no-isolation)
    stage "quick-$arm" 75 python3 -m pytest -m "gpu and small" -k softmax -p no:cacheprovider \
        $flag
    grep -E "^kernelperf isolation|^kernelperf: .*workers| passed| failed" "$OUT/quick-$arm.log"
done
