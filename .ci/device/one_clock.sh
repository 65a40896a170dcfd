# Issue 15 on one GPU: the timer against independent profilers for every family, then
# `asv continuous main HEAD` on a fresh clone with an empty HOME (no ~/.asv-machine.json).
source .ci/device/common.sh
stamp verify-timing
KERNELPERF_TIME_BUDGET=${BUDGET:-1} timeout 330 python3 -m kernels verify-timing --repeats 5 \
    --calls 20 > "$OUT/verify.log" 2> "$OUT/verify.err"
echo "verify-timing exit $?"
stamp asv continuous, fresh HOME
cd "$REPO"
git checkout -q -B head main && echo >> README.md && git commit -qam "A/A: README blank line"
export HOME=$(mktemp -d)
ls -la "$HOME"
KERNELPERF_BENCH_IMPLS=triton,cuda,pallas,xla KERNELPERF_BENCH_CASES=f32-32768x4096 \
KERNELPERF_BENCH_DIRECTIONS=fwd timeout 200 python3 -m asv continuous main HEAD \
    > "$OUT/continuous.log" 2>&1
echo "asv continuous main HEAD exit $?"
tail -25 "$OUT/continuous.log"
ls .asv/results; cat .asv/results/*/machine.json
cd - > /dev/null
cat "$OUT/verify.err" | tail -5
cat "$OUT/verify.log"
