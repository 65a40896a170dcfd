# Sourced by the device scripts: carried wheels on PYTHONPATH, a clone of the bundle in
# /tmp/repo (main = the bundle's main), unbuffered output, the card's state logged.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv | tee "$OUT/gpu.txt"
if [ ! -d /tmp/repo ]; then
    git clone -q .whl/repo.bundle /tmp/repo && git -C /tmp/repo checkout -q main
    git -C /tmp/repo config user.email device@kernelperf
    git -C /tmp/repo config user.name device
fi
stamp() { echo "=== $(date +%T) $*"; }
# An A/A gate from a fresh HOME (empty JAX, Triton and nvcc caches, no ~/.asv-machine.json):
# in /tmp/repo, HEAD a README whitespace commit on main, on branch aa.
fresh_aa() {
    export HOME=/tmp/fresh-home && mkdir -p "$HOME"
    cd /tmp/repo || exit 1
    git checkout -q -b aa main
    echo >> README.md && git commit -qam "A/A: README whitespace"
}
