import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trl.trainer.utils import nanstd

from trl_grpo_ext.core import group_relative_advantages, nan_std


def test_seed_worked_example_population_std():
    # Seed document sec. 3: r = {0.20, 0.25, 0.10, 0.45}, mean 0.25, population std sqrt(0.01625) = 0.1275,
    # A ~ {-0.392, 0, -1.176, 1.569} (the document divides by the rounded std 0.1275).
    rewards = torch.tensor([0.20, 0.25, 0.10, 0.45])
    std = math.sqrt(0.01625)
    expected = torch.tensor([-0.05, 0.0, -0.15, 0.20]) / std
    torch.testing.assert_close(group_relative_advantages(rewards, 4, std="population", eps=0.0), expected)
    seed_rounded = torch.tensor([-0.392, 0.0, -1.176, 1.569])
    assert torch.allclose(group_relative_advantages(rewards, 4, std="population", eps=0.0), seed_rounded, atol=1.5e-3)
    # With TRL's eps = 1e-4 the values move by < 1e-3.
    assert torch.allclose(group_relative_advantages(rewards, 4, std="population"), seed_rounded, atol=2e-3)


def test_sample_std_matches_trl_formula():
    # TRL 1.16: (r - group mean) / (nanstd(group) + 1e-4), nanstd with Bessel's correction.
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.5, 2.0, 2.0, 2.0, 1.0])
    grouped = rewards.view(-1, 4)
    expected = ((grouped - grouped.mean(1, keepdim=True)) / (nanstd(grouped, dim=1).unsqueeze(1) + 1e-4)).view(-1)
    torch.testing.assert_close(group_relative_advantages(rewards, 4), expected)


def test_batch_and_none_scaling():
    rewards = torch.tensor([0.0, 1.0, 3.0, 5.0])
    centred = torch.tensor([-0.5, 0.5, -1.0, 1.0])
    torch.testing.assert_close(group_relative_advantages(rewards, 2, scale="none"), centred)
    torch.testing.assert_close(group_relative_advantages(rewards, 2, scale="batch"), centred / (rewards.std() + 1e-4))


def test_nan_rewards_left_out_and_zeroed():
    rewards = torch.tensor([1.0, float("nan"), 0.0, 2.0])
    adv = group_relative_advantages(rewards, 4, std="population", eps=0.0)
    assert adv[1] == 0.0
    scored = torch.tensor([1.0, 0.0, 2.0])
    expected = (scored - scored.mean()) / scored.std(unbiased=False)
    torch.testing.assert_close(adv[[0, 2, 3]], expected)


def test_equal_rewards_give_zero_advantage():
    torch.testing.assert_close(group_relative_advantages(torch.ones(8), 4), torch.zeros(8))


def test_nan_std_kinds():
    x = torch.tensor([[1.0, 2.0, 3.0, float("nan")]])
    torch.testing.assert_close(nan_std(x, dim=1), torch.tensor([1.0]))
    torch.testing.assert_close(nan_std(x, dim=1, kind="population"), torch.tensor([math.sqrt(2 / 3)]))
    with pytest.raises(ValueError, match="sample"):
        nan_std(x, kind="bessel")


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_relative_advantages(torch.ones(5), 2)
    with pytest.raises(ValueError, match="1-D"):
        group_relative_advantages(torch.ones(2, 2), 2)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 5).flatmap(
        lambda p: st.tuples(
            st.just(p),
            st.integers(2, 6).flatmap(
                lambda g: st.tuples(st.just(g), st.lists(st.floats(-100, 100), min_size=p * g, max_size=p * g))
            ),
        )
    ),
    st.sampled_from(["sample", "population"]),
)
def test_properties_zero_mean_unit_std(data, std_kind):
    p, (g, values) = data
    rewards = torch.tensor(values, dtype=torch.float64)
    adv = group_relative_advantages(rewards, g, std=std_kind, eps=0.0).view(p, g)
    assert torch.isfinite(adv).all()
    grouped = rewards.view(p, g)
    spread = grouped.std(dim=1, unbiased=std_kind == "sample")
    ok = spread > 1e-6
    if not ok.any():
        return
    torch.testing.assert_close(adv[ok].mean(dim=1), torch.zeros(int(ok.sum()), dtype=torch.float64))
    torch.testing.assert_close(
        adv[ok].std(dim=1, unbiased=std_kind == "sample"), torch.ones(int(ok.sum()), dtype=torch.float64)
    )
    # Invariant to shifting and positive scaling of the rewards.
    shifted = group_relative_advantages(rewards * 3.0 + 7.0, g, std=std_kind, eps=0.0).view(p, g)
    torch.testing.assert_close(shifted[ok], adv[ok])


def test_w_reinforce_advantages_by_hand():
    from trl_grpo_ext.core.advantages import w_reinforce_advantages

    rewards = torch.tensor([1.0, 0.0, 0.5, float("nan"), 0.7])
    out = w_reinforce_advantages(rewards, positive_weight=0.1, threshold=0.5)
    # 1.0 > 0.5: +lambda; 0.0 and 0.5 (not above): -1; unscorable: 0; 0.7: +lambda
    torch.testing.assert_close(out, torch.tensor([0.1, -1.0, -1.0, 0.0, 0.1]))


def test_scale_positive_advantages_keeps_negatives_and_shape():
    from trl_grpo_ext.core.advantages import scale_positive_advantages

    adv = torch.tensor([[1.5, -0.5, 0.0], [-2.0, 0.25, 4.0]])  # (B, T)
    out = scale_positive_advantages(adv, positive_weight=0.1)
    torch.testing.assert_close(out, torch.tensor([[0.15, -0.5, 0.0], [-2.0, 0.025, 0.4]]))
    torch.testing.assert_close(scale_positive_advantages(adv[:, 0], positive_weight=0.0), torch.tensor([0.0, -2.0]))


def test_entropy_shaped_advantages_by_hand():
    from trl_grpo_ext.core.advantages import entropy_shaped_advantages

    adv = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])  # (B, T)
    ent = torch.tensor([[0.5, 3.0], [2.0, 5.0]], requires_grad=True)  # (B, T)
    out = entropy_shaped_advantages(adv, ent, alpha=0.4, kappa=2.0)
    # 1 + min(0.2, 0.5); 1 + min(1.2, 0.5) capped; -1 + min(0.8, 0.5) capped; 0 + min(2.0, 0) = 0
    torch.testing.assert_close(out, torch.tensor([[1.2, 1.5], [-0.5, 0.0]]))
    assert not out.requires_grad  # the entropy is detached: the bonus carries no gradient


@given(
    adv=st.lists(st.floats(-5, 5), min_size=1, max_size=16),
    ent=st.lists(st.floats(0, 10), min_size=16, max_size=16),
    kappa=st.floats(1.0, 8.0),
)
def test_entropy_shaping_never_flips_a_sign_and_bounds_the_bonus(adv, ent, kappa):
    from trl_grpo_ext.core.advantages import entropy_shaped_advantages

    a = torch.tensor(adv, dtype=torch.float64)
    h = torch.tensor(ent[: len(adv)], dtype=torch.float64)
    out = entropy_shaped_advantages(a, h, alpha=0.4, kappa=kappa)
    bonus = out - a
    assert (bonus >= 0).all() and (bonus <= a.abs() / kappa + 1e-12).all()
    assert (out[a < 0] <= 1e-12).all() and (out[a > 0] > 0).all() and (out[a == 0] == 0).all()
