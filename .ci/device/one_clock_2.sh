# Issue 15, second pass: the small kernels against ncu and the profilers, asv continuous on a
# fresh clone with an empty HOME, and one short gate-power round to time it.
source .ci/device/common.sh
stamp verify-timing small
KERNELPERF_TIME_BUDGET=1 timeout 200 python3 -m kernels verify-timing --repeats 3 --calls 20 \
    --case 256x1024 --ncu > "$OUT/verify_small.log" 2> "$OUT/verify_small.err"
echo "verify-timing exit $?"
stamp asv continuous, fresh HOME
cd "$REPO"
git checkout -q -B head main && echo >> README.md && git commit -qam "A/A: README blank line"
( export HOME=$(mktemp -d); ls -A "$HOME"
  KERNELPERF_BENCH_IMPLS=triton,cuda,pallas,xla KERNELPERF_BENCH_CASES=f32-32768x4096 \
  KERNELPERF_BENCH_DIRECTIONS=fwd timeout 200 python3 -m asv continuous main HEAD \
      > "$OUT/continuous.log" 2>&1
  echo "asv continuous main HEAD exit $?"
  tail -12 "$OUT/continuous.log"; cat .asv/results/*/machine.json | tr -d '\n'; echo )
git checkout -q main
stamp gate-power short
timeout 240 python3 -m kernels gate-power --aa-trials 1 --trials 1 --sizes 10% --no-speedup \
    > "$OUT/gate.log" 2>&1
echo "gate-power exit $?"
stamp done
cd - > /dev/null
tail -4 "$OUT/verify_small.err"; cat "$OUT/verify_small.log"; tail -22 "$OUT/gate.log"
