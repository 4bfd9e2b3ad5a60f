"""Two processes (torchrun, gloo), each with its own colocated engine: dynamic sampling refills through each rank's
engine with that rank's drawn prompts, both ranks run the same rounds (generation, scoring and forwards are
collectives), AEPO regenerates on both, and every rank's rows carry vLLM's log-probs of the synced weights."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("vllm_worker.py")

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_ranks_refill_and_regenerate_through_their_own_engines(tmp_path, vllm_model_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(WORKER.parent), str(WORKER.parent.parent), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port())]
    cmd += [str(WORKER), str(tmp_path), vllm_model_path]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420)
    except subprocess.TimeoutExpired as error:  # a collective one rank skipped hangs the other
        pytest.fail(f"2-process vLLM run hung: {str(error.stderr)[-3000:]}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["num_processes"] == 2 for r in ranks)
    zero, one = ranks
    # Same decisions everywhere: losses, beta, rounds (one engine call per round on every rank), AEPO's temperature.
    assert zero["losses"] == one["losses"] and zero["betas"] == one["betas"]
    assert [c["temperature"] for c in zero["engine_calls"]] == [c["temperature"] for c in one["engine_calls"]]
    assert len(zero["drawn"]) == len(one["drawn"]) >= 1
    assert sum(zero["refilled"]) >= 1 and sum(zero["aepo_used"]) >= 1  # logged values are global
    # Each rank's engine sampled its own rows (seed = rank) and refilled with its own draws.
    assert zero["first_completion"] != one["first_completion"] or zero["engine_calls"][0] != one["engine_calls"][0]
    for rank in ranks:
        refills = [
            c
            for c in rank["engine_calls"]
            if c["prompts"] and any(c["prompts"] == [p for p in d for _ in range(4)] for d in rank["drawn"])
        ]
        assert len(refills) == len(rank["drawn"]), rank["engine_calls"]
        assert rank["max_gap"] < rank["synced"], rank["max_gap"]
        assert sum(rank["spliced_rows"]) > 0
