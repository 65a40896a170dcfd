# Issue 15: gate-power rounds (GATE_ARGS), then this model's asv results (kernels bench, the
# softmax forward at one size, dashboard metrics included) packed into $OUT/results.tgz.
source .ci/device/common.sh
cd "$REPO"
stamp gate-power
timeout ${GATE_TIMEOUT:-300} python3 -m kernels gate-power ${GATE_ARGS:-} > "$OUT/gate.log" 2>&1
echo "gate-power exit $?"
stamp kernels bench
KERNELPERF_BENCH_CASES=${BENCH_CASES:-f32-32768x4096} KERNELPERF_BENCH_DIRECTIONS=fwd \
    timeout ${BENCH_TIMEOUT:-200} python3 -m kernels bench --bench Softmax > "$OUT/bench.log" 2>&1
echo "kernels bench exit $?"
if [ -n "${ROOF_TIMEOUT:-}" ]; then
  stamp roofline
  KERNELPERF_TIME_BUDGET=1 timeout $ROOF_TIMEOUT python3 -m kernels roofline softmax \
      --case 256x1024 32768x4096 4096x32768 --dtype f32 bf16 --out traces > "$OUT/roofline.log" 2>&1
  echo "roofline exit $?"; tail -4 "$OUT/roofline.log"
fi
tar czf "$OUT/results.tgz" .asv/results $(ls -d traces 2>/dev/null)
stamp done
grep -E "^\[|track_|time_device" "$OUT/bench.log" | tail -12
grep -v "^  " "$OUT/gate.log" | tail -24
