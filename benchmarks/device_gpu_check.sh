#!/usr/bin/env bash
# The prepared GPU checks for a lent device machine (one GPU; docs/gpu-check.md says what
# gpu-check measures). From a session with the device tool, in the repository root:
#   echo /.whl/ >> .git/info/exclude
#   python -m pip download --no-deps --only-binary=:all: -d .whl simpy==4.1.1
#   run(command="bash benchmarks/device_gpu_check.sh", carry=[".whl"], timeout_s=600)
#   run(command="RUN=transfer bash benchmarks/device_gpu_check.sh", carry=[".whl"], ...)
# RUN=check (default): `perfmodel gpu-check` at its defaults (reports/gpu-check-2026-12-04).
# RUN=transfer: the cases perfmodel/data/heldout/gpu_check_h200.toml declares (other
# batches, fp32), measured for a held-out check of an earlier run's calibrated profile.
# RUN=heldout3: perfmodel/data/heldout/gpu_check_h200_run3.toml's cases (no GPU tests).
# RUN=check and RUN=transfer end with the GPU tests (tests/test_gpu.py) but the check's own.
# The machine's image has torch (CUDA), numpy, scipy, click, matplotlib, pytest and
# hypothesis but not simpy, which travels as a wheel. Writes under $OUT: env.txt, the
# logs, and the report folders (gc/ for RUN=check; transfer.tar.gz for RUN=transfer).
set -u
RUN=${RUN:-check}
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

check() {   # check NAME BUDGET_S ARGS...: one gpu-check into $OUT/NAME
    local name=$1 budget=$2
    shift 2
    timeout $((budget + 150)) python3 -m perfmodel gpu-check --cluster h200 \
        --budget-s "$budget" --out "$OUT/$name" "$@" 2>&1 | tee -a "$OUT/gpu-check.log"
    echo "gpu-check $name exit ${PIPESTATUS[0]}" | tee -a "$OUT/gpu-check.log"
}

# Independent ground truth for compute.launch_us_per_kernel: eager PyTorch's cost per op
# when the GPU is not the bottleneck (a tiny in-place add, and a tiny Linear with and without
# autocast), median of 5 loops of 2000 ops, synchronised once per loop.
python3 - <<'PY' 2>&1 | tee "$OUT/dispatch.txt"
import statistics, time, torch
x = torch.zeros(16, device="cuda"); lin = torch.nn.Linear(16, 16).cuda(); a = torch.zeros(4, 16, device="cuda")
def per_op_us(fn, n=2000):
    out = []
    for _ in range(6):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(n): fn()
        torch.cuda.synchronize(); out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out[1:])
print(f"add_ {per_op_us(lambda: x.add_(1)):.2f} us/op")
print(f"linear fp32 {per_op_us(lambda: lin(a)):.2f} us/call")
def bf16():
    with torch.autocast("cuda", dtype=torch.bfloat16): lin(a)
print(f"linear autocast bf16 {per_op_us(bf16):.2f} us/call")
PY

if [ "$RUN" = transfer ]; then
    check resnet50-b128 100 --workloads resnet50 --batch-size 128
    check bert-large-b16 100 --workloads bert-large --batch-size 16
    check gpt2-xl-b8 120 --workloads gpt2-xl --batch-size 8 --blocks 8
    check fp32 150 --workloads resnet50,bert-large,gpt2-xl --precisions fp32
    tar -C "$OUT" -czf "$OUT/transfer.tar.gz" resnet50-b128 bert-large-b16 gpt2-xl-b8 fp32
    rm -rf "${OUT:?}"/resnet50-b128 "$OUT"/bert-large-b16 "$OUT"/gpt2-xl-b8 "$OUT"/fp32
elif [ "$RUN" = heldout3 ]; then
    check resnet50-b256 90 --workloads resnet50 --batch-size 256 --precisions fp32,tf32,bf16-mixed
    check bert-large-b32 90 --workloads bert-large --batch-size 32 --precisions fp32,tf32,bf16-mixed
    check gpt2-xl-b16 90 --workloads gpt2-xl --batch-size 16 --blocks 8 --precisions fp32,tf32,bf16-mixed
    tar -C "$OUT" -czf "$OUT/heldout3.tar.gz" resnet50-b256 bert-large-b32 gpt2-xl-b16
    rm -rf "${OUT:?}"/resnet50-b256 "$OUT"/bert-large-b32 "$OUT"/gpt2-xl-b16
    exit 0
else
    check gc "${BUDGET:-300}"
fi
timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu.py -k "not gpu_check" \
    2>&1 | tail -20 | tee "$OUT/pytest-gpu.log"
