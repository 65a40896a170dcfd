# Issue 32: gate-power on one GPU: 2% plants in every family (Pallas, Triton, CUDA through
# ctypes, XLA) of softmax, matmul and row sum, through kernels bench --base (per-row gaps,
# interleaved confirmation); the unplanted implementations of the same cases are controls.
# The sharded row needs 2 GPUs (nvidia-h100-x2): GATE_ARGS="--families sharded --sizes 2%
# --trials 3 --no-speedup" (about 6 minutes there, 2026-11-27).
source .ci/device/common.sh
export HOME=$FRESH_HOME && mkdir -p "$HOME"
cd "$REPO"
stamp gate-power
timeout ${GATE_TIMEOUT:-550} python3 -m kernels gate-power ${GATE_ARGS:-} > "$OUT/gate.log" 2>&1
echo "gate-power exit $?"
tar czf "$OUT/journals.tgz" $(find /tmp/kernelperf-gate-* -name '*.jsonl' 2>/dev/null) 2>/dev/null
stamp done
grep -v "^  " "$OUT/gate.log" | tail -40
