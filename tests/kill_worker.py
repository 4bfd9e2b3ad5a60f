"""Run by tests/test_reliability.py in a subprocess: trains with a checkpoint every step and SIGKILLs itself in the
middle of writing the extension state of checkpoint-2 (half a JSON object on disk), as a crashing machine would."""

import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import TINY_ARGS  # noqa: E402

from grpo_lab import testkit
from trl_grpo_ext import GRPOExtConfig, GRPOExtTrainer  # noqa: E402

model_path, output_dir, fields = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
trainer = None
real_dump = json.dump


def dying_dump(obj, f, **kwargs):
    if isinstance(obj, dict) and "kl_control" in obj and trainer.state.global_step == 2:
        f.write(json.dumps(obj)[:20])
        f.flush()
        os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    return real_dump(obj, f, **kwargs)


json.dump = dying_dump
trainer = GRPOExtTrainer(
    model=model_path,
    reward_funcs=[testkit.exact_match_reward, testkit.digit_fraction_reward],
    args=GRPOExtConfig(**{**TINY_ARGS, "output_dir": output_dir, **fields}),
    train_dataset=testkit.arithmetic_dataset(256, seed=0),
    processing_class=testkit.build_char_tokenizer(),
)
trainer.train()
