"""Test-only: run the sharded engines users scale with (FSDP2, DeepSpeed ZeRO-3) on this CPU machine, 2 gloo processes.

``engine_config(name)`` gives the ``GRPOExtConfig`` fields that select an engine; ``enable(name)`` patches what must be
patched before the trainer is built. Nothing here is used by the library.
"""

from __future__ import annotations

import functools
import json
import os

ENGINES = ("ddp", "fsdp2", "zero2", "zero3")


def _shard_on_cpu() -> None:
    """accelerate 1.16 ignores an FSDP plugin on a machine without an accelerator: ``AcceleratorState.__init__`` only
    selects ``DistributedType.FSDP`` from the MULTI_GPU-like types, so a CPU run (MULTI_CPU, gloo) silently trains
    plain DDP with an FSDP config, and ``--use_fsdp --cpu`` is refused. This wraps ``__init__`` to make the same choice
    for MULTI_CPU: FSDP2's ``fully_shard`` then really splits the parameters across the gloo processes."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    if getattr(AcceleratorState.__init__, "_cpu_fsdp_shim", False):
        return
    original = AcceleratorState.__init__

    @functools.wraps(original)
    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    init._cpu_fsdp_shim = True
    AcceleratorState.__init__ = init


def _deepspeed_on_cpu() -> None:
    """accelerate 1.16 refuses DeepSpeed with ``cpu=True``, and with ``cpu=False`` on a machine without an accelerator
    ``PartialState`` finds no device backend: DeepSpeed initialises the 2-process gloo group, but accelerate records
    ``num_processes=1`` (its gathers then expect one tensor and fail). This wraps ``PartialState.__init__`` to read the
    world from the process group DeepSpeed created; DeepSpeed's own CPU accelerator (``DS_ACCELERATOR=cpu``) does the
    rest, ZeRO-3 partitioning included."""
    import torch.distributed as dist
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    if getattr(PartialState.__init__, "_cpu_deepspeed_shim", False):
        return
    original = PartialState.__init__

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.distributed_type == DistributedType.DEEPSPEED and dist.is_initialized() and self.num_processes == 1:
            self.num_processes = dist.get_world_size()
            self.process_index = dist.get_rank()
            self.local_process_index = int(os.environ.get("LOCAL_RANK", self.process_index))
            self.backend = dist.get_backend()

    init._cpu_deepspeed_shim = True
    PartialState.__init__ = init


def patch_accelerate_for_cpu() -> None:
    """Both patches, for a script started by ``accelerate launch`` with a sharded engine's config (the engine comes
    from accelerate's environment variables; each patch acts only when its engine is selected)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    _shard_on_cpu()
    _deepspeed_on_cpu()


def zero_config(path: str, stage: int) -> str:
    """A DeepSpeed ZeRO config; at stage 3 it really partitions a tiny model (no parameter kept whole by the
    persistence threshold)."""
    zero = {"stage": stage}
    if stage == 3:
        zero.update(
            stage3_param_persistence_threshold=0,
            stage3_max_live_parameters=0,
            stage3_prefetch_bucket_size=0,
            stage3_gather_16bit_weights_on_model_save=True,
        )
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "zero_optimization": zero,
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
    }
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def enable(engine: str, out_dir: str) -> dict:
    """Prepare this process for ``engine``; return the config fields that select it."""
    if engine == "ddp":
        return dict(use_cpu=True)
    if engine == "fsdp2":
        _shard_on_cpu()
        return dict(use_cpu=True, fsdp="full_shard", fsdp_config={"version": 2, "reshard_after_forward": True})
    if engine in ("zero2", "zero3"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        _deepspeed_on_cpu()
        # accelerate refuses DeepSpeed with cpu=True; on a machine without an accelerator the device is the CPU anyway
        path = os.path.join(out_dir, f"{engine}_{os.getpid()}.json")
        return dict(use_cpu=False, deepspeed=zero_config(path, int(engine[-1])))
    raise ValueError(f"unknown engine {engine!r}; use one of {ENGINES}")


def is_sharded(trainer) -> bool:
    """Whether the policy's parameters are really split across processes (each holds a part)."""
    engine = trainer.accelerator.distributed_type.name
    if engine == "FSDP":
        from torch.distributed.tensor import DTensor

        return any(isinstance(p, DTensor) for p in trainer.model.parameters())
    if engine == "DEEPSPEED":
        params = list(trainer.model.parameters())
        return all(hasattr(p, "ds_tensor") and p.ds_tensor.numel() < p.ds_numel for p in params)
    return False


class CollectiveLog:
    """Every collective call and every model forward of this process, in order, for the rule "every process runs the
    same forwards and collectives in every step, whatever its data" (docs/index.md): under DDP a forward is local and
    a mismatch goes unnoticed, under FSDP / ZeRO-3 it crashes or deadlocks. Comparing the logs of two DDP processes
    finds the mismatch without a sharded engine.

    A ``generate`` call is one event (transformers synchronises its token loop across processes under FSDP / ZeRO-3,
    so the number of token steps may differ); collectives are the ``torch.distributed`` functions accelerate and
    the plugin call.
    """

    COLLECTIVES = (
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "broadcast",
        "broadcast_object_list",
        "reduce_scatter_tensor",
        "gather",
        "scatter",
        "barrier",
    )

    def __init__(self):
        self.events: list[str] = []
        self._generating = 0

    def install(self, models: dict) -> CollectiveLog:
        import torch.distributed as dist
        from transformers.generation.utils import GenerationMixin

        for name in self.COLLECTIVES:
            original = getattr(dist, name)

            def wrapper(*args, _original=original, _name=name, **kwargs):
                if not self._generating:
                    self.events.append(_name)
                return _original(*args, **kwargs)

            setattr(dist, name, wrapper)
        generate = GenerationMixin.generate

        def logged_generate(model, *args, **kwargs):
            self.events.append("generate")
            self._generating += 1
            try:
                return generate(model, *args, **kwargs)
            finally:
                self._generating -= 1

        GenerationMixin.generate = logged_generate
        for label, model in models.items():
            model.register_forward_pre_hook(lambda *_, _label=label: self._forward(_label))
        return self

    def _forward(self, label: str) -> None:
        if not self._generating:
            self.events.append(f"forward:{label}")
