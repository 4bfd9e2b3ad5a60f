"""``accelerate launch [engine flags] tests/vllm_tier/vllm_launch.py SCRIPT [ARGS...]``: run SCRIPT as ``__main__``
on this CPU machine with TRL's colocated vLLM: the sharded-engine patches of tests/engines.py (as
tests/shimmed_launch.py) and the CPU vLLM patches of tests/vllm_tier/cpu_vllm.py (real weight sync, one engine per
process) applied first."""

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import cpu_vllm  # noqa: E402
import engines  # noqa: E402

cpu_vllm.force_plain_cpu_linear()
cpu_vllm.share_engines()
engines.patch_accelerate_for_cpu()
script, sys.argv = sys.argv[1], sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
