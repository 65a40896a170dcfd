# Issue 32: plain `asv continuous main HEAD` as typed, every benchmark, on one GPU from a fresh
# HOME (empty JAX, Triton and nvcc caches; no ~/.asv-machine.json), with HEAD a README
# whitespace commit on top of main (an A/A run). Prints asv's verdict, its exit status, the
# wall time and the breakdown the asv plugin prints when asv exits.
source .ci/device/common.sh
fresh_aa
stamp asv continuous
start=$(date +%s)
timeout -s INT -k 20 ${BENCH_TIMEOUT:-500} python3 -m asv continuous main HEAD > "$OUT/asv.log" 2>&1
echo "asv continuous main HEAD exit $? after $(( $(date +%s) - start )) s"
stamp done
grep -E "^\[ *[0-9.]+%\] ·+ (benchmarks|For )" "$OUT/asv.log" | tail -4
grep -iE "BENCHMARKS NOT SIGNIFICANTLY|SOME BENCHMARKS HAVE|PERFORMANCE (IN|DE)CREASED" "$OUT/asv.log"
grep -A16 "where the time went" "$OUT/asv.log" | tail -17
