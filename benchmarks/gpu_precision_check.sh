#!/usr/bin/env bash
# On one CUDA GPU: the plugins' bf16 compute and fp32 masters (tests/plugins/equivalence.py's step, one rank, nccl),
# then benchmarks/bench_gradient_checkpointing.py. Usage: bash benchmarks/gpu_precision_check.sh OUT_DIR
set -euo pipefail
out=${1:-/tmp/gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29533
python3 -m tests.plugins.equivalence --layouts single,single:precision=bf16,torch-ddp:precision=bf16,torch-fsdp2:precision=bf16,torch-fsdp2:gc=1 --out "$out"
python3 - "$out" <<'PY'
import glob, sys, torch
for path in sorted(glob.glob(sys.argv[1] + "/*.pt")):
    r = torch.load(path, weights_only=False)
    print(f"{r['layout']:28s} {r['device']:8s} forward {r['forward_dtypes']} masters {r['master_dtypes']} "
          f"loss {r['loss']:.6f} grad_norm {r['grad_norm']:.5f}")
PY
python3 benchmarks/bench_gradient_checkpointing.py --steps 5 --threads 4
