"""Train a token-classification PRM in TRL's stepwise-supervision format.

TRL's ``PRMTrainer`` (``trl.experimental.prm``) was removed in TRL 1.14; PRMs it trained still load as plain
``AutoModelForTokenClassification`` models and :class:`~trl_grpo_ext.prm.TokenClassificationPRM` scores them. This
module keeps the same data layout so that such a PRM can still be trained on TRL 1.16 (the tests train a tiny one):
rows with ``prompt`` (str), ``completions`` (list of step texts) and ``labels`` (list of bools, one per step), tokenized
as ``[bos] + prompt + step_1 + separator + ...`` with the step label on the last token of each ``step + separator``
and -100 elsewhere.
"""

from __future__ import annotations

import copy
from typing import Any


def tokenize_prm_example(
    example: dict[str, Any], tokenizer, *, separator: str = "\n", max_length: int | None = None
) -> dict[str, list[int]]:
    """``input_ids`` and ``labels`` of one stepwise-supervision row (see the module docstring)."""
    if len(example["completions"]) != len(example["labels"]):
        raise ValueError(
            f"A PRM row has {len(example['completions'])} steps but {len(example['labels'])} labels: give one label "
            "per step."
        )
    ids = ([tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []) + tokenizer.encode(
        example["prompt"], add_special_tokens=False
    )
    labels = [-100] * len(ids)
    separator_ids = tokenizer.encode(separator, add_special_tokens=False)
    for step, label in zip(example["completions"], example["labels"], strict=True):
        piece = tokenizer.encode(step, add_special_tokens=False) + separator_ids
        ids += piece
        labels += [-100] * (len(piece) - 1) + [int(label)]
    if max_length is not None:
        ids, labels = ids[:max_length], labels[:max_length]
    return {"input_ids": ids, "labels": labels}


def train_prm(
    model,
    tokenizer,
    dataset,
    output_dir: str,
    *,
    separator: str = "\n",
    num_train_epochs: float = 1.0,
    learning_rate: float = 1e-3,
    per_device_train_batch_size: int = 16,
    max_length: int | None = None,
    seed: int = 0,
    **training_kwargs,
):
    """Fine-tune ``model`` (an ``AutoModelForTokenClassification`` with 2 labels) on stepwise-supervision rows.

    Returns the ``transformers.Trainer`` after training; the model is saved to ``output_dir`` with its tokenizer.
    """
    from transformers import DataCollatorForTokenClassification, Trainer, TrainingArguments

    tokenized = dataset.map(
        lambda row: tokenize_prm_example(row, tokenizer, separator=separator, max_length=max_length),
        remove_columns=dataset.column_names,
    )
    args = TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=num_train_epochs,
        learning_rate=learning_rate,
        per_device_train_batch_size=per_device_train_batch_size,
        seed=seed,
        report_to="none",
        save_strategy="no",
        **training_kwargs,
    )
    # Right padding: a causal PRM then sees every sequence at positions 0..L-1, as when it scores (see sources.py).
    collator_tokenizer = copy.copy(tokenizer)
    collator_tokenizer.padding_side = "right"
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=tokenized,
        data_collator=DataCollatorForTokenClassification(collator_tokenizer),
    )
    trainer.train()
    trainer.save_model(output_dir)
    tokenizer.save_pretrained(output_dir)
    return trainer
