"""A real 2-process run (torchrun, gloo on CPU): global statistics and the KL controller agree across ranks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import equivalence
import pytest
import torch
from conftest import free_port

WORKER = Path(__file__).with_name("dist_worker.py")


def test_two_process_global_selection_and_training(tmp_path, tiny_model_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        str(WORKER),
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    sel = result["selection"]
    assert sel["cov_equal"], "global covariance differs from the single-process one on the union"
    assert sel["kl_equal"] and sel["kl_count"] == sel["k"]
    assert sel["clip_count"] == sel["k"] and sel["clip_in_window"]
    prm = result["prm"]
    assert prm["nonzero"] and prm["max_abs_diff"] < 1e-5, prm  # a group spanning 2 processes, normalised as one
    train = result["training"]
    assert train["num_processes"] == 2 and train["steps"] == 3
    assert train["losses_finite"] and train["selected_logged"]
    assert train["betas"][0] == train["betas"][1]  # every rank holds the same beta
    assert train["betas"][0] != 0.04  # and the controller moved it
    assert train["aepo_samples"] > 0  # AEPO spliced samples on two processes
    assert train["aepo_state"][0] == train["aepo_state"][1]  # same entropy and temperature on every rank

    # The same generation batch on one process: identical PRM advantages, filter masks, token count and beta.
    reference = equivalence.deterministic_quantities(
        equivalence.build_trainer(tiny_model_path, str(tmp_path / "one"), per_device=8)
    )
    two = result["equivalence"]
    assert two["keep"] == reference["keep"]
    assert two["num_items_in_batch"] == [reference["num_items_in_batch"]] * 2
    for a, b in zip(two["advantages"], reference["advantages"], strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b))
    assert two["betas"][0] == two["betas"][1] == pytest.approx(reference["beta"], rel=1e-6)
    assert reference["beta"] != 0.04
