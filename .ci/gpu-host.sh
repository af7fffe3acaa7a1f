#!/usr/bin/env bash
# Run zerobench on an offline GPU host: install the wheels carried in .whl/ (once per machine), then run
# the given command with the project on PYTHONPATH.
# Usage: bash .ci/gpu-host.sh python3 -m bench run matrices/1b.yaml --results "$OUT/1b.jsonl"
set -uo pipefail
# Install once per machine, not once per call: a reinstall gives DeepSpeed's op sources new mtimes,
# and ninja then rebuilds the cached JIT ops: with a reinstall in every call, each call rebuilt FusedAdam,
# warm machine or not ("ops done in 53-63 s" in results/gpu-evidence/2026-11-30_{1b-2gpu-b,1b-2gpu-buckets,
# 1b-mfu-2,selfcheck-1b-fork}_console.log). That this stamp cures it is not measured.
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
