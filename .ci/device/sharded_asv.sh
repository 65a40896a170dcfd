#!/usr/bin/env bash
# Issues 37/38: asv results of a multi-GPU machine for the sharded operations, on HEAD, forward
# (`python -m kernels bench --bench`, dashboard metrics included; the machine is named with
# its GPU count, e.g. 4x-nvidia-h100-80gb-hbm3), packed into $OUT/results.tgz for
# perf_tests/results/asv/ (on the watchdog, SIGINT: kernels bench then recovers what the
# measuring journals hold). Needs the wheels and the bundle of .ci/device/README.md.
source .ci/device/common.sh
export NCCL_NVLS_ENABLE=0
cd "$REPO"
stamp kernels bench
KERNELPERF_BENCH_DIRECTIONS=${BENCH_DIRECTIONS:-fwd} timeout -s INT -k 30 ${BENCH_TIMEOUT:-240} \
    python3 -m kernels bench --bench "${BENCH:-Moe|ShardedMatmul|ShardedVmap|TransformerBlock}" \
    > "$OUT/asv.log" 2>&1
echo "kernels bench exit $?"
tar czf "$OUT/results.tgz" .asv/results $(find .asv/env -path '*kernelperf-measurements*' \
    \( -name '*.jsonl' -o -name '*.log' \)) 2>/dev/null
stamp done
grep -E "failed|^kernels bench|where the time went" -A0 "$OUT/asv.log" | tail -15
