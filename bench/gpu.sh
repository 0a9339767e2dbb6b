#!/usr/bin/env bash
# The agent's GPU checks (bench/gpu_check.py) on a bare machine that has python3 with PyTorch and
# CUDA but not the agent's own packages, and no network: those come as wheels in .whl/, made beforehand
# where pip works by `make gpu-wheels` (for the machine's Python, 3.12 unless GPU_PYTHON says). Arguments
# go to bench/gpu_check.py; its output is also written to $OUT/gpu-check.log when OUT is set.
#
#   bash bench/gpu.sh --sizes 1,13.5 --dir /local/disk
set -euo pipefail
cd "$(dirname "$0")/.."
site=$(mktemp -d /tmp/spotguard-site.XXXXXX)
trap 'rm -rf "$site"' EXIT
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl
fi
export PYTHONPATH="$PWD/agent:$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# the agent and everything it imports, before any check: a missing package is one line, here
python3 -c "import spotguard_agent.torch_state" || {
    echo "the agent's packages are missing: make gpu-wheels where pip works, and bring .whl/ along" >&2
    exit 2
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
log=${OUT:+$OUT/gpu-check.log}
python3 bench/gpu_check.py "$@" 2>&1 | tee ${log:-/dev/null}
