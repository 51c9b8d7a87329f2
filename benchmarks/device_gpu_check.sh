#!/usr/bin/env bash
# The prepared GPU check for a lent device machine (one GPU; docs/gpu-check.md says what it
# measures). From a session with the device tool, in the repository root:
#   echo /.whl/ >> .git/info/exclude
#   python -m pip download --no-deps --only-binary=:all: -d .whl simpy==4.1.1
#   run(command="bash benchmarks/device_gpu_check.sh", carry=[".whl"], timeout_s=600)
# The machine's image has torch (CUDA), numpy, scipy, click, matplotlib, pytest and
# hypothesis but not simpy, which travels as a wheel. Writes under $OUT: env.txt, the
# check's log and its report folder gc/ (report.md, results.json, measured.json, the
# calibrated profile), and the GPU tests' tail.
set -u
BUDGET=${BUDGET:-300}
OUT=${OUT:-/tmp/gpu-check-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 XDG_DATA_HOME=/tmp/xdg
{ date -u; uptime; nproc
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,power.limit \
      --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
torch.cuda.get_device_name(0), 'nccl', torch.cuda.nccl.version())"
} 2>&1 | tee "$OUT/env.txt"
timeout $((BUDGET + 150)) python3 -m perfmodel gpu-check --cluster h200 --budget-s "$BUDGET" \
    --out "$OUT/gc" 2>&1 | tee "$OUT/gpu-check.log"
echo "gpu-check exit ${PIPESTATUS[0]}"
timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu.py -k "not gpu_check" \
    2>&1 | tail -20 | tee "$OUT/pytest-gpu.log"
