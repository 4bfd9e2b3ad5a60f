"""PKPO's reward transformations (trl_grpo_ext.core.pkpo): hand-computed values, the subset definition, and the
unbiasedness of the gradient they give, checked by enumerating every draw of a small categorical policy."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from trl_grpo_ext.core.pkpo import annealed_k, pass_at_k_weights


def test_binary_rewards_by_hand():
    # n = 8 samples, c = 2 right, k = 4. s^(loo-1): a right sample gets (k / n) C(n - c, k - 1) / C(n - 1, k - 1)
    # = 0.5 * 20 / 35 = 2/7; a wrong one 0 (a wrong sample never raises the best of a subset).
    weights = pass_at_k_weights(torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 0]), 8, 4)
    assert weights.tolist() == pytest.approx([2 / 7, 0, 0, 2 / 7, 0, 0, 0, 0])
    # s: (1 / C(8, 4)) * (subsets containing i whose best is right): a right sample is in C(7, 3) = 35 subsets, all
    # right; a wrong one in C(7, 3) - C(5, 3) = 25 subsets with a right sample in them -> 35/70 and 25/70
    plain = pass_at_k_weights(torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 0]), 8, 4, estimator="s")
    assert plain.tolist() == pytest.approx([0.5, 25 / 70, 25 / 70, 0.5, 25 / 70, 25 / 70, 25 / 70, 25 / 70])
    # k = 1, "s": REINFORCE on g / n (no baseline); k = n: only the best sample of the group counts
    assert pass_at_k_weights(torch.tensor([1.0, 0.0, 1.0, 0.0]), 4, 1, estimator="s").tolist() == pytest.approx(
        [0.25, 0, 0.25, 0]
    )
    assert pass_at_k_weights(torch.tensor([0.2, 0.9, 0.5]), 3, 3, estimator="s").tolist() == pytest.approx([0.9] * 3)


def _subsets_s(g, k):
    n = len(g)
    return [
        sum(max(g[j] for j in subset) for subset in itertools.combinations(range(n), k) if i in subset)
        / math.comb(n, k)
        for i in range(n)
    ]


def _subsets_loo_minus_one(g, k):
    n, out = len(g), []
    if k == 1:  # eq. 33 is undefined at k = 1: the leave-one-out estimator s^(loo) (eq. 29), written over subsets
        return [(g[i] - sum(g[j] for j in range(n) if j != i) / (n - 1)) / n if n > 1 else 0.0 for i in range(n)]
    for i in range(n):
        rest = [g[j] for j in range(n) if j != i]
        subsets = list(itertools.combinations(rest, k - 1))
        gain = sum(max((g[i], *t)) - (max(t) if t else 0.0) for t in subsets)
        out.append(k / n * gain / len(subsets))
    return out


def test_k_equal_one_is_the_leave_one_out_baseline_by_hand():
    """k = 1 (the end of every annealed schedule): ``loo_minus_one`` is RLOO over n, so the advantage (n / k) * w is
    g_i minus the mean of the other samples; a group whose rewards are all equal gets 0, as under GRPO."""
    # g = (1, 0, 1, 0): sample 0's others average 1/3 -> (1 - 1/3) / 4 = 1/6; sample 1's others 2/3 -> -1/6
    weights = pass_at_k_weights(torch.tensor([1.0, 0.0, 1.0, 0.0]), 4, 1)
    assert weights.tolist() == pytest.approx([1 / 6, -1 / 6, 1 / 6, -1 / 6])
    for constant in (0.0, 1.0, 0.37):  # the case: [1, 1, 1, 1] gave advantages [1, 1, 1, 1]
        assert pass_at_k_weights(torch.full((4,), constant), 4, 1).abs().max() == 0
    # continuous, two groups: (0.2, 0.5, 0.8) -> others' means 0.65, 0.5, 0.35; (3, 1) -> 1 and 3
    two = pass_at_k_weights(torch.tensor([0.2, 0.5, 0.8]), 3, 1).tolist()
    assert two == pytest.approx([(0.2 - 0.65) / 3, 0.0, (0.8 - 0.35) / 3], abs=1e-7)
    assert pass_at_k_weights(torch.tensor([3.0, 1.0]), 2, 1).tolist() == pytest.approx([1.0, -1.0])
    assert pass_at_k_weights(torch.tensor([5.0]), 1, 1).tolist() == [0.0]  # no other sample: no signal


def test_weights_equal_their_definition_over_subsets():
    """The sorted closed forms against the definitions written over every subset, with ties and continuous rewards."""
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 7)
        k = rng.randint(1, n)
        g = [rng.choice([0.0, 1.0, 0.5, 2.0, rng.random()]) for _ in range(n)]
        rewards = torch.tensor(g, dtype=torch.float64)
        assert pass_at_k_weights(rewards, n, k, estimator="s").tolist() == pytest.approx(_subsets_s(g, k), abs=1e-12)
        assert pass_at_k_weights(rewards, n, k).tolist() == pytest.approx(_subsets_loo_minus_one(g, k), abs=1e-12)


@pytest.mark.parametrize("estimator", ["s", "loo_minus_one"])
@pytest.mark.parametrize(("n", "k"), [(3, 1), (3, 2), (4, 2), (4, 3), (4, 4)])
def test_the_gradient_is_unbiased(estimator, n, k):
    """A categorical policy over three outcomes with rewards (0, 0.4, 1): the expectation over every n-tuple of draws
    of sum_i s_i grad log p(x_i) equals the gradient of maxg@k = E[best reward of k draws], by autograd."""
    rewards = torch.tensor([0.0, 0.4, 1.0], dtype=torch.float64)
    logits = torch.tensor([0.3, -0.2, -0.5], dtype=torch.float64, requires_grad=True)
    probs = torch.softmax(logits, 0)
    exact = sum(
        math.prod(probs[x] for x in draw) * rewards[list(draw)].max() for draw in itertools.product(range(3), repeat=k)
    )
    (target,) = torch.autograd.grad(exact, logits)
    estimate = torch.zeros(3, dtype=torch.float64)
    for draw in itertools.product(range(3), repeat=n):
        weights = pass_at_k_weights(rewards[list(draw)], n, k, estimator=estimator)
        p = torch.softmax(logits, 0)
        log_p = torch.log(p[list(draw)])
        (grad,) = torch.autograd.grad((weights * log_p).sum(), logits)
        estimate += math.prod(float(p.detach()[x]) for x in draw) * grad
    torch.testing.assert_close(estimate, target)


def test_groups_are_independent_and_unscorable_counts_as_worst():
    two = pass_at_k_weights(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0]), 3, 2)
    first = pass_at_k_weights(torch.tensor([1.0, 0.0, 0.0]), 3, 2)
    torch.testing.assert_close(two[:3], first)
    torch.testing.assert_close(two[3:], torch.zeros(3, dtype=torch.float64))  # all right: no sample raises the best
    nan = pass_at_k_weights(torch.tensor([1.0, float("nan"), 0.0]), 3, 2)
    torch.testing.assert_close(nan, first)  # NaN is the group's lowest reward (0 here)
    assert not pass_at_k_weights(torch.full((3,), float("nan")), 3, 2).any()


def test_annealed_k():
    assert [annealed_k(8, progress=p, anneal_fraction=0.5) for p in (0.0, 0.25, 0.5, 0.9)] == [8, 4, 1, 1]
    assert annealed_k(8, progress=0.7, anneal_fraction=0.0) == 8  # constant


def test_the_annealed_schedule_ends_on_baselined_pass_at_1():
    """Along an annealed schedule a constant-reward group never gets a gradient, at k > 1 (no sample raises the best)
    and at k = 1 (the leave-one-out baseline), and a mixed group's advantages sum to 0 once k is 1."""
    group = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0])  # a solved prompt, then a half-solved one
    for progress in (0.0, 0.2, 0.4, 0.6, 1.0):
        k = annealed_k(4, progress=progress, anneal_fraction=0.5)
        weights = pass_at_k_weights(group, 4, k)
        assert weights[:4].abs().max() == 0, (progress, k)
        if k == 1:
            assert weights[4:].sum().abs() < 1e-12 and weights[4] < 0 < weights[5]


def test_bad_arguments():
    with pytest.raises(ValueError, match="1 <= k <= group_size"):
        pass_at_k_weights(torch.ones(4), 4, 5)
    with pytest.raises(ValueError, match="group_size"):
        pass_at_k_weights(torch.ones(5), 4, 2)
    with pytest.raises(ValueError, match="estimator"):
        pass_at_k_weights(torch.ones(4), 4, 2, estimator="loo")
