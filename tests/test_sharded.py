"""Every family on, under the engines users scale with: FSDP2 and DeepSpeed ZeRO-3 with the parameters really split
across 2 gloo processes on the CPU (tests/engines.py says what it patches in accelerate to get there), in both AEPO
modes and with dynamic sampling (where DPPO's trust region stands in for KL-Cov), against the DDP run of the same
seed; a reference reset after step 2 in every run.

Rank 1's rewards are flat by construction (tests/sharded_worker.py): AEPO finds nothing to splice there (splice mode)
or no sample for its chunk (term mode), and ``nonzero_std`` keeps none of its rows (term mode); in mode ``dynamic``,
dynamic sampling refills rank 1's groups with new ones while rank 0 generates as many and splices none, and best-worst
then chooses among the refilled batch's samples. Under FSDP2 /
ZeRO-3 every forward is a collective, so a process that skips one crashes the run (gloo) or deadlocks it; each run is
bounded by ``ddp_timeout=60`` inside and a subprocess timeout outside, so a mismatch fails in about a minute, never at
the CI limit. The DDP run also logs every collective and forward of both processes: the two logs must be equal, which
checks the rule on every change without a sharded engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import free_port

from grpo_lab import testkit

WORKER = Path(__file__).with_name("sharded_worker.py")
MODES = ("splice", "term", "dynamic")

pytestmark = pytest.mark.slow


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


def _run(out: Path, engine: str, mode: str, prm: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
    cmd += [str(WORKER), str(out), engine, mode, prm]
    try:
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"{engine}/{mode} hung past 240 s (a collective one process never joined?): {error.stderr!s:.3000}")
    assert proc.returncode == 0, f"{engine}/{mode} failed:\n{proc.stderr[-5000:]}"
    return json.loads((out / f"{engine}_{mode}.json").read_text())


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The policy and a PRM (token classification, random) saved once; the DDP reference runs of both modes."""
    from transformers import LlamaForTokenClassification

    out = tmp_path_factory.mktemp("sharded")
    testkit.save_tiny_model(out / "model")
    tokenizer = testkit.build_char_tokenizer()
    torch.manual_seed(0)
    LlamaForTokenClassification(testkit.tiny_config(tokenizer, num_labels=2)).save_pretrained(out / "prm")
    tokenizer.save_pretrained(out / "prm")
    return out


@pytest.fixture(scope="module")
def ddp(workdir):
    return {mode: _run(workdir, "ddp", mode, str(workdir / "prm")) for mode in MODES}


@pytest.mark.parametrize("mode", MODES)
def test_every_process_runs_the_same_forwards_and_collectives(ddp, mode):
    """The rule, checked under DDP: both processes log the same sequence of forwards and collectives, though rank 1
    splices nothing / trains no AEPO sample / keeps no row."""
    rank0, rank1 = ddp[mode]
    assert rank0["events"] == rank1["events"]
    assert any(e.startswith("forward:") for e in rank0["events"]) and "all_gather" in rank0["events"]
    if mode == "splice":
        assert sum(rank0["spliced_rows"]) > 0 and sum(rank1["spliced_rows"]) == 0  # rank 1's splice empty every time
    elif mode == "dynamic":  # rank 1 refills its flat groups, rank 0 generates as many rounds and refills nothing
        assert len(rank0["dppo_shift"]) == 3 and max(rank0["dppo_shift"]) > 0  # DPPO measured every step
        assert sum(rank1["refilled_rows"]) > 0 and sum(rank0["refilled_rows"]) == 0
        assert rank0["rounds"] == rank1["rounds"] and max(rank0["rounds"]) >= 1
    else:
        assert sum(rank0["aepo_chunk_rows"]) > 0 and sum(rank1["aepo_chunk_rows"]) == 0


def _check_matches(runs: list[dict], reference: list[dict], engine_name: str, *, rel: float, sharded=True) -> None:
    for got, want in zip(runs, reference, strict=True):
        assert got["engine"] == engine_name
        assert got["sharded"] == sharded, "the parameters were not split across processes" if sharded else got
        assert got["finite"] and len(got["losses"]) == len(want["losses"]) == 3
        assert got["losses"] == pytest.approx(want["losses"], rel=rel, abs=1e-7)
        assert got["betas"] == pytest.approx(want["betas"], rel=rel)
        assert got["kls"][1] > 0 and got["kls"][2] == pytest.approx(0.0, abs=1e-6)  # the reference reset after step 2
        assert got["dppo_shift"] == pytest.approx(want["dppo_shift"], rel=rel, abs=1e-7)  # mode "dynamic": DPPO
        assert got["aepo_state"] == pytest.approx(want["aepo_state"], rel=rel)
        assert got["aepo_samples"] == want["aepo_samples"]
        assert got["spliced_rows"] == want["spliced_rows"] and got["aepo_chunk_rows"] == want["aepo_chunk_rows"]
        assert got["refilled_rows"] == want["refilled_rows"] and got["rounds"] == want["rounds"]
        assert got["eval"] == pytest.approx(want["eval"], rel=rel, abs=1e-6)
    assert runs[0]["betas"] == runs[1]["betas"]  # every rank holds the same beta


@pytest.mark.parametrize("mode", MODES)
def test_fsdp2_matches_ddp(workdir, ddp, mode):
    """FSDP2 (``fully_shard`` over 2 gloo processes): the same losses, betas, AEPO state and eval pass@k as DDP."""
    _check_matches(_run(workdir, "fsdp2", mode, str(workdir / "prm")), ddp[mode], "FSDP", rel=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_zero3_matches_ddp(workdir, ddp, deepspeed_ops, mode):
    """DeepSpeed ZeRO-3, every parameter partitioned (no persistence threshold): DDP's numbers up to float32
    reduction order, the PRM scored through a DeepSpeed engine as TRL scores reward models."""
    _check_matches(_run(workdir, "zero3", mode, str(workdir / "prm")), ddp[mode], "DEEPSPEED", rel=1e-5)


@pytest.mark.parametrize("mode", MODES[:2])  # no collective in a ZeRO-2 forward: the AEPO modes suffice
def test_zero2_matches_ddp(workdir, ddp, deepspeed_ops, mode):
    """DeepSpeed ZeRO-2 (optimizer state and gradients partitioned, parameters whole: no collective in a forward)."""
    runs = _run(workdir, "zero2", mode, str(workdir / "prm"))
    _check_matches(runs, ddp[mode], "DEEPSPEED", rel=1e-5, sharded=False)
