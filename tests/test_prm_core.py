import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_lab import testkit
from trl_grpo_ext.core import pad_steps, prm_step_advantages
from trl_grpo_ext.prm import call_step_function, segment_completion, split_steps, sum_step_rewards


def test_hand_computed_unequal_step_counts():
    # Group of 2: completion 0 has steps ending at tokens 1 and 3 (rewards 1, 0); completion 1 one step at 2 (reward 1).
    # All step rewards of the group: {1, 0, 1}: mean 2/3, population std sqrt(2/9) = 0.4714
    # normalised: 1 -> 0.7071, 0 -> -1.4142
    adv = prm_step_advantages([[1.0, 0.0], [1.0]], [[1, 3], [2]], group_size=2, seq_len=5, eps=0.0)
    s = math.sqrt(2 / 9)
    hi, lo = (1 - 2 / 3) / s, (0 - 2 / 3) / s
    expected = torch.tensor([[hi + lo, hi + lo, lo, lo, 0.0], [hi, hi, hi, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)


def test_two_groups_are_independent_and_sample_std():
    rewards = [[0.0, 1.0], [1.0], [5.0], [5.0, 7.0]]
    ends = [[0, 2], [1], [0], [0, 1]]
    adv = prm_step_advantages(rewards, ends, group_size=2, seq_len=3, std="sample", eps=0.0)
    g1 = torch.tensor([0.0, 1.0, 1.0])
    g2 = torch.tensor([5.0, 5.0, 7.0])
    n1 = (g1 - g1.mean()) / g1.std()
    n2 = (g2 - g2.mean()) / g2.std()
    expected = torch.tensor(
        [
            [n1[0] + n1[1], n1[1], n1[1]],
            [n1[2], n1[2], 0.0],
            [n2[0], 0.0, 0.0],
            [n2[1] + n2[2], n2[2], 0.0],
        ]
    )
    torch.testing.assert_close(adv, expected)


def test_nan_and_none_steps_are_left_out():
    adv = prm_step_advantages([[1.0, None], [0.0, math.nan]], [[0, 1], [0, 1]], group_size=2, seq_len=2, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))


def test_completion_without_steps_gets_zero_and_padded_input_matches_lists():
    lists = prm_step_advantages([[2.0, 1.0], []], [[0, 2], []], group_size=2, seq_len=4)
    assert lists[1].abs().sum() == 0
    rewards, ends, valid = pad_steps([[2.0, 1.0], []], [[0, 2], []])
    assert valid.tolist() == [[True, True], [False, False]]
    torch.testing.assert_close(prm_step_advantages(rewards, ends, group_size=2, seq_len=4), lists)


def test_errors():
    with pytest.raises(ValueError, match="outside the 3 completion tokens"):
        prm_step_advantages([[1.0]], [[3]], group_size=1, seq_len=3)
    with pytest.raises(ValueError, match="multiple of group_size"):
        prm_step_advantages([[1.0]] * 3, [[0]] * 3, group_size=2, seq_len=2)
    with pytest.raises(ValueError, match="one of each per step"):
        prm_step_advantages([[1.0, 2.0]], [[0]], group_size=1, seq_len=2)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 12), st.data())
def test_reverse_cumsum_property(groups, group_size, seq_len, data):
    n = groups * group_size
    rewards, ends = [], []
    for _ in range(n):
        k = data.draw(st.integers(0, 4))
        ends.append(sorted(data.draw(st.lists(st.integers(0, seq_len - 1), min_size=k, max_size=k))))
        rewards.append(data.draw(st.lists(st.floats(-5, 5), min_size=k, max_size=k)))
    adv = prm_step_advantages(rewards, ends, group_size, seq_len, eps=1e-4)
    assert torch.isfinite(adv).all()
    # Difference between consecutive tokens = the normalised rewards of the steps ending exactly there.
    diffs = adv - torch.cat([adv[:, 1:], torch.zeros(n, 1)], dim=1)
    for i in range(n):
        for t in range(seq_len):
            if t not in ends[i]:
                assert abs(diffs[i, t]) < 1e-4
        if ends[i]:
            assert adv[i, max(ends[i]) + 1 :].abs().sum() == 0.0
        else:
            assert adv[i].abs().max() == 0.0


# --------------------------------------------------------------------------------------------- segmentation
@pytest.fixture(scope="module")
def char_tok():
    return testkit.build_char_tokenizer()


def test_split_steps_blank_and_missing_final_separator():
    assert split_steps("a\n\nb\n  \nc", "\n") == [(0, 1), (3, 4), (8, 9)]
    assert split_steps("no separator", "\n") == [(0, 12)]
    assert split_steps("\n\n", "\n") == []
    assert split_steps("x<step>y<step>", "<step>") == [(0, 1), (7, 8)]


def test_segment_char_tokenizer(char_tok):
    ids = char_tok("1+2=3\n3+4=7\n\n7", add_special_tokens=False)["input_ids"] + [char_tok.eos_token_id]
    steps = segment_completion(char_tok, ids)
    assert steps.texts == ["1+2=3", "3+4=7", "7"]
    assert steps.ends == [5, 11, 14]  # each step closes with its separator; the last one reaches EOS
    by_id = segment_completion(char_tok, ids, separator_token_id=char_tok.convert_tokens_to_ids("\n"))
    assert by_id == steps


def test_segment_truncated_and_empty(char_tok):
    ids = char_tok("1+2=3\n3+4", add_special_tokens=False)["input_ids"]  # truncated mid-step, no EOS
    steps = segment_completion(char_tok, ids)
    assert steps.texts == ["1+2=3", "3+4"] and steps.ends == [5, len(ids) - 1]
    assert segment_completion(char_tok, []).texts == []
    assert segment_completion(char_tok, [char_tok.eos_token_id]).texts == []
    blank = char_tok("\n\n ", add_special_tokens=False)["input_ids"]
    assert segment_completion(char_tok, blank).texts == []


CORPUS = [
    "Let x = 3.\nThen 2x = 6.\nSo the answer is 6.\n",
    "First, 4+5=9.\nNext, 9*2=18.\n\nAnswer: 18\n",
    "We add.\nWe subtract.\nDone.\n",
] * 40


@pytest.fixture(scope="module")
def bpe_tok():
    return testkit.build_bpe_tokenizer(CORPUS, vocab_size=320)


def _check_ends(tok, ids, text, steps, separator="\n"):
    spans = split_steps(text, separator)
    assert steps.texts == [text[a:b] for a, b in spans]
    assert steps.ends == sorted(steps.ends)
    for (_, stop), end in zip(spans[:-1], steps.ends[:-1], strict=True):
        last = stop + len(separator) - 1 if text.startswith(separator, stop) else stop - 1
        assert len(tok.decode(ids[: end + 1])) > last  # the step's end token produces its last character
        assert len(tok.decode(ids[:end])) <= last  # and no earlier token does
    if spans:
        assert steps.ends[-1] == len(ids) - 1


TEXT = st.lists(
    st.sampled_from(["Let", " x", " =", " 3", ".", "\n", "\n\n", "Then", " 2x", " 6", "+", "9", " "]),
    min_size=0,
    max_size=25,
).map("".join)


@settings(max_examples=80, deadline=None)
@given(TEXT)
def test_bpe_segmentation_property_canonical_ids(bpe_tok, text):
    ids = bpe_tok(text, add_special_tokens=False)["input_ids"]
    steps = segment_completion(bpe_tok, ids)
    _check_ends(bpe_tok, ids, bpe_tok.decode(ids), steps)


@settings(max_examples=60, deadline=None)
@given(TEXT)
def test_bpe_segmentation_property_non_canonical_ids(bpe_tok, text):
    # A policy can sample a non-canonical tokenization (here: character by character): the offset fast path does not
    # apply and the binary-search fallback must give the same guarantees.
    ids = [i for ch in text for i in bpe_tok(ch, add_special_tokens=False)["input_ids"]]
    steps = segment_completion(bpe_tok, ids)
    _check_ends(bpe_tok, ids, bpe_tok.decode(ids), steps)


@settings(max_examples=80, deadline=None)
@given(TEXT, st.booleans(), st.booleans())
def test_linear_paths_give_the_search_boundaries(bpe_tok, text, canonical, eos):
    # Every finished completion ends in EOS, and a policy may sample a non-canonical tokenization: the linear paths
    # (one encode with offsets; batched windowed decodes) must give the boundaries of the prefix search they replace.
    from trl_grpo_ext.prm.segmentation import _searched_token_ends, char_ends_to_tokens

    if canonical:
        ids = bpe_tok(text, add_special_tokens=False)["input_ids"]
    else:
        ids = [i for ch in text for i in bpe_tok(ch, add_special_tokens=False)["input_ids"]]
    if eos:
        ids = ids + [bpe_tok.eos_token_id]
    decoded = bpe_tok.decode(ids, skip_special_tokens=True)
    spans = split_steps(decoded, "\n")
    last_chars = [stop - 1 for _, stop in spans]
    assert char_ends_to_tokens(bpe_tok, ids, decoded, last_chars) == _searched_token_ends(bpe_tok, ids, last_chars)
    steps = segment_completion(bpe_tok, ids)
    _check_ends(bpe_tok, ids, decoded, steps)


@pytest.mark.parametrize("canonical", [True, False])
def test_long_completions_with_eos_segment_in_linear_time(bpe_tok, canonical, monkeypatch):
    # Issue 16: with EOS present every completion used to take the per-step prefix search (16k tokens: > 120 s).

    from trl_grpo_ext.prm import segmentation

    def no_search(*args, **kwargs):
        raise AssertionError("the quadratic prefix search ran")

    monkeypatch.setattr(segmentation, "_searched_token_ends", no_search)
    text = "".join(CORPUS)[:40_000]
    if canonical:
        ids = bpe_tok(text, add_special_tokens=False)["input_ids"]
    else:
        ids = [i for ch in text for i in bpe_tok(ch, add_special_tokens=False)["input_ids"]]
    ids = [*ids, bpe_tok.eos_token_id]
    steps = segment_completion(bpe_tok, ids)  # linear: the quadratic search above would fail the test (timed in
    # benchmarks/prm_segmentation_speed.py, not here)
    assert len(steps.texts) == len(split_steps(text, "\n")) and steps.ends[-1] == len(ids) - 1


def test_bpe_merged_separator_token(bpe_tok):
    ids = bpe_tok("So the answer is 6.\nDone.\n", add_special_tokens=False)["input_ids"]
    pieces = bpe_tok.convert_ids_to_tokens(ids)
    merged = [p for p in pieces if "Ċ" in p and len(p) > 1]
    assert merged, pieces  # the corpus makes BPE merge "\n" into its neighbours
    steps = segment_completion(bpe_tok, ids)
    assert steps.texts == ["So the answer is 6.", "Done."]
    assert "Ċ" in pieces[steps.ends[0]]


# --------------------------------------------------------------------------------------------- sources
def test_call_step_function_checks_counts_and_none():
    steps = [["a", "b"], ["c"]]

    def good(prompts, completions, steps, **kw):
        return [[1.0, None], None]

    out = call_step_function(good, "good", ["p", "p"], ["x", "y"], steps)
    assert out[0][0] == 1.0 and math.isnan(out[0][1]) and math.isnan(out[1][0])

    def wrong(prompts, completions, steps, **kw):
        return [[1.0], [1.0]]

    with pytest.raises(ValueError, match=r"'wrong' returned 1 scores for completion 0, which has 2 steps"):
        call_step_function(wrong, "wrong", ["p", "p"], ["x", "y"], steps)

    def short(prompts, completions, steps, **kw):
        return [[1.0, 1.0]]

    with pytest.raises(ValueError, match="returned 1 lists for 2 completions"):
        call_step_function(short, "short", ["p", "p"], ["x", "y"], steps)

    def infinite(prompts, completions, steps, **kw):
        return [[1.0, math.inf], [0.0]]

    with pytest.raises(ValueError, match="infinite"):
        call_step_function(infinite, "infinite", ["p", "p"], ["x", "y"], steps)


def test_sum_step_rewards_nan_aware():
    total = sum_step_rewards([[[1.0, math.nan]], [[2.0, math.nan]]])
    assert total[0][0] == 3.0 and math.isnan(total[0][1])
    assert sum_step_rewards([[[1.0, math.nan]], [[math.nan, 0.5]]]) == [[1.0, 0.5]]


def test_arithmetic_step_reward_rules():
    steps = [["3+4=7", "7-2=4", "5"], ["3+4 = 7", "x", "5"], ["2*3=6", "6"], ["3+4=7", "7-2=5", "5", "5"]]
    prompts = ["3+4-2=", "3+4-2=", "1+1-2=", "3+4-2="]
    assert testkit.arithmetic_step_reward(prompts, None, steps, answer=["5", "5", "0", "5"]) == [
        [1.0, 0.0, 1.0],  # wrong arithmetic in step 2
        [1.0, 0.0, 1.0],  # a step that is no equation scores 0; the answer at its place scores 1
        [0.0, 0.0],  # a correct equation that is not on the problem's path
        [1.0, 1.0, 1.0, 0.0],  # a line past the end of the chain
    ]
    assert testkit.solution_lines("3+4-2=") == ["3+4=7", "7-2=5", "5"]
    assert testkit.final_answer_reward(["3+4=7\n5\n", "5\n6", ""], answer=["5", "5", "5"]) == [1.0, 0.0, 0.0]
