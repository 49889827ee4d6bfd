"""Generation settings around a rollout for :class:`~gigpo_trl.trainer.GiGPOTrainer` (a mixin): ZeRO-3 parameter
gathering once per collect instead of once per turn, and evaluation sampling (temperature, eval mode)."""

from __future__ import annotations

import contextlib

from .numerics import unwrap_for_generation
from .vllm_glue import eval_generation_kwargs


class GenerationContextMixin:
    """Context managers entered around :meth:`RolloutCollector.collect` by the trainer."""

    @contextlib.contextmanager
    def _generation_params_gathered(self):
        """ZeRO-3 with transformers generation: gather the sharded parameters once for the whole rollout.

        TRL's ``_generate_single_turn`` enters ``unwrap_model_for_generation`` (a full parameter gather) on every
        call, i.e. once per turn. Here the same context is entered once around the collect, and
        ``ds3_gather_for_generation`` is off inside it, so each turn's call takes the already-gathered, hook-free
        model as it is. No effect with vLLM, without ZeRO-3, or when ``ds3_gather_for_generation`` is already off.
        """
        plugin = self.accelerator.state.deepspeed_plugin
        if self.use_vllm or plugin is None or plugin.zero_stage != 3 or not self.args.ds3_gather_for_generation:
            yield
            return
        with unwrap_for_generation(  # TRL's unwrap, its hooks restored also when the collect raises
            self.model_wrapped, self.accelerator, gather_deepspeed3_params=True,
            gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
        ):
            self.args.ds3_gather_for_generation = False
            try:
                yield
            finally:
                self.args.ds3_gather_for_generation = True

    @contextlib.contextmanager
    def _eval_sampling(self):
        """Sample at ``eval_temperature`` (0 = greedy) with the model in eval mode (dropout off) for the duration of
        the block; the previous mode and sampling settings come back afterwards, also when the block raises. With
        vLLM, ``generation_kwargs`` keys that would override the evaluation's sampling are left out meanwhile
        (:func:`gigpo_trl.vllm_glue.eval_generation_kwargs`)."""
        temperature = self.args.eval_temperature
        saved = (self.generation_config.do_sample, self.generation_config.temperature,
                 dict(self.generation_kwargs)) if hasattr(self, "generation_config") else None
        vg = self.vllm_generation if self.use_vllm else None
        saved_vllm = (vg.temperature, vg.generation_kwargs) if vg is not None else None
        was_training = self.model.training
        try:
            self.model.eval()
            if saved is not None:
                greedy = temperature == 0.0
                self.generation_config.do_sample = not greedy
                self.generation_kwargs["do_sample"] = not greedy
                if not greedy:
                    self.generation_config.temperature = temperature
                    self.generation_kwargs["temperature"] = temperature
            if vg is not None:  # TRL's VLLMClient / SamplingParams let generation_kwargs override the temperature
                vg.temperature = temperature
                vg.generation_kwargs = eval_generation_kwargs(saved_vllm[1], temperature)
            yield
        finally:
            if saved is not None:
                self.generation_config.do_sample, self.generation_config.temperature = saved[0], saved[1]
                self.generation_kwargs.clear()
                self.generation_kwargs.update(saved[2])
            if vg is not None:
                vg.temperature, vg.generation_kwargs = saved_vllm
            self.model.train(was_training)
