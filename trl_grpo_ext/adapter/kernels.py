"""A PyTorch stand-in for TRL 1.15's Triton-only chunked log-prob kernel (``trl.kernels.ChunkedLogProbFunction``).

TRL 1.15 patches the policy's forward (``add_fused_lm_head``) to project hidden states through the LM head in a
Triton kernel; without Triton (CPU-only PyTorch, macOS) the kernel is ``None`` and every forward fails. TRL 1.16
added a PyTorch path to the same kernel. :class:`TorchChunkedLogProb` computes the same per-token outputs from the
logits of a block of rows at a time with ordinary autograd (gradients come from PyTorch, not a hand-written
backward). ``adapter.versions.install_fallbacks`` installs it only where TRL's kernel is missing;
``tests/test_trl_versions.py`` checks it against full-logit log-probs and entropies.
"""

from __future__ import annotations

import torch

#: The per-token outputs TRL 1.15's kernel can return besides the log-probs, in its order.
OPTIONAL_OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
#: Rows projected at once (bounds the (rows, V) logits held for the backward).
ROWS_PER_BLOCK = 1024


def _block(hidden, weight, bias, targets, *, temperature, softcap, logit_scale, outputs):
    logits = hidden @ weight.to(hidden.dtype).t()  # (n, V)
    if bias is not None:
        logits = logits + bias.to(hidden.dtype)
    z = logits.float() * logit_scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    z = z / temperature
    log_probs = torch.log_softmax(z, dim=-1)  # (n, V)
    picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (n,)
    entropy = -(log_probs.exp() * log_probs).sum(-1) if "entropy" in outputs else None
    with torch.no_grad():
        sq = torch.logsumexp(2 * log_probs, dim=-1) if "log_sum_sq_probs" in outputs else None
        mean = z.mean(-1) if "mean_logits" in outputs else None
        top1 = z.argmax(-1) == targets if "is_top1" in outputs else None  # the first maximum, as TRL's kernel
    return picked, entropy, sq, mean, top1


class TorchChunkedLogProb:
    """``TorchChunkedLogProb.apply(hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping,
    logit_scale, outputs)``: the call TRL 1.15 makes of ``ChunkedLogProbFunction`` and its five outputs
    ``(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)``, each (N,) or None when not in ``outputs``.

    ``hidden`` (N, H), ``weight`` (V, H), ``bias`` (V,) or None, ``targets`` (N,). The logits are scaled by
    ``logit_scale``, soft-capped (``c * tanh(z / c)``) when ``final_logit_softcapping`` is set, then divided by
    ``temperature``, as in TRL's kernel. ``chunk_size`` (TRL's vocabulary tile) is accepted and unused.
    """

    @staticmethod
    def apply(
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk_size: int,
        final_logit_softcapping: float | None = None,
        logit_scale: float = 1.0,
        outputs: tuple[str, ...] = OPTIONAL_OUTPUTS,
    ):
        del chunk_size
        blocks = [
            _block(
                hidden[start : start + ROWS_PER_BLOCK],
                weight,
                bias,
                targets[start : start + ROWS_PER_BLOCK],
                temperature=temperature,
                softcap=final_logit_softcapping,
                logit_scale=logit_scale,
                outputs=outputs,
            )
            # at least one block: with no valid label the outputs are empty but still connected to the head
            for start in range(0, max(hidden.shape[0], 1), ROWS_PER_BLOCK)
        ]
        return tuple(None if parts[0] is None else torch.cat(parts) for parts in zip(*blocks, strict=True))
