"""What differs between the supported TRL versions (trl_grpo_ext.adapter.versions): the PyTorch stand-in for TRL 1.15's
Triton-only log-prob kernel, checked against full-logit values and gradients (and against TRL 1.16's own kernel where
it is installed), and the fallbacks installed for the running TRL."""

from __future__ import annotations

import pytest
import torch

from trl_grpo_ext.adapter import versions
from trl_grpo_ext.adapter.kernels import OPTIONAL_OUTPUTS, TorchChunkedLogProb

pytestmark = pytest.mark.fast


def _inputs(n=7, h=5, v=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, requires_grad=True)  # (N, H)
    weight = torch.randn(v, h, generator=g, requires_grad=True)  # (V, H)
    bias = torch.randn(v, generator=g)  # (V,)
    targets = torch.randint(0, v, (n,), generator=g)  # (N,)
    return hidden, weight, bias, targets


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_torch_kernel_matches_full_logits_values_and_gradients(softcap):
    hidden, weight, bias, targets = _inputs()
    temperature, scale = 0.7, 1.3
    logps, entropy, sq, mean, top1 = TorchChunkedLogProb.apply(
        hidden, weight, bias, targets, temperature, 4, softcap, scale, OPTIONAL_OUTPUTS
    )
    z = (hidden @ weight.t() + bias) * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    z = z / temperature
    ref = torch.log_softmax(z, -1)
    probs = ref.exp()
    torch.testing.assert_close(logps, ref.gather(-1, targets[:, None]).squeeze(-1))
    torch.testing.assert_close(entropy, -(probs * ref).sum(-1))
    torch.testing.assert_close(sq, torch.log((probs**2).sum(-1)))
    torch.testing.assert_close(mean, z.mean(-1))
    assert torch.equal(top1, z.argmax(-1) == targets)
    # gradients through log-probs and entropy, as TRL's loss takes them
    (logps.sum() + 0.5 * entropy.sum()).backward()
    got = (hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    (ref.gather(-1, targets[:, None]).sum() - 0.5 * (probs * ref).sum()).backward()
    torch.testing.assert_close(got[0], hidden.grad)
    torch.testing.assert_close(got[1], weight.grad)


def test_torch_kernel_returns_only_what_is_asked_and_handles_no_rows(monkeypatch):
    hidden, weight, bias, targets = _inputs(n=5)
    monkeypatch.setattr("trl_grpo_ext.adapter.kernels.ROWS_PER_BLOCK", 2)  # three blocks, concatenated
    out = TorchChunkedLogProb.apply(hidden, weight, None, targets, 1.0, 4, None, 1.0, ("entropy",))
    assert out[0].shape == (5,) and out[1].shape == (5,) and out[2:] == (None, None, None)
    empty = TorchChunkedLogProb.apply(hidden[:0], weight, bias, targets[:0], 1.0, 4, None, 1.0, ())
    assert empty[0].shape == (0,) and empty[0].requires_grad


def test_torch_kernel_matches_trls_own_kernel_where_installed():
    kernels = pytest.importorskip("trl.kernels")
    if versions.minor(__import__("trl").__version__) == "1.15":
        pytest.skip("TRL 1.15's kernel needs Triton")
    hidden, weight, bias, targets = _inputs(n=9, v=13)
    ours = TorchChunkedLogProb.apply(hidden, weight, bias, targets, 0.9, 4, 2.0, 1.1, OPTIONAL_OUTPUTS)
    theirs = kernels.ChunkedLogProbFunction.apply(hidden, weight, bias, targets, 0.9, 4, 2.0, 1.1, OPTIONAL_OUTPUTS)
    for mine, trls in zip(ours, theirs, strict=True):
        if mine.dtype == torch.bool:
            assert torch.equal(mine, trls)
        else:
            torch.testing.assert_close(mine, trls, rtol=1e-4, atol=1e-5)


def test_fallbacks_fill_only_what_the_installed_trl_lacks():
    from trl.trainer import utils

    installed = versions.install_fallbacks()  # idempotent: the adapter ran it at import
    kernel = getattr(utils, "_ChunkedLogProbFunction", "absent")
    if kernel is TorchChunkedLogProb:
        assert versions.minor(__import__("trl").__version__) == "1.15"  # only TRL 1.15 without Triton needs it
    else:
        assert installed == []
