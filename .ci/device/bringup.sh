# Issue 48: bring up the lent GPU's model (`python -m kernels bringup`, docs/bringup.md) within
# 10-minute device calls. Each call runs the steps asked for (STEPS, default all) until
# DEADLINE seconds (default 500, leaving room to pack), in a clone of the bundle ($REPO, branch
# BRANCH, default main; asv and the history need git), over the data files this working tree
# carries: what earlier calls wrote, unpacked here between calls, so the bring-up goes on
# where the last call stopped. It packs what it wrote into $OUT:
#   bringup-data.tgz   every data file of the model as it stands (cumulative): unpack it at the
#                      repository root here (tar xzf .../bringup-data.tgz), then call again
#   bringup.patch      the same as a diff against the branch's commit, to read
#   bringup.log        the command's output; .bringup/ (journals, worker logs) in bringup-logs.tgz
# The command's exit status is printed: 75 means "not finished, call again", 0 done.
#
# Wall time per step on one H200, estimated from an H100's numbers (README: 90 perf items took
# 336 s cold, 188 s warm, kernels' baselines timed once per case; NOTES.md: asv's Softmax and
# RowSum 70 s a commit, the whole A/A gate 408-500 s for two commits):
#   ceilings   ~1 min (a copy and four products, a few seconds of samples each, compiles)
#   perf       ~8-9 min a run cold, ~6 warm (the kernel and its baselines interleaved for each
#              of ~90 items: ~3.5 s of samples an item, baselines prepared again per item):
#              one call per run, so 2 calls for the default 2 runs
#   floors     seconds (no GPU)
#   tune       ~3-5 min (19 configs of three kernels, each compiled and timed)
#   noise      ~6-8 min (every class's time_ benchmarks, 2 asv runs each)
#   history    ~3-4 min a commit (a build, then every operation's time_device): 12 commits in
#              ~5 calls
# so a whole bring-up is about 10 calls (~1.5 hours of device time), most of it the history.
#
#   STEPS="ceilings perf" bash .ci/device/bringup.sh      # call 1 (carry .whl)
#   STEPS="perf floors tune" bash .ci/device/bringup.sh   # call 2 (unpack call 1's here
#                                                         # first if the machine went cold)
#   bash .ci/device/bringup.sh                            # later calls: whatever is left
# A clone left by an earlier call on a still-warm machine holds the latest results: it is
# kept as it is. A new clone gets the data files as this working tree has them (earlier
# calls' results, unpacked here), over its own.
[ -d "${REPO:-/tmp/repo}" ] && warm_clone=1 || warm_clone=0
source .ci/device/common.sh
TREE=$PWD
cd "$REPO" || exit 1
git checkout -q "${BRANCH:-main}" || exit 1
if [ "$warm_clone" = 1 ]; then  # the code as this call's bundle has it, the data kept
    git fetch -q "$TREE/.whl/repo.bundle" "${BRANCH:-main}" && git merge -q --ff-only FETCH_HEAD
else
    (cd "$TREE" && tar cf - kernels/models kernels/ops/*/tuned.json perf_tests/results/asv) \
        | tar xf - || exit 1
fi
model=$(python3 -c 'from kernels.core import fingerprint; print(fingerprint.identity().model)')
stamp "bringup of $model: steps ${STEPS:-all}, deadline ${DEADLINE:-500} s"
start=$(date +%s)
# The command stops starting work at its deadline and cuts what runs; timeout is the last
# resort (its own watchdog, 60 s later).
timeout -s INT -k 30 $(( ${DEADLINE:-500} + 60 )) python3 -m kernels bringup \
    ${STEPS:+--steps $STEPS} --deadline "${DEADLINE:-500}" ${BRINGUP_ARGS:-} \
    > "$OUT/bringup.log" 2>&1
status=$?
echo "kernels bringup exit $status after $(( $(date +%s) - start )) s (75: call again)"
paths="kernels/models/$model $(ls kernels/ops/*/tuned.json) perf_tests/results/asv/$model perf_tests/results/asv/benchmarks.json"
git add -A -- $paths 2>/dev/null
git diff --cached --binary HEAD -- $paths > "$OUT/bringup.patch"
git diff --cached --stat HEAD -- $paths | tail -4
git reset -q
tar czf "$OUT/bringup-data.tgz" $(ls -d $paths 2>/dev/null)
tar czf "$OUT/bringup-logs.tgz" .bringup 2>/dev/null
stamp done
grep -E "^(== |bringup of|ceilings of|perf run .*FAILED|floors:|tune |noise floors|history|kernels bringup)" \
    "$OUT/bringup.log" | tail -40
