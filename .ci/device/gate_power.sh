# Issue 15: asv continuous main HEAD as typed (narrowed to the softmax forward) on a fresh clone
# with an empty HOME, then the gate's power (gate-power in a clone of the bundle).
source .ci/device/common.sh
python3 -c "import perf_tests.benchmarks, sys; from jax._src import xla_bridge; \
import torch; print('after import: backends', list(xla_bridge._backends), \
'cuda', torch.cuda.is_initialized())"
cd /tmp/repo
stamp asv continuous, fresh HOME
git checkout -q -B head main && echo >> README.md && git commit -qam "A/A: README blank line"
( export HOME=$(mktemp -d); ls -A "$HOME"
  KERNELPERF_BENCH_IMPLS=triton,cuda,pallas,xla KERNELPERF_BENCH_CASES=f32-32768x4096 \
  KERNELPERF_BENCH_DIRECTIONS=fwd timeout ${CONT_TIMEOUT:-150} python3 -m asv continuous main HEAD \
      > "$OUT/continuous.log" 2>&1
  echo "asv continuous main HEAD exit $?"
  grep -v "^\s*$" "$OUT/continuous.log" | tail -14; cat .asv/results/*/machine.json | tr -d '\n'; echo )
git checkout -q main
stamp gate-power
timeout ${GATE_TIMEOUT:-400} python3 -m kernels gate-power ${GATE_ARGS:-} > "$OUT/gate.log" 2>&1
echo "gate-power exit $?"
stamp done
grep -v "^  " "$OUT/gate.log" | tail -40
