"""``accelerate launch [engine flags] tests/shimmed_launch.py SCRIPT [ARGS...]``: run SCRIPT as ``__main__`` with the
test-only patches of tests/engines.py applied first, so that an accelerate config that names a sharded engine (FSDP2,
DeepSpeed ZeRO-3) really shards on this CPU machine instead of silently training DDP or failing to start."""

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engines  # noqa: E402

engines.patch_accelerate_for_cpu()
script, sys.argv = sys.argv[1], sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
