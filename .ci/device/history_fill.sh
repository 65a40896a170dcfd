# Issue 32: back-fill the shipped one-GPU history, so the dashboard of a fresh clone draws lines
# over commits. `python -m kernels.bench.history fetch run --spread` in a clone of the bundle:
# COMMITS commits of main without results, spread evenly over its last WINDOW first-parent
# commits (140: back to the attention work of 2026-11-25), BENCH only (asv --bench regex;
# one asv process per benchmark method and commit is most of asv's own time), DIRECTIONS
# narrowing the parameter sets. asv writes each commit's results when that commit is done, so a
# run stopped at FILL_TIMEOUT keeps the commits it finished. Results (asv's layout, one folder
# for this GPU model) go to $OUT/results.tgz; copy the result files into
# perf_tests/results/asv/<model>/ to ship them.
#
# OFFSET=n starts the window n first-parent commits below main's tip, so that jobs on several
# GPUs of one host (per_gpu.sh) fill disjoint stretches of the history; the runner's own code
# stays the tip's.
#
#   COMMITS=5 WINDOW=140 BENCH=time_device DIRECTIONS=fwd bash .ci/device/history_fill.sh
source .ci/device/common.sh
export HOME=$FRESH_HOME && mkdir -p "$HOME"
cd "$REPO" || exit 1
if [ "${OFFSET:-0}" != 0 ]; then
    git checkout -q --detach main && git branch -f main "main~$OFFSET" || exit 1
fi
export KERNELPERF_BENCH_DIRECTIONS=${DIRECTIONS:-fwd}
stamp "history: ${COMMITS:-5} commits over the last ${WINDOW:-140}, --bench ${BENCH:-time_device}"
start=$(date +%s)
timeout -s INT -k 30 "${FILL_TIMEOUT:-540}" python3 -m kernels.bench.history fetch run --spread \
    --max-commits "${COMMITS:-5}" --window "${WINDOW:-140}" --bench "${BENCH:-time_device}" \
    > "$OUT/history.log" 2>&1
echo "history exit $? after $(( $(date +%s) - start )) s"
tar czf "$OUT/results.tgz" .asv/history/*/ 2>/dev/null
stamp done
grep -E "^to benchmark on|Benchmarking|failed|Error" "$OUT/history.log" | tail -30
ls .asv/history/*/ 2>/dev/null
