"""Local stand-ins for the Hub repositories TRL's own GRPO tests load, so that suite runs offline.

TRL's tests name tiny models and datasets by Hub id (``"trl-internal-testing/tiny-Qwen2ForCausalLM-2.5"``,
``load_dataset("trl-internal-testing/zen", "standard_prompt_only")``). transformers and datasets read an id that is also
an existing local folder from that folder, so :func:`build_standins` writes folders with those names under ``root``,
and a run whose working directory is ``root`` loads them and never reaches the Hub.

What stands in for what (a stand-in is not the Hub file: only what TRL's tests rely on is kept):

* causal LMs (:data:`CAUSAL_LMS`): a random 2-layer Llama (hidden 32) and a byte-level BPE tokenizer trained here,
  with a ChatML chat template; the Qwen / Mistral names get the Llama architecture too (transformers 5 forces its own
  tokenizer class on a folder whose config names ``qwen2``, and TRL's GRPO code paths tested here do not depend on it);
* reward models (:data:`SEQUENCE_CLASSIFIERS`): the same, as a one-label ``LlamaForSequenceClassification``;
* ``zen``: the configs ``standard_prompt_only`` and ``conversational_prompt_only``, 17 train and 2 test prompts.

Tests that need anything else (vision-language models, tool-calling chat templates of real model families, remote
code, quantisation) find nothing and fail the same way with or without the plugin; ``benchmarks/trl_suite.py``
compares the two runs test by test.
"""

from __future__ import annotations

import json
from pathlib import Path

from .testkit import build_bpe_tokenizer, tiny_config

ORG = "trl-internal-testing"
CAUSAL_LMS = (
    "tiny-Qwen2ForCausalLM-2.5",
    "tiny-Qwen3ForCausalLM",
    "tiny-LlamaForCausalLM-3.2",
    "tiny-MistralForCausalLM-0.2",
)
SEQUENCE_CLASSIFIERS = (
    "tiny-Qwen2ForSequenceClassification-2.5",
    "tiny-Qwen3ForSequenceClassification",
    "tiny-LlamaForSequenceClassification-3.2",
)
#: ChatML, as the Qwen 2.5 tokenizers use (no tool or "generation" blocks).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>")
ZEN_TRAIN = (
    "Beautiful is better than",
    "Explicit is",
    "Simple is better",
    "Complex",
    "Flat is better than",
    "Sparse is better",
    "Readability",
    "Special cases aren't special",
    "Although practicality beats",
    "Errors should never",
    "Unless explicitly",
    "In the face of ambiguity, refuse",
    "There should be one--",
    "Although that way may not be obvious at first unless you're",
    "Now is",
    "Although never is often",
    "If the implementation is hard to explain,",
)
ZEN_TEST = ("If the implementation is easy", "Namespaces are one")


def build_tokenizer():
    """A byte-level BPE tokenizer (every byte encodable) with ChatML specials, an end and a padding token."""

    corpus = [*ZEN_TRAIN, *ZEN_TEST] * 4 + ["user assistant system The answer is 0123456789."]
    tokenizer = build_bpe_tokenizer(corpus, vocab_size=400)
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _write_zen(folder: Path) -> None:
    from datasets import Dataset

    configs = {
        "standard_prompt_only": lambda texts: {"prompt": list(texts)},
        "conversational_prompt_only": lambda texts: {"prompt": [[{"role": "user", "content": t}] for t in texts]},
    }
    yaml = ["---", "configs:"]
    for name, columns in configs.items():
        yaml += [f"- config_name: {name}", "  data_files:"]
        for split, texts in (("train", ZEN_TRAIN), ("test", ZEN_TEST)):
            relative = f"{name}/{split}.parquet"
            Dataset.from_dict(columns(texts)).to_parquet(str(folder / relative))
            yaml += [f"  - split: {split}", f"    path: {relative}"]
    (folder / "README.md").write_text("\n".join([*yaml, "---", "Offline stand-in for TRL's zen test dataset.", ""]))


def build_standins(root: str | Path, *, seed: int = 0) -> Path:
    """Write the stand-ins under ``root/trl-internal-testing/`` (idempotent: an existing complete folder is kept);
    return ``root``. Run TRL's tests with ``root`` as the working directory."""
    import torch
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    root = Path(root)
    org = root / ORG
    marker = org / "standins.json"
    names = [*CAUSAL_LMS, *SEQUENCE_CLASSIFIERS, "zen"]
    if marker.exists() and json.loads(marker.read_text()).get("names") == names:
        return root
    tokenizer = build_tokenizer()
    for name, model_class, labels in [
        *((n, LlamaForCausalLM, None) for n in CAUSAL_LMS),
        *((n, LlamaForSequenceClassification, 1) for n in SEQUENCE_CLASSIFIERS),
    ]:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            extra = {} if labels is None else {"num_labels": labels}
            config = tiny_config(
                tokenizer, hidden_size=32, num_heads=4, num_key_value_heads=2, max_position_embeddings=1024, **extra
            )
            model = model_class(config)
        if labels is None:
            model.generation_config.pad_token_id = tokenizer.pad_token_id
            model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(org / name)
        tokenizer.save_pretrained(org / name)
    (org / "zen").mkdir(parents=True, exist_ok=True)
    for config_name in ("standard_prompt_only", "conversational_prompt_only"):
        (org / "zen" / config_name).mkdir(exist_ok=True)
    _write_zen(org / "zen")
    marker.write_text(json.dumps({"names": names}))
    return root
