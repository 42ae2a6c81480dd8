#!/usr/bin/env bash
# Acceptance run for a machine with NVIDIA GPUs, in one command (after `bash scripts/setup.sh --gpu`):
#   bash scripts/gpu_check.sh [OUT_DIR]        (default: runs/gpu_check; PY=python3 to use another interpreter;
#                                               STAGES="1 3" runs those stages only)
# From one GPU up:
# 1. the gpu-marked tests;
# 2. the embedded demo colocated (--colocate: trainer and engine share the GPU) with the transformers engine, and
#    with -b vllm when vLLM is installed;
# 3. a Qwen2.5-0.5B-shaped model (python -m coati.models.scale), -t 1 colocated, fp32, two GRPO steps: the --dry-run
#    estimate of each phase (generation, training) against torch.cuda.max_memory_allocated in that phase
#    (the gpu_generate_peak_gib / gpu_train_peak_gib metrics);
# 4. the same with bf16 mixed precision, a LoRA adapter (rank 16) and gradient checkpointing;
# with 3 GPUs or more (and vLLM):
# 5. the decoupled layout: that model with vLLM and ColossalAI HybridParallel TP 2 with ZeRO-2, bf16, against its
#    --dry-run estimate for trainer rank 0.
# It prints the numbers. A failing stage does not stop the later ones (each reports on its own); the script exits
# with 1 when any stage failed, naming them.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-runs/gpu_check}
STAGES=${STAGES:-1 2 3 4 5}
titles=([1]="gpu-marked tests" [2]="the demo, colocated on one GPU"
        [3]="0.5B shape, -t 1 colocated, fp32, transformers engine"
        [4]="0.5B shape, -t 1 colocated, bf16 + LoRA rank 16 + gradient checkpointing"
        [5]="0.5B shape, decoupled: vLLM + ColossalAI HybridParallel TP 2, ZeRO-2, bf16")
for stage in $STAGES; do
    [[ "$stage" =~ ^[0-9]+$ ]] && [ -n "${titles[$stage]:-}" ] || { echo "gpu_check: no stage $stage in STAGES (stages: ${!titles[*]})" >&2; exit 2; }
done
mkdir -p "$OUT"
ngpu=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "${ngpu:-0}" -lt 1 ]; then
    echo "gpu_check: no CUDA GPU visible to $PY (torch.cuda.is_available() is False): run it on a GPU machine" \
         "after 'bash scripts/setup.sh --gpu'" >&2
    exit 2
fi
if "$PY" -c "import vllm" 2>/dev/null; then vllm=1; else vllm=0; fi
echo "gpu_check: $ngpu GPU(s): $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c | xargs)"
[ "$vllm" = 1 ] || echo "gpu_check: vLLM is not installed: the -b vllm stages are skipped (bash scripts/setup.sh --gpu)"

model="$OUT/qwen2.5-0.5b-shape"
data_flags=(-m "$model" -d "$OUT/gsm8k_like.jsonl" --input-key question --label-key answer -rt boxed -mpt 96
            -g 8 -ibs 4 -imbs 4 -tbs 4 -tMbs 4 -tmbs 8 -mnt 256 -e 1 --no-progress)

scale_model() {
    [ -f "$model/config.json" ] || "$PY" -m coati.models.scale "$model" || return
    [ -f "$OUT/gsm8k_like.jsonl" ] && return
    "$PY" - "$OUT/gsm8k_like.jsonl" <<'PY'
import json, sys
from coati.models.scale import word_problems
with open(sys.argv[1], "w") as handle:
    for row in word_problems(24, seed=7):  # >= 3 steps of -tbs 4 prompts x dp 2
        handle.write(json.dumps(row) + "\n")
PY
}

# A colocated run of the 0.5B shape: its plan, the run, then each phase's estimate against its measured peak.
colocated_phases() {
    local name=$1; shift
    local flags=("${data_flags[@]}" --colocate -t 1 -b transformers -ibs 8 -imbs 8 -tbs 8 -tMbs 8 --max-steps 2 "$@")
    scale_model || return
    CUDA_VISIBLE_DEVICES=0 "$PY" rl_example.py "${flags[@]}" --dry-run | tee "$OUT/plan_$name.txt" || return
    local start; start=$(date +%s)
    CUDA_VISIBLE_DEVICES=0 "$PY" rl_example.py "${flags[@]}" -sd "$OUT/run_$name" | tail -3 || return
    echo "0.5B $name run: $(( $(date +%s) - start )) s"
    "$PY" - "$OUT/plan_$name.txt" "$OUT/run_$name" <<'PY'
import glob, json, re, sys
plan = next(line for line in open(sys.argv[1]) if line.startswith("trainer rank 0 "))
estimate = {phase: float(value) for phase, value in re.findall(r"(train_phase|generate_phase) ([\d.]+)", plan)}
rows = [json.loads(line) for path in glob.glob(f"{sys.argv[2]}/**/metrics.jsonl", recursive=True)
        for line in open(path) if '"kind": "train"' in line]
if not rows:
    sys.exit("no train rows in metrics.jsonl")
for row in rows:
    print(f"step {row['step']}: {row['step_time_s']:.1f} s (generate {row.get('generate_s', 0):.1f}, train "
          f"{row.get('train_s', 0):.1f}, load weights {row.get('publish_s', 0):.1f}); GPU peak generate "
          f"{row.get('gpu_generate_peak_gib', 0):.2f} GiB, train {row.get('gpu_train_peak_gib', 0):.2f} GiB; "
          f"loss {row.get('loss', 0):.4g}, grad norm {row.get('grad_norm', 0):.4g}, "
          f"logprob mismatch {row.get('mismatch_max_abs', float('nan')):.3g}")
for phase, metric in (("generate_phase", "gpu_generate_peak_gib"), ("train_phase", "gpu_train_peak_gib")):
    measured = max((row.get(metric, 0.0) for row in rows), default=0.0)
    ratio = estimate[phase] / measured if measured else float("nan")
    print(f"{phase}: --dry-run estimate {estimate[phase]:.2f} GiB, measured {measured:.2f} GiB (estimate / measured "
          f"{ratio:.2f})")
PY
}

stage_1() { "$PY" -m pytest -q -p no:cacheprovider -m gpu tests; }

stage_2() {
    local backends=(transformers) backend start
    [ "$vllm" = 1 ] && backends+=(vllm)
    for backend in "${backends[@]}"; do
        start=$(date +%s)
        CUDA_VISIBLE_DEVICES=0 "$PY" rl_example.py --colocate -b "$backend" -sd "$OUT/demo_$backend" --no-progress \
            | tail -4 || return
        echo "demo colocated, -b $backend: $(( $(date +%s) - start )) s"
    done
}

stage_3() { colocated_phases fp32; }

stage_4() { colocated_phases bf16_lora --precision bf16 --lora-rank 16 --gradient-checkpointing; }

stage_5() {
    local trainers=0 start
    if [ "$ngpu" -ge 5 ]; then trainers=4; elif [ "$ngpu" -ge 3 ]; then trainers=2; fi
    if [ "$trainers" -eq 0 ] || [ "$vllm" = 0 ]; then
        echo "skipped: needs vLLM and 3 GPUs (TP 2 and one inferencer); $ngpu here, vLLM $([ "$vllm" = 1 ] && echo yes || echo no)"
        return 0
    fi
    scale_model || return
    local flags=("${data_flags[@]}" -b vllm --plugin colossalai -t "$trainers" -tp 2 -zero 2 --precision bf16 -i 1)
    "$PY" rl_example.py "${flags[@]}" --dry-run | tee "$OUT/plan_decoupled.txt" || return
    start=$(date +%s)
    "$PY" rl_example.py "${flags[@]}" -sd "$OUT/run_decoupled" | tail -3 || return
    echo "0.5B decoupled run: $(( $(date +%s) - start )) s"
    "$PY" - "$OUT" <<'PY'
import glob, json, sys
out = sys.argv[1]
plan = next(line for line in open(f"{out}/plan_decoupled.txt") if line.startswith("trainer rank 0 "))
estimate = float(plan.split()[7])
rows = [json.loads(line) for path in glob.glob(f"{out}/run_decoupled/**/metrics.jsonl", recursive=True)
        for line in open(path) if '"kind": "train"' in line]
measured = max(row.get("gpu_max_allocated_gib", 0.0) for row in rows) if rows else 0.0
print(f"trainer rank 0: --dry-run estimate {estimate:.2f} GiB, torch.cuda.max_memory_allocated {measured:.2f} GiB "
      f"(estimate / measured {estimate / measured if measured else float('nan'):.2f})")
PY
}

failed=()
for stage in $STAGES; do
    echo "== $stage. ${titles[$stage]}"
    start=$(date +%s)
    stage_"$stage"
    rc=$?
    echo "== $stage: $([ $rc = 0 ] && echo passed || echo "FAILED (exit $rc)") in $(( $(date +%s) - start )) s"
    [ $rc = 0 ] || failed+=("$stage")
done
[ ${#failed[@]} = 0 ] || { echo "gpu_check: stage(s) ${failed[*]} failed" >&2; exit 1; }
