#!/usr/bin/env bash
# Acceptance run for a machine with NVIDIA GPUs, in one command (after `bash scripts/setup.sh --gpu`):
#   bash scripts/gpu_check.sh [OUT_DIR]        (default: runs/gpu_check)
# 1. the gpu-marked tests;
# 2. the embedded demo with -b vllm (one GPU for the trainer, one for the inferencer: needs 2 GPUs);
# 3. a Qwen2.5-0.5B-shaped model (python -m coati.models.scale) trained 3 GRPO steps with vLLM and ColossalAI
#    HybridParallel: TP 2 with ZeRO-2 over dp (-t 4 when 5+ GPUs, else -t 2), bf16;
# 4. that run's --dry-run estimate for trainer rank 0 against its torch.cuda.max_memory_allocated
#    (the gpu_max_allocated_gib metric).
# It prints the numbers; a failing stage stops the script with its exit status.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-runs/gpu_check}
mkdir -p "$OUT"
ngpu=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$ngpu" -lt 1 ]; then
    echo "gpu_check: no CUDA GPU visible to $PY (torch.cuda.is_available() is False): run it on a GPU machine" \
         "after 'bash scripts/setup.sh --gpu'" >&2
    exit 2
fi
"$PY" -c "import vllm" 2>/dev/null || { echo "gpu_check: vLLM is not installed: bash scripts/setup.sh --gpu" >&2; exit 2; }
echo "gpu_check: $ngpu GPU(s): $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c | xargs)"

echo "== 1. gpu-marked tests"
"$PY" -m pytest -q -m gpu tests

echo "== 2. the demo with -b vllm"
if [ "$ngpu" -ge 2 ]; then
    start=$(date +%s)
    "$PY" rl_example.py -b vllm -sd "$OUT/demo" --no-progress | tail -4
    echo "demo: $(( $(date +%s) - start )) s"
else
    echo "skipped: the demo's trainer and inferencer each take a whole GPU (coati/cluster/placement.py); 1 GPU here"
fi

echo "== 3. 0.5B shape, vLLM + ColossalAI HybridParallel TP 2, ZeRO-2, bf16"
if [ "$ngpu" -ge 5 ]; then trainers=4; elif [ "$ngpu" -ge 3 ]; then trainers=2; else trainers=0; fi
if [ "$trainers" -eq 0 ]; then
    echo "skipped: TP 2 and one inferencer need 3 GPUs; $ngpu here"
    exit 0
fi
model="$OUT/qwen2.5-0.5b-shape"
[ -f "$model/config.json" ] || "$PY" -m coati.models.scale "$model"
"$PY" - "$OUT/gsm8k_like.jsonl" <<'PY'
import json, sys
from coati.models.scale import word_problems
with open(sys.argv[1], "w") as handle:
    for row in word_problems(24, seed=7):  # >= 3 steps of -tbs 4 prompts x dp 2
        handle.write(json.dumps(row) + "\n")
PY
flags=(-m "$model" -d "$OUT/gsm8k_like.jsonl" --input-key question --label-key answer -rt boxed -mpt 96
       -b vllm --plugin colossalai -t "$trainers" -tp 2 -zero 2 --precision bf16 -i 1
       -g 8 -ibs 4 -imbs 4 -tbs 4 -tMbs 4 -tmbs 8 -mnt 256 -e 1 --no-progress)
"$PY" rl_example.py "${flags[@]}" --dry-run | tee "$OUT/plan.txt"
start=$(date +%s)
"$PY" rl_example.py "${flags[@]}" -sd "$OUT/run05b" | tail -3
echo "0.5B run: $(( $(date +%s) - start )) s"

echo "== 4. estimate vs measured (trainer rank 0)"
"$PY" - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
plan = next(line for line in open(f"{out}/plan.txt") if line.startswith("trainer rank 0 "))
estimate = float(plan.split()[7])
rows = [json.loads(line) for path in glob.glob(f"{out}/run05b/**/metrics.jsonl", recursive=True)
        for line in open(path) if '"kind": "train"' in line]
for row in rows:
    print(f"step {row['step']}: {row['step_time_s']:.1f} s (generate {row.get('generate_s', 0):.1f}, train "
          f"{row.get('train_s', 0):.1f}, publish {row.get('publish_s', 0):.1f})")
measured = max(row.get("gpu_max_allocated_gib", 0.0) for row in rows) if rows else 0.0
print(f"trainer rank 0: --dry-run estimate {estimate:.2f} GiB, torch.cuda.max_memory_allocated {measured:.2f} GiB "
      f"(estimate / measured {estimate / measured if measured else float('nan'):.2f})")
PY
