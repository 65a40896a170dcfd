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
# Wall time per step on one H200, measured 2026-12-02 (docs/bringup.md, "How long it takes"):
# ceilings 12 s, tune 94 s, perf 366 s (run 1, cold caches) + 288 s (run 2), floors under a second;
# noise (~6-8 min) and history (~3-4 min a commit, 12 commits in ~5 calls) not run yet. So a
# whole bring-up is about 8 calls (~1.2 hours of device time), most of it the history.
#
#   STEPS="ceilings tune perf floors" bash .ci/device/bringup.sh   # call 1 (carry .whl)
#   STEPS="perf floors" bash .ci/device/bringup.sh     # call 2 (unpack call 1's here first
#                                                      # if the machine went cold)
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
