"""gigpo_trl/generation.py: the contexts around a rollout. CPU only. Through the trainer: evaluation sampling
(eval_sampling) in tests/test_trainer.py (test_evaluate_*), the ZeRO-3 gathering once per collect
(generation_params_gathered) in tests/test_distributed.py."""

from __future__ import annotations

import pytest


def test_generation_unwrap_exit_runs_when_the_block_raises(bf16_trainer):
    """TRL's unwrap re-enables gradient checkpointing (and, under ZeRO-3, re-adds the parameter hooks) after its
    yield; here that runs although the block raised."""
    from trl.models import unwrap_model_for_generation

    from gigpo_trl.generation import unwrap_for_generation

    trainer, _ = bf16_trainer
    model = trainer.model
    model.gradient_checkpointing_enable()
    try:
        with pytest.raises(KeyError):
            with unwrap_model_for_generation(model, trainer.accelerator):
                assert not model.is_gradient_checkpointing
                raise KeyError("inside the collect")
        assert not model.is_gradient_checkpointing  # TRL's own: left off
        model.gradient_checkpointing_enable()
        with pytest.raises(KeyError):
            with unwrap_for_generation(model, trainer.accelerator):
                assert not model.is_gradient_checkpointing
                raise KeyError("inside the collect")
        assert model.is_gradient_checkpointing
    finally:
        model.gradient_checkpointing_disable()
