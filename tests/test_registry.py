import pytest

from trl_grpo_ext.core import Registry
from trl_grpo_ext.families import ADVANTAGE_ESTIMATORS, KL_CONTROLLERS, TOKEN_CLIPS, registry_for


def test_register_get_and_duplicate_guard():
    reg = Registry("widget")

    @reg.register("a")
    def a():
        return 1

    assert reg.get("a") is a and "a" in reg and reg.names() == ["a"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 2)
    reg.register("a", override=True)(lambda: 3)
    assert reg.get("a")() == 3
    with pytest.raises(ValueError, match=r"Unknown widget 'b'\. Valid names: a"):
        reg.get("b")
    with pytest.raises(ValueError, match="non-empty"):
        reg.register("")


def test_builtin_family_names():
    assert ADVANTAGE_ESTIMATORS.names() == ["grpo", "prm"]
    assert TOKEN_CLIPS.names() == ["clip_cov", "kl_cov", "none"]
    assert KL_CONTROLLERS.names() == ["adaptive", "diversity", "fixed"]
    assert registry_for("sample_filter").names() == [
        "none",
        "best_of_n",
        "best_random",
        "best_worst",
        "nonzero_std",
    ]
