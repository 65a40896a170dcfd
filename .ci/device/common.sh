# Sourced by the device scripts: carried wheels on PYTHONPATH, a clone of the bundle in
# $REPO (/tmp/repo; main = the bundle's main), unbuffered output, the card's state logged.
# per_gpu.sh runs several scripts at once, one per GPU: it installs the wheels once
# (SITE_READY) and gives each its own REPO, FRESH_HOME and OUT. A script that runs the working
# tree itself and needs no asv (kernel_tables.sh) sets WORKTREE_ONLY=1: no wheels, no clone.
set -u
REPO=${REPO:-/tmp/repo}
FRESH_HOME=${FRESH_HOME:-/tmp/fresh-home}
if [ -z "${SITE_READY:-}" ] && [ -z "${WORKTREE_ONLY:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv | tee "$OUT/gpu.txt"
if [ ! -d "$REPO" ] && [ -z "${WORKTREE_ONLY:-}" ]; then
    git clone -q .whl/repo.bundle "$REPO" && git -C "$REPO" checkout -q main
    git -C "$REPO" config user.email device@kernelperf
    git -C "$REPO" config user.name device
fi
stamp() { echo "=== $(date +%T) $*"; }
# An A/A gate from a fresh HOME (empty JAX, Triton and nvcc caches, no ~/.asv-machine.json):
# in $REPO, HEAD a README whitespace commit on main, on branch aa.
fresh_aa() {
    export HOME=$FRESH_HOME && mkdir -p "$HOME"
    cd "$REPO" || exit 1
    git checkout -q -b aa main
    echo >> README.md && git commit -qam "A/A: README whitespace"
}
