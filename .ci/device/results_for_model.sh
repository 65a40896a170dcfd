# Issue 15: asv results (dashboard metrics included) and a softmax roofline for this GPU model,
# packed into $OUT/results.tgz (dated logs go to the `archive` branch, not main; the asv results
# to ship go to perf_tests/results/asv/). BENCH_IMPLS/BENCH_CASES narrow asv.
source .ci/device/common.sh
cd "$REPO"
stamp kernels bench
KERNELPERF_BENCH_IMPLS=${BENCH_IMPLS:-} KERNELPERF_BENCH_CASES=${BENCH_CASES:-f32-32768x4096} \
KERNELPERF_BENCH_DIRECTIONS=fwd timeout ${BENCH_TIMEOUT:-240} python3 -m kernels bench \
    --bench Softmax > "$OUT/bench.log" 2>&1
echo "kernels bench exit $?"
stamp roofline
KERNELPERF_TIME_BUDGET=1 timeout ${ROOF_TIMEOUT:-200} python3 -m kernels roofline softmax \
    --case 256x1024 32768x4096 4096x32768 --dtype f32 bf16 --out traces > "$OUT/roofline.log" 2>&1
echo "roofline exit $?"
tar czf "$OUT/results.tgz" .asv/results traces
stamp done
grep -v "^\s*$" "$OUT/bench.log" | tail -30; tail -5 "$OUT/roofline.log"
