# Issue 32: the whole gate on one GPU as CI runs it, `python -m kernels bench --base main`
# over every benchmark, with HEAD a README whitespace commit on top of main (so an A/A run
# over every benchmark), from a fresh HOME (empty JAX, Triton and nvcc caches). Prints where
# the time went and the smallest change each row can call; the asv results and the
# measuring journals go to $OUT/results.tgz.
source .ci/device/common.sh
fresh_aa
stamp kernels bench
start=$(date +%s)
timeout ${BENCH_TIMEOUT:-560} python3 -m kernels bench --base main --json "$OUT/rows.json" \
    > "$OUT/bench.log" 2>&1
echo "kernels bench exit $? after $(( $(date +%s) - start )) s"
tar czf "$OUT/results.tgz" .asv/results $(find .asv/env -path '*kernelperf-measurements*' \
    \( -name '*.jsonl' -o -name '*.log' \)) 2>/dev/null
stamp done
grep -E "^\[ *[0-9.]+%\] ·+ (benchmarks|Benchmarking|For )" "$OUT/bench.log" | tail -6
grep -B2 -A14 "where the time went" "$OUT/bench.log" | tail -18
grep -E "^summary|^smallest change|^kernels bench:|FAILED|failed" "$OUT/bench.log" | head -20
