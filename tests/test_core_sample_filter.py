import math

import pytest
import torch

from trl_grpo_ext.core import SAMPLE_FILTER_STRATEGIES, pf_keep_mask, r_squared, rank_filter_strategies

REWARDS = torch.tensor([0.2, 0.9, 0.1, 0.5, 1.0, 1.0, 1.0, 1.0, float("nan"), 0.3, 0.7, 0.0])


def rows(mask):
    return mask.view(-1, 4).int().tolist()


def test_best_of_n():
    assert rows(pf_keep_mask(REWARDS, 4, strategy="best_of_n")) == [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]]


def test_best_worst():
    # group 2: NaN is never the best and never the worst while a scorable reward exists
    assert rows(pf_keep_mask(REWARDS, 4, strategy="best_worst")) == [[0, 1, 1, 0], [1, 0, 0, 1], [0, 0, 1, 1]]


def test_nonzero_std_drops_flat_groups():
    assert rows(pf_keep_mask(REWARDS, 4, strategy="nonzero_std")) == [[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]]


def test_best_random_keeps_best_plus_one_uniform_other():
    counts = torch.zeros(4)
    gen = torch.Generator().manual_seed(0)
    rewards = torch.tensor([0.0, 3.0, 1.0, 2.0])
    for _ in range(900):
        keep = pf_keep_mask(rewards, 4, strategy="best_random", generator=gen)
        assert keep[1] and int(keep.sum()) == 2
        counts += keep.float()
    assert counts[1] == 900
    assert all(250 < c < 350 for c in counts[[0, 2, 3]].tolist())
    a = pf_keep_mask(REWARDS, 4, strategy="best_random", generator=torch.Generator().manual_seed(3))
    b = pf_keep_mask(REWARDS, 4, strategy="best_random", generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_unknown_strategy_lists_valid_names():
    with pytest.raises(ValueError, match="best_of_n, best_random, best_worst, nonzero_std"):
        pf_keep_mask(REWARDS, 4, strategy="top_half")


def test_a_strategy_function_is_used_and_checked():
    """pf_keep_mask takes a strategy function as it takes a built-in's name; what the function returns is checked."""

    def first_only(grouped, generator):
        keep = torch.zeros_like(grouped, dtype=torch.bool)
        keep[:, 0] = True
        return keep

    def wrong(grouped, generator):
        return torch.ones(3, dtype=torch.bool)

    def broken(grouped, generator):
        raise KeyError("oops")

    assert rows(pf_keep_mask(REWARDS, 4, strategy=first_only)) == [[1, 0, 0, 0]] * 3
    with pytest.raises(ValueError, match="strategy 'wrong' must return a bool mask of shape"):
        pf_keep_mask(REWARDS, 4, strategy=wrong)
    with pytest.raises(RuntimeError, match="strategy 'broken' raised KeyError"):
        pf_keep_mask(REWARDS, 4, strategy=broken)
    with pytest.raises(TypeError):
        SAMPLE_FILTER_STRATEGIES["first_only"] = first_only  # read-only: the switch's registry is the family's


def test_r_squared():
    x = torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert r_squared(x, 2 * x + 1) == pytest.approx(1.0)
    assert r_squared(x, torch.tensor([1.0, -1.0, -1.0, 1.0])) == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(r_squared(x, torch.ones(4)))
    assert math.isnan(r_squared(x[:1], x[:1]))


def test_rank_filter_strategies_prefers_reliable_extremes():
    # A reward model that is right at its extremes and noise in the middle: best-of-n / best-worst keep the
    # reliable part, so they rank above keeping everything.
    gen = torch.Generator().manual_seed(0)
    true = torch.rand(400, generator=gen)
    noisy_middle = (true > 0.2) & (true < 0.8)
    reward = torch.where(noisy_middle, torch.rand(400, generator=gen), true)
    ranking = rank_filter_strategies(reward, true, 8, generator=gen)
    names = [name for name, _ in ranking]
    assert sorted(names) == ["best_of_n", "best_random", "best_worst", "none", "nonzero_std"]  # the built-ins
    scores = dict(ranking)
    assert scores["best_worst"] > scores["none"]
    assert [s for _, s in ranking] == sorted((s for _, s in ranking), reverse=True)
    # a strategy of one's own is ranked beside a built-in; keeping the reward's extremes beats keeping all
    extremes = {"extremes": lambda grouped, generator: (grouped < 0.2) | (grouped > 0.8)}  # reward's reliable range
    mine = dict(rank_filter_strategies(reward, true, 8, strategies={**extremes, "best_of_n": "best_of_n"}))
    assert set(mine) == {"none", "extremes", "best_of_n"} and mine["extremes"] > mine["none"]
    assert dict(rank_filter_strategies(reward, true, 8, strategies=["best_worst"], generator=gen)) == {
        "none": scores["none"],
        "best_worst": scores["best_worst"],
    }
