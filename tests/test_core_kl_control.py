import math

import pytest

from trl_grpo_ext.core import AdaptiveKLController


def make(**kw):
    args = dict(init_beta=0.1, target=0.05, horizon=100, beta_min=0.01, beta_max=1.0)
    args.update(kw)
    return AdaptiveKLController(args.pop("init_beta"), args.pop("target"), args.pop("horizon"), **args)


def test_hand_computed_updates():
    ctl = make()
    # KL = 0.06: e = 0.06/0.05 - 1 = 0.2 -> beta = 0.1 * (1 + 0.2 * 10 / 100) = 0.102
    assert ctl.update(0.06, n_steps=10) == pytest.approx(0.102)
    # KL = 0.04: e = -0.2 -> 0.102 * (1 - 0.02) = 0.09996
    assert ctl.update(0.04, n_steps=10) == pytest.approx(0.09996)
    # KL = 0.5: e clipped to 0.2
    assert ctl.update(0.5, n_steps=50) == pytest.approx(0.09996 * 1.1)
    # KL = 0.05 on target: no change
    before = ctl.value
    assert ctl.update(0.05, n_steps=50) == pytest.approx(before)
    assert ctl.num_updates == 4


def test_clamps():
    ctl = make(init_beta=0.011, beta_min=0.01)
    for _ in range(50):
        ctl.update(0.0, n_steps=100)
    assert ctl.value == 0.01
    ctl = make(init_beta=0.9)
    for _ in range(50):
        ctl.update(10.0, n_steps=100)
    assert ctl.value == 1.0


def test_non_finite_kl_keeps_beta():
    ctl = make()
    assert ctl.update(math.nan, n_steps=10) == 0.1
    assert ctl.update(math.inf, n_steps=10) == 0.1
    assert ctl.num_updates == 0


def test_state_round_trip_continues_trajectory():
    a = make()
    for kl in (0.2, 0.01, 0.07):
        a.update(kl, n_steps=16)
    b = make()
    b.load_state_dict(a.state_dict())
    for kl in (0.3, 0.02):
        assert b.update(kl, n_steps=16) == a.update(kl, n_steps=16)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"beta_min": 0.0}, "beta_min must be > 0"),
        ({"beta_max": 0.001}, "beta_max"),
        ({"init_beta": 0.0}, "init_beta"),
        ({"target": 0.0}, "target"),
        ({"horizon": -1}, "horizon"),
    ],
)
def test_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        make(**kw)
