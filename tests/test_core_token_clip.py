import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_grpo_ext.core import (
    clip_cov_mask,
    kl_cov_mask,
    kl_cov_penalty,
    num_selected,
    ppo_clipped_mask,
    select_top_k,
    token_covariance,
)


def test_token_covariance_hand_computed():
    logps = torch.tensor([[-1.0, -3.0], [-2.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1], [1, 0]])
    # valid logps -1, -3, -2: mean -2; valid A 1, 1, -1: mean 1/3
    expected = torch.tensor([[(1.0) * (2 / 3), (-1.0) * (2 / 3)], [0.0 * (-4 / 3), 0.0]])
    torch.testing.assert_close(token_covariance(logps, adv, mask), expected)


def test_token_covariance_accepts_token_level_advantages_and_detaches():
    logps = torch.randn(3, 5, requires_grad=True)
    adv = torch.randn(3, 5)
    cov = token_covariance(logps, adv, torch.ones(3, 5))
    assert not cov.requires_grad
    lp, a = logps.detach(), adv
    torch.testing.assert_close(cov, (lp - lp.mean()) * (a - a.mean()))


def test_num_selected():
    assert num_selected(0, 0.1) == 0
    assert num_selected(5, 1e-4) == 1
    assert num_selected(1000, 2e-3) == 2
    assert num_selected(1000, 0.0125) == 12


def test_kl_cov_picks_top_covariance_tokens():
    torch.manual_seed(0)
    logps, adv = torch.randn(4, 25), torch.randn(4)
    mask = torch.ones(4, 25)
    mask[2, 10:] = 0
    sel = kl_cov_mask(logps, adv, mask, ratio=0.1)
    cov = token_covariance(logps, adv, mask)
    k = num_selected(int(mask.sum()), 0.1)
    assert int(sel.sum()) == k
    assert not (sel & ~mask.bool()).any()
    top = torch.topk(cov[mask.bool()], k).values
    torch.testing.assert_close(torch.sort(cov[sel]).values, torch.sort(top).values)


def test_kl_cov_ties_give_exact_count():
    logps = torch.zeros(2, 8)  # every covariance is 0: all tie
    sel = kl_cov_mask(logps, torch.tensor([1.0, -1.0]), torch.ones(2, 8), ratio=0.25)
    assert int(sel.sum()) == 4
    assert sel.view(-1)[:4].all()  # ties go to the lowest flat indices


def test_clip_cov_window_exclusion_count_and_seed():
    torch.manual_seed(1)
    logps, adv = torch.randn(8, 64) * 2, torch.randn(8) * 2
    mask = torch.ones(8, 64)
    cov = token_covariance(logps, adv, mask)
    window = (cov > 1.0) & (cov < 5.0)
    exclude = torch.zeros(8, 64, dtype=torch.bool)
    exclude[:4] = True
    gen = torch.Generator().manual_seed(0)
    sel = clip_cov_mask(logps, adv, mask, ratio=0.02, lb=1.0, ub=5.0, generator=gen, exclude=exclude)
    assert int(sel.sum()) == num_selected(512, 0.02) == 10
    assert (sel <= (window & ~exclude)).all()
    again = clip_cov_mask(
        logps, adv, mask, ratio=0.02, lb=1.0, ub=5.0, generator=torch.Generator().manual_seed(0), exclude=exclude
    )
    assert torch.equal(sel, again)


def test_clip_cov_takes_all_candidates_when_fewer_than_k():
    logps = torch.tensor([[0.0, 0.0, 3.0, -3.0]])
    adv = torch.tensor([[0.0, 0.0, 3.0, -3.0]])  # cov 9 at the last two, 0 elsewhere
    sel = clip_cov_mask(logps, adv, torch.ones(1, 4), ratio=1.0, lb=1.0, ub=10.0)
    assert sel.tolist() == [[False, False, True, True]]


def test_clip_cov_choice_is_uniform_over_candidates():
    logps = torch.zeros(1, 6)
    adv = torch.zeros(1, 6)
    counts = torch.zeros(6)
    gen = torch.Generator().manual_seed(0)
    for _ in range(600):
        counts += clip_cov_mask(logps, adv, torch.ones(1, 6), ratio=0.2, lb=-1.0, ub=1.0, generator=gen)[0].float()
    assert counts.sum() == 600
    assert counts.min() > 60 and counts.max() < 140  # expectation 100 each


def test_ppo_clipped_mask():
    logps = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5, 1.1]]))
    old = torch.zeros(1, 5)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0]])
    clipped = ppo_clipped_mask(logps, old, adv, torch.ones(1, 5), epsilon_low=0.2, epsilon_high=0.28)
    assert clipped.tolist() == [[True, True, False, False, False]]


def test_kl_cov_penalty_value_and_gradient():
    logps = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.5, -1.0, -0.5]])
    sel = torch.tensor([[True, True, False]])
    pen = kl_cov_penalty(logps, old, sel)
    torch.testing.assert_close(pen, torch.tensor([[0.5, 1.0, 0.0]]))
    pen.sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[1.0, -1.0, 0.0]]))


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.integers(0, 80), st.data())
def test_select_top_k_exact_count_property(b, t, k, data):
    scores = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.5]), min_size=b * t, max_size=b * t)))
    eligible = torch.tensor(data.draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t)))
    scores, eligible = scores.view(b, t), eligible.view(b, t)
    sel = select_top_k(scores, eligible, k)
    assert int(sel.sum()) == min(k, int(eligible.sum()))
    assert (sel <= eligible).all()
    if sel.any() and (eligible & ~sel).any():
        assert scores[sel].min() >= scores[eligible & ~sel].max()


class _FakeTwoRanks:
    """Collectives of rank ``rank`` in a 2-process group whose other member holds ``other`` (tested in-process)."""

    def __init__(self, rank, tensors_by_rank):
        self.rank = rank
        self.tensors_by_rank = tensors_by_rank
        self.calls = 0

    def _other(self):
        value = self.tensors_by_rank[self.calls]
        self.calls += 1
        return value

    def all_sum(self, tensor):
        return tensor + self._other()

    def all_cat(self, tensor):
        other = self._other()
        return torch.cat([tensor, other] if self.rank == 0 else [other, tensor])


def test_select_top_k_global_ties_go_to_lower_rank():
    # Rank 1's view: rank 0 has two tokens tied with ours at the threshold.
    scores = torch.tensor([[1.0, 1.0, 0.0]])
    coll = _FakeTwoRanks(1, [torch.tensor([1.0, 1.0]), torch.tensor([0, 2])])
    sel = select_top_k(scores, torch.ones(1, 3, dtype=torch.bool), 3, collectives=coll)
    assert sel.tolist() == [[True, False, False]]  # rank 0 takes 2 of the 3 slots


def test_bad_selection_inputs():
    with pytest.raises(RuntimeError):
        clip_cov_mask(torch.zeros(2, 2), torch.zeros(3), torch.ones(2, 2), ratio=0.5, lb=0, ub=1)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.integers(0, 80), st.booleans(), st.data())
def test_single_process_fast_selection_equals_the_general_path(b, t, k, continuous, data):
    """select_top_k's one-topk path (one process) gives the same mask as the general, tie-counting path."""
    from trl_grpo_ext.core.collectives import _Local

    if continuous:
        seed = data.draw(st.integers(0, 2**16))
        scores = torch.rand(b, t, generator=torch.Generator().manual_seed(seed))
    else:
        values = data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.5]), min_size=b * t, max_size=b * t))
        scores = torch.tensor(values).view(b, t)
    eligible = torch.tensor(data.draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))).view(b, t)
    general = select_top_k(scores, eligible, k, collectives=_Local())  # not LOCAL itself: the general path
    assert torch.equal(select_top_k(scores, eligible, k), general)


@pytest.mark.parametrize("seed", range(4))
def test_row_advantage_covariance_and_masks_match_the_token_level_path(seed):
    gen = torch.Generator().manual_seed(seed)
    logps = -torch.rand(16, 64, generator=gen) * 5
    adv = torch.randn(16, generator=gen)
    mask = torch.rand(16, 64, generator=gen) > 0.2
    expanded = adv.unsqueeze(1).expand(16, 64).contiguous()  # the same advantages, token-level: the general path
    torch.testing.assert_close(token_covariance(logps, adv, mask), token_covariance(logps, expanded, mask))
    assert torch.equal(kl_cov_mask(logps, adv, mask, ratio=0.02), kl_cov_mask(logps, expanded, mask, ratio=0.02))
    kw = dict(ratio=0.02, lb=-100.0, ub=100.0)
    assert torch.equal(
        clip_cov_mask(logps, adv, mask, generator=torch.Generator().manual_seed(1), **kw),
        clip_cov_mask(logps, expanded, mask, generator=torch.Generator().manual_seed(1), **kw),
    )


def test_masks_take_a_precomputed_covariance():
    """The trainer computes the covariance once per micro-batch and hands it to the mask and to its logs."""
    gen = torch.Generator().manual_seed(0)
    logps, adv, mask = -torch.rand(8, 32, generator=gen) * 5, torch.randn(8, generator=gen), torch.rand(8, 32) > 0.2
    cov = token_covariance(logps, adv, mask)
    assert torch.equal(
        kl_cov_mask(logps, adv, mask, ratio=0.05), kl_cov_mask(logps, adv, mask, ratio=0.05, covariance=cov)
    )
    kw = dict(ratio=0.05, lb=-100.0, ub=100.0)
    assert torch.equal(
        clip_cov_mask(logps, adv, mask, generator=torch.Generator().manual_seed(1), **kw),
        clip_cov_mask(logps, adv, mask, generator=torch.Generator().manual_seed(1), covariance=cov, **kw),
    )


@pytest.mark.parametrize("n, k", [(64, 3), (4096, 5), (4096, 300), (1000, 7), (2 * 3 * 5 * 7 * 11, 9)])
def test_chunked_topk_has_the_values_of_one_topk(n, k):
    from trl_grpo_ext.core.token_clip import _topk_1d

    x = torch.rand(n, generator=torch.Generator().manual_seed(n + k))
    values, indices = _topk_1d(x, k)
    torch.testing.assert_close(values, torch.topk(x, k).values)
    torch.testing.assert_close(x[indices], values)  # each index points at its value
