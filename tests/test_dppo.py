"""DPPO's binary trust region (``token_clip="dppo"``): hand-computed masks, and the trainer's gradient cross-checked
against verl's ``compute_policy_loss_dppo_tv`` / ``_kl`` and prime-rl's default loss, each written out here from its
formula on the same inputs (their code is not copied)."""

import math

import pytest
import torch
from conftest import LogpProbe, aggregate_single_process, random_advantage_batch

from trl_grpo_ext.core.token_clip import dppo_outside_mask, squared_log_ratio

P = torch.tensor([[0.50, 0.10, 0.90, 0.30]])  # probabilities now
Q = torch.tensor([[0.20, 0.40, 0.85, 0.30]])  # and at rollout


def test_binary_tv_masks_only_the_way_the_advantage_pushes():
    mask = torch.ones(1, 4, dtype=torch.bool)
    # p - q = 0.3, -0.3, 0.05, 0
    pos = torch.ones(1)
    outside, high = dppo_outside_mask(P.log(), Q.log(), pos, mask, divergence="tv", delta_low=0.2, delta_high=0.2)
    assert outside.tolist() == [[True, False, False, False]] and high.tolist() == outside.tolist()
    neg = -torch.ones(1)
    outside, high = dppo_outside_mask(P.log(), Q.log(), neg, mask, divergence="tv", delta_low=0.2, delta_high=0.2)
    assert outside.tolist() == [[False, True, False, False]] and not high.any()
    # A = 0 follows the negative rule (verl, prime-rl); asymmetric bounds; padding never masked
    zero = torch.zeros(1)
    outside, _ = dppo_outside_mask(P.log(), Q.log(), zero, mask, divergence="tv", delta_low=0.35, delta_high=0.1)
    assert not outside.any()
    pad = torch.tensor([[False, True, True, True]])
    outside, _ = dppo_outside_mask(P.log(), Q.log(), pos, pad, divergence="tv", delta_low=0.2, delta_high=0.2)
    assert not outside.any()


def test_binary_kl_by_hand():
    def bkl(q, p):
        return q * math.log(q / p) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))

    expected = [bkl(q, p) for q, p in zip(Q[0].tolist(), P[0].tolist(), strict=True)]  # 0.193, 0.311, 0.0122, 0
    mask = torch.ones(1, 4, dtype=torch.bool)
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    outside, high = dppo_outside_mask(
        P.log(), Q.log(), advantages, mask, divergence="kl", delta_low=0.2, delta_high=0.2
    )
    assert expected[0] < 0.2 < expected[1]
    assert outside.tolist() == [[False, True, False, False]] and not high.any()
    outside, high = dppo_outside_mask(
        P.log(), Q.log(), advantages, mask, divergence="kl", delta_low=0.35, delta_high=0.1
    )
    assert outside.tolist() == [[True, False, False, False]] and high.tolist() == outside.tolist()
    # the KL rule masks a token only when it moved the way its advantage pushes: p < q with A > 0 never
    outside, _ = dppo_outside_mask(
        P.log(), Q.log(), -advantages, mask, divergence="kl", delta_low=1e-3, delta_high=1e-3
    )
    assert outside.tolist() == [[False, False, False, False]]
    with pytest.raises(ValueError, match="'tv' or 'kl'"):
        dppo_outside_mask(P.log(), Q.log(), advantages, mask, divergence="js", delta_low=0.2, delta_high=0.2)


def test_squared_log_ratio_value_and_gradient():
    logps = P.log().requires_grad_()
    value = squared_log_ratio(logps, Q.log())
    torch.testing.assert_close(value, (P.log() - Q.log()).square())
    value.sum().backward()
    torch.testing.assert_close(logps.grad, 2 * (P.log() - Q.log()))


# ----------------------------------------------------------------------------- the references' losses, as formulas
def verl_dppo_loss(logps, old, advantages, mask, *, divergence, low, high, cap, agg):
    """verl ``compute_policy_loss_dppo_tv`` / ``_kl``: ``-A * sg(min(r, cap)) * log p * valid``."""
    ratio = torch.exp(torch.clamp(logps - old, -20.0, 20.0))
    prob, old_prob = logps.exp(), old.exp()
    if divergence == "tv":
        valid_pos, valid_neg = (prob - old_prob) <= high, (prob - old_prob) >= -low
    else:
        kl = old_prob * (old - logps) + (1 - old_prob) * torch.log((1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
        valid_pos, valid_neg = (kl <= high) | (prob <= old_prob), (kl <= low) | (prob >= old_prob)
    valid = torch.where(advantages > 0, valid_pos, valid_neg).detach().float()
    return agg(-advantages * torch.clamp(ratio, max=cap).detach() * logps * valid * mask)


def prime_rl_loss(logps, inference, advantages, mask, *, low, high, kl_tau, agg):
    """prime-rl ``default_loss_fn``: ``-(keep * A * r) + kl_tau * (log r)^2`` over the loss tokens."""
    diff = logps.exp() - inference.exp()
    invalid = torch.where(advantages > 0, diff > high, diff < -low)
    keep = mask & ~invalid
    log_ratio = logps - inference
    return agg(-(keep * advantages * log_ratio.exp()) + kl_tau * mask * log_ratio.square())


def _grads(make_trainer, train_dataset, *, loss_type, **fields):
    """The trainer's gradient on its log-probs with DPPO, and without any token clip with the advantages zeroed (the
    KL term's gradient alone), on one batch whose old log-probs were moved so that many tokens leave the region."""
    trainer = make_trainer(token_clip="dppo", num_iterations=2, beta=0.1, loss_type=loss_type, **fields)
    assert trainer.epsilon_low == math.inf and trainer.epsilon_high == math.inf  # the region replaces the clip
    probe = LogpProbe().install(trainer)
    inputs = random_advantage_batch(trainer, train_dataset)
    gen = torch.Generator().manual_seed(1)
    inputs["old_per_token_logps"] = inputs["old_per_token_logps"] + 0.8 * torch.randn(
        inputs["old_per_token_logps"].shape, generator=gen
    )
    inputs["ref_per_token_logps"] = inputs["ref_per_token_logps"] + 0.3  # a KL gradient everywhere
    trainer._compute_loss(trainer.model, inputs).backward()
    grad = probe.logps.grad.clone()
    logps = probe.logps.detach()
    masked = trainer._metrics["train"]["dppo/masked_frac"][-1]
    trainer.extensions.pop("token_clip")
    trainer.model.zero_grad()
    trainer._compute_loss(trainer.model, {**inputs, "advantages": torch.zeros_like(inputs["advantages"])}).backward()
    kl_grad = probe.logps.grad.clone()
    return trainer, inputs, logps, grad, kl_grad, masked


#: The tiny model's probabilities are about 1 / vocabulary (0.01), so its bounds are small.
BOUNDS = {"tv": (0.004, 0.006), "kl": (0.001, 0.002)}


@pytest.mark.parametrize(("divergence", "loss_type"), [("tv", "dapo"), ("kl", "dapo"), ("tv", "dr_grpo")])
def test_gradient_is_verls(make_trainer, train_dataset, divergence, loss_type):
    low, high = BOUNDS[divergence]
    trainer, inputs, logps, grad, kl_grad, masked = _grads(
        make_trainer, train_dataset, loss_type=loss_type, dppo_divergence=divergence, dppo_delta_low=low,
        dppo_delta_high=high,
    )  # fmt: skip
    assert 0.05 < masked < 0.95  # the region is active and not everything
    mask = inputs["completion_mask"].float()
    adv = inputs["advantages"].unsqueeze(1).expand_as(logps)
    lp = logps.clone().requires_grad_()

    def agg(x):
        return aggregate_single_process(trainer, x, inputs, loss_type)

    verl_dppo_loss(
        lp, inputs["old_per_token_logps"], adv, mask, divergence=divergence, low=low, high=high, cap=1e9, agg=agg
    ).backward()
    torch.testing.assert_close(grad - kl_grad, lp.grad * mask)


def test_gradient_is_prime_rls_with_the_squared_log_ratio(make_trainer, train_dataset):
    trainer, inputs, logps, grad, kl_grad, masked = _grads(
        make_trainer, train_dataset, loss_type="dapo", dppo_delta_low=0.005, dppo_delta_high=0.005,
        dppo_log_ratio_coef=0.05,
    )  # fmt: skip
    assert 0.05 < masked < 0.95
    mask = inputs["completion_mask"].bool()
    adv = inputs["advantages"].unsqueeze(1).expand_as(logps)
    lp = logps.clone().requires_grad_()

    def agg(x):
        return aggregate_single_process(trainer, x, inputs, "dapo")

    prime_rl_loss(lp, inputs["old_per_token_logps"], adv, mask, low=0.005, high=0.005, kl_tau=0.05, agg=agg).backward()
    torch.testing.assert_close(grad - kl_grad, lp.grad * mask)
    assert trainer._metrics["train"]["dppo/log_ratio_sq_mean"]


def test_anchor_is_the_rollout_policy():
    from trl_grpo_ext.families.base import LossContext
    from trl_grpo_ext.families.token_clip import DPPO

    old, vllm = torch.zeros(1, 2), torch.ones(1, 2)
    ctx = LossContext(inputs={"old_per_token_logps": old}, mask=torch.ones(1, 2), mode="train", logps=old)
    assert DPPO.anchor(ctx) is old
    ctx = LossContext(
        inputs={"old_per_token_logps": old, "sampling_per_token_logps": vllm},
        mask=torch.ones(1, 2),
        mode="train",
        logps=old,
    )
    assert DPPO.anchor(ctx) is vllm  # vLLM's sampling log-probs: the policy that sampled (TRL's off_policy_mask too)


@pytest.mark.parametrize(
    ("fields", "named", "fix"),
    [
        (dict(), "token_clip", "num_iterations=2"),  # on-policy without vLLM: inert
        (dict(num_iterations=2, epsilon_high=0.28), "token_clip", "drop epsilon_high"),
        (dict(num_iterations=2, loss_type="cispo"), "token_clip", "loss_type="),
        (dict(num_iterations=2, importance_sampling_level="sequence"), "token_clip", "importance_sampling_level"),
        (dict(num_iterations=2, dppo_delta_high=1.0), "dppo_delta_high", "dppo_delta_high=0.2"),
        (dict(num_iterations=2, dppo_delta_low=-0.1), "dppo_delta_low", "dppo_delta_low=0.2"),
        (dict(num_iterations=2, dppo_log_ratio_coef=-1.0), "dppo_log_ratio_coef", "1e-3"),
        (dict(num_iterations=2, dppo_delta_low=float("nan")), "dppo_delta_low", "finite"),
    ],
)
def test_refusals_name_the_field_and_the_fix(tmp_path, fields, named, fix):
    import trl_grpo_ext.families  # noqa: F401  (the members' rules)
    from trl_grpo_ext import GRPOExtConfig

    with pytest.raises(ValueError, match=named) as err:
        GRPOExtConfig(
            output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=8, num_generations=4,
            token_clip="dppo", **fields,
        )  # fmt: skip
    assert fix in str(err.value)
