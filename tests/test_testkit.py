from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_lab import testkit


def test_saved_tiny_model_reloads_with_the_same_tokenizer(tmp_path):
    path = testkit.save_tiny_model(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(path)  # what TRL and the PRM loaders do
    text = "1+2=3\n3 + 4 = 7\n\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.eos_token == "<eos>" and tok.pad_token == "<pad>"
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == len(tok)


def test_rewards_and_datasets():
    ds = testkit.arithmetic_dataset(20, seed=0)
    assert all(int(eval_free(r["prompt"])) == int(r["answer"]) for r in ds)
    assert testkit.exact_match_reward(["7", " 7<eos>", "70", "x"], answer=["7"] * 4) == [1.0, 1.0, 0.0, 0.0]
    assert testkit.digit_fraction_reward(["12ab", ""]) == [0.5, 0.0]
    multi = testkit.multistep_dataset(10, seed=1, num_ops=3)
    for row in multi:
        steps = row["solution"].split("\n")
        assert len(steps) == 4 and steps[-1] == row["answer"]
        assert testkit.arithmetic_step_reward([row["prompt"]], None, [steps], answer=[row["answer"]]) == [[1.0] * 4]
        assert testkit.solution_lines(row["prompt"]) == steps
        assert testkit.final_answer_reward([row["solution"]], answer=[row["answer"]]) == [1.0]


def eval_free(prompt: str) -> int:
    a, b = prompt.rstrip("=").split("+")
    return int(a) + int(b)


def test_step_accuracy_reward_hand_computed():
    prompts = ["3+4+2="] * 4 + ["1+1+1="]
    completions = [
        "3+4=7\n7+2=9\n9",  # all three steps on the path
        "3+4=7\n7+2=10\n10",  # first step right, then wrong arithmetic and a wrong answer: 1/3
        "3+4=8\n8+2=10\n10",  # a correct equation off the path scores 0: 0/3
        "3+4=7\n\n7+2=9\n9\n",  # blank lines are not steps: 3/3
        "",  # no steps at all
    ]
    scores = testkit.step_accuracy_reward(prompts, completions, answer=["9"] * 4 + ["3"])
    assert scores == [1.0, 1 / 3, 0.0, 1.0, 0.0]
