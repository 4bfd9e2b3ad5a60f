"""With every extension off, GRPOExtTrainer is GRPOTrainer: same advantages, losses and weights."""

import pytest
import torch
from conftest import last_logs
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from trl_grpo_ext import GRPOExtTrainer


@pytest.mark.parametrize("loss_type, beta", [("dapo", 0.04), ("grpo", 0.0)])
def test_all_off_is_grpo_trainer(make_trainer, tiny_model_path, loss_type, beta):
    runs = {}
    for name, cls, cfg in [("trl", GRPOTrainer, GRPOConfig), ("ext", GRPOExtTrainer, None)]:
        kwargs = dict(loss_type=loss_type, beta=beta, max_steps=3, num_iterations=1)
        trainer = make_trainer(cls=cls, config_cls=cfg, **kwargs) if cfg else make_trainer(cls=cls, **kwargs)
        trainer.train()
        runs[name] = (
            trainer,
            [h["loss"] for h in last_logs(trainer)],
            list(trainer._logs["advantages"]),
            {k: v.detach().clone() for k, v in trainer.model.named_parameters()},
        )
    (_, loss_a, adv_a, params_a), (ext, loss_b, adv_b, params_b) = runs["trl"], runs["ext"]
    assert ext.extensions.keys() == {"advantage_estimator"}
    assert len(loss_a) == 3
    assert loss_a == loss_b
    torch.testing.assert_close(torch.tensor(adv_a), torch.tensor(adv_b))
    for name, value in params_a.items():
        torch.testing.assert_close(value, params_b[name], msg=name)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert any(not torch.equal(v, params_b[k]) for k, v in initial.named_parameters())  # training moved the weights
