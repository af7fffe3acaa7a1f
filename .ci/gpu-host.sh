#!/usr/bin/env bash
# Run zerobench on the offline GPU bench host (see ../shared/gpu-host/README.md): install the carried
# wheels, then run the given command with the project on PYTHONPATH.
# Usage: bash .ci/gpu-host.sh python3 -m bench run matrices/1b.yaml --results "$OUT/1b.jsonl"
set -uo pipefail
# Install once per machine, not once per call: a reinstall gives DeepSpeed's op sources new mtimes,
# and ninja then rebuilds the cached JIT ops: every call of the third session rebuilt its ops, warm
# machine or not ("ops done in 53-63 s" for FusedAdam in results/gpu-evidence/session3_*_run.log).
# That this stamp cures it is not measured yet.
stamp=$(ls -l .whl/*.whl | sha256sum)
if [ "$(cat /tmp/site/.zerobench-wheels 2>/dev/null)" != "$stamp" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  echo "$stamp" > /tmp/site/.zerobench-wheels
fi
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
# Build caches in the (ignored) working tree: the bench host keeps them between calls while it stays
# warm, so DeepSpeed's JIT ops and Inductor's kernels need compiling once per machine, not once per call.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.torch_ext} TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$PWD/.inductor}
"$@"
