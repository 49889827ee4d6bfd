"""GiGPOTrainer: TRL's GRPOTrainer with multi-turn rollouts and GiGPO advantages.

The subclass is glue, and this file is its spine, in the order of the paper's Algorithm 1: init → collect
(:class:`~gigpo_trl.rollout.collector.RolloutCollector`, generating through TRL's own generate dispatch) → advantages
(:func:`~gigpo_trl.advantage.compute_gigpo_advantages`) → batch (TRL's batch dict) → loss (TRL's, in token-budget
sub-batches) → evaluate. The other concerns live in their own modules, called from here with explicit arguments;
two are mixins because they override TRL / Trainer hooks:

- :mod:`gigpo_trl.forward.mixin` (mixin, ``compute_loss``, ``_get_per_token_logps_and_entropies``): the loss in
  sub-batches of at most ``max_tokens_per_microbatch`` tokens, forwards with shared prefixes and chains;
  :mod:`gigpo_trl.forward.grad_accumulation`: their fp32 gradient sums and the DeepSpeed step guard;
- :mod:`gigpo_trl.critic` (mixin, ``compute_loss``, ``_save``, ``_save_checkpoint``,
  ``_load_optimizer_and_scheduler``): ``estimator="ppo"``'s critic, GAE advantages, its loss, step and checkpoints;
- :mod:`gigpo_trl.checkpoint` (mixin, ``_save_checkpoint``, ``_save``, ``_push_from_checkpoint``,
  ``_init_training_state``, ``_load_optimizer_and_scheduler``, ``create_model_card``): rollout position in
  checkpoints, no step on a resume at ``max_steps``, token scrub, model card;
- :mod:`gigpo_trl.checks.inputs`: environment, dataset and prompt-limit checks at init;
- :mod:`gigpo_trl.rollout.dynamic_sampling`: DAPO's dynamic sampling of flat task groups;
- :mod:`gigpo_trl.generation.contexts`: ZeRO-3 gathering once per rollout, evaluation sampling;
- :mod:`gigpo_trl.generation.vllm_engine`: vLLM set-up; :mod:`gigpo_trl.generation.lora`: LoRA merges (in place
  around a rollout, out of place for the weight sync); :mod:`gigpo_trl.forward.importance`: the importance-sampling
  correction;
- :mod:`gigpo_trl.rollout.async_producer`: rollouts collected while the trainer optimises (``max_staleness > 0``);
- :mod:`gigpo_trl.generation.weight_sync`: the weights version that decides when vLLM receives the weights;
- :mod:`gigpo_trl.generation.server_weights`: server mode without CUDA, the weights through files the server reloads;
- :mod:`gigpo_trl.forward.positions`: positions from the attention mask (padding-invariant forwards);
- :mod:`gigpo_trl.records.rollout_metrics`: each rollout's metrics, gathered over processes and recorded for TRL's log;
- :mod:`gigpo_trl.forward.memory`: the init warning when the token budget's activations would not fit in free memory;
- :mod:`gigpo_trl.trl_compat`: every private attribute of TRL / transformers / accelerate that the package uses.
The optimizer, logging, checkpoint files, PEFT, DeepSpeed and vLLM paths stay TRL's.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from accelerate.utils import gather_object
from transformers import Trainer
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import use_adapter

from . import trl_compat
from .advantage import compute_gigpo_advantages
from .rollout.async_producer import AsyncRollouts
from .checkpoint import CheckpointMixin
from .critic import CriticMixin
from .checks.inputs import check_budget_aux_loss, check_chat_template, check_first_prompt, check_task_dataset, env_tasks
from .config import GiGPOConfig
from .rollout.dynamic_sampling import DynamicSampler
from .envs.adapters import resolve_envs
from .rollout.episodes import StepRow
from .advantage.finite import Screened, local_advantages, screened_advantages
from .advantage.keys import AdvantageKey, advantage_keys, estimator_columns
from .generation.contexts import eval_sampling, generation_params_gathered, kv_caches_for
from .generation.lora import lora_merged_for_generation
from .forward.grad_accumulation import DeepSpeedStepGuard
from .forward.host_memory import trim_around_decoder_layers
from .forward.importance import importance_ratio, sampling_logps, sampling_metrics
from .forward.memory import warn_if_budget_exceeds_memory
from .records.metrics import episode_metrics
from .models import disable_attention_dropout
from .observers import RolloutContext, RolloutObserver, notify, notify_scored
from .rollout.policy import GenerationPolicy, Policy
from .forward.positions import install_mask_positions
from .rollout.prompts import max_prompt_length
from .records.writer import RolloutRecorder
from .records.rollout_metrics import record_rollout_metrics
from .rollout.collector import RolloutCollector, build_collector
from .forward.mixin import ForwardMixin, max_over_ranks
from .forward.batch import row_batch
from .forward.trajectory_split import shuffle_generator, split_by_trajectories
from .generation.server_weights import file_sync_refusal, server_weight_sync_guard
from .generation.vllm_engine import (colocate_prefix_caching, install_cpu_colocate_sync, install_out_of_place_lora_sync,
                                     shutdown_engine_before_end_training, vllm_max_model_len)
from .generation.server_http import install_thread_sessions
from .generation.weight_sync import WeightsChangedCallback, WeightsVersion, sync_weights_if_changed

logger = logging.getLogger(__name__)


class GiGPOTrainer(CriticMixin, ForwardMixin, CheckpointMixin, GRPOTrainer):
    """Trainer for Group-in-Group Policy Optimization (GiGPO, arXiv 2505.10978) of multi-turn LLM agents.

    Each training iteration rolls out ``num_generations`` episodes per task (same seed, so a group starts from the
    same state) for up to ``max_turns`` turns; every (environment, turn) becomes one training row whose advantage
    is A = A_E + ω·A_S (episode-level plus anchor-state step-level advantage). ``step_advantage_weight=0`` is GRPO.

    Args:
        model (`str` or `PreTrainedModel` or `PeftModel`): the policy; a path/Hub id is loaded by TRL.
        env: an environment class or zero-argument factory (see :mod:`gigpo_trl.envs.base`; a TRL
            ``environment_factory`` class or an OpenEnv ``Environment`` is wrapped, see :mod:`gigpo_trl.envs.adapters`),
            a registered name (``"webshop"``, ``"alfworld"``, ``"frozenlake"``, ``"sokoban"``, ``"corridor"``), or a
            dict ``{name: env}`` routed by the task dataset's ``env`` column.
        args (`GiGPOConfig`, *optional*): training configuration.
        train_dataset (`datasets.Dataset`, *optional*): tasks, columns ``task``, ``seed`` (optional ``task_type``,
            ``env``). Default: the environment's ``tasks("train")``.
        eval_dataset (`datasets.Dataset`, *optional*): tasks for :meth:`evaluate`. Default: ``tasks("eval")``.
        processing_class (`PreTrainedTokenizerBase`, *optional*): tokenizer with a chat template.
        peft_config (`peft.PeftConfig`, *optional*): LoRA etc., handled by TRL.
        callbacks (`list[TrainerCallback]`, *optional*): as for `transformers.Trainer`.
        optimizers (`tuple`, *optional*): as for `transformers.Trainer`.

    Raises:
        ValueError: bad ``env``, a dataset without a ``task`` column or with fewer tasks than one generation batch
            needs, a tokenizer without a chat template, a first-turn prompt longer than ``max_prompt_length``.
        TypeError: ``args`` is not a ``GiGPOConfig``; the env's ``reset`` on the first training task returns a
            non-``str`` observation without an ``anchor_state`` hook (or no ``(observation, info)`` pair).
        RuntimeError: the env's ``reset`` raises on the first training task (each env is reset once at init).

    Example:

    ```python
    from gigpo_trl import GiGPOConfig, GiGPOTrainer
    from gigpo_trl.envs.frozenlake import FrozenLakeEnv

    trainer = GiGPOTrainer(
        "path/to/model",
        env=FrozenLakeEnv,
        args=GiGPOConfig(output_dir="out", num_generations=4, per_device_train_batch_size=8, max_turns=8),
    )
    trainer.train()
    ```
    """

    _tag_names = ["trl", "gigpo"]
    _name = "GiGPO"
    # The paper TRL's model card cites (GRPOTrainer's own would cite DeepSeekMath).
    _paper = {
        "title": "Group-in-Group Policy Optimization for LLM Agent Training",
        "id": "2505.10978",
        "citation": (
            "@article{feng2025gigpo,\n"
            "    title   = {{Group-in-Group Policy Optimization for LLM Agent Training}},\n"
            "    author  = {Lang Feng and Zhenghai Xue and Tingcong Liu and Bo An},\n"
            "    year    = 2025,\n"
            "    eprint  = {arXiv:2505.10978},\n"
            "}"
        ),
    }

    def __init__(
        self,
        model,
        env: Any = None,
        args: GiGPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        peft_config=None,
        callbacks=None,
        optimizers=(None, None),
    ):
        self.env_factories = resolve_envs(env)
        if args is None:
            args = GiGPOConfig(output_dir="gigpo-output")
        if not isinstance(args, GiGPOConfig):
            raise TypeError(f"args must be a GiGPOConfig, got {type(args).__name__}")
        self._probe_env = next(iter(self.env_factories.values()))()
        if train_dataset is None:
            train_dataset = env_tasks(self._probe_env, "train", "train_dataset")
        check_task_dataset(train_dataset, args, "train_dataset")
        with server_weight_sync_guard(args) as server_sync, colocate_prefix_caching(args):  # see vllm_glue
            super().__init__(
                model=model,
                reward_funcs=[trl_compat.env_reward],
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                processing_class=processing_class,
                peft_config=peft_config,
                callbacks=callbacks,
                optimizers=optimizers,
            )
        # server mode without CUDA: weights go through files (gigpo_trl.generation.server_weights) unless refused
        self._vllm_no_sync_message = server_sync.message or file_sync_refusal(self, server_sync)
        if self.use_vllm:
            install_cpu_colocate_sync(self.vllm_generation)  # colocate on vLLM's CPU backend
            if args.vllm_mode == "server":  # one HTTP session per thread, a timeout on every request
                install_thread_sessions(getattr(self.vllm_generation, "vllm_client", None), args.async_rollout_timeout)
            install_out_of_place_lora_sync(self.vllm_generation)  # LoRA: never write the base weights
            shutdown_engine_before_end_training(self)
        self.weights_version = WeightsVersion()  # vLLM receives the weights when this moved (gigpo_trl.generation.weight_sync)
        self.add_callback(WeightsChangedCallback(self.weights_version))  # every optimizer step
        check_budget_aux_loss(args, self.aux_loss_enabled, self.router_aux_loss_coef)
        warn_if_budget_exceeds_memory(self.model, args, self.accelerator.device)  # budget x memory/token > free
        if self.accelerator.device.type == "cpu":  # glibc keeps each layer's freed blocks resident otherwise
            trim_around_decoder_layers(self.model)
        if args.disable_dropout:
            disable_attention_dropout(self.model)
        for m in (self.model, self.ref_model):  # positions from the attention mask: padding-invariant forwards
            if m is not None:
                install_mask_positions(m)
        self.add_callback(DeepSpeedStepGuard(lambda: self.model_wrapped))  # one engine step per optimizer step
        check_chat_template(trl_compat.tokenizer(self))
        self.rollout_recorder = RolloutRecorder(args, self.accelerator.num_processes)  # writes with rollout_records
        self.rollout_observers: list[RolloutObserver] = [self.rollout_recorder]  # shared with the collectors
        context = (vllm_max_model_len(self) if self.use_vllm else None) or getattr(  # vLLM's limit first: it rejects
            self.model.config.get_text_config(), "max_position_embeddings", None)  # longer requests
        self.prompt_limit = max_prompt_length(context, args.max_prompt_length, self.max_completion_length)
        self.collector = self.make_collector(  # the probe env built above serves as template: not built twice
            progress=self.accelerator.is_main_process and not args.disable_tqdm,
            templates={next(iter(self.env_factories)): self._probe_env})
        check_first_prompt(self.collector, self.env_factories, train_dataset)
        self.dynamic_sampler = DynamicSampler(
            self.collector, self.train_dataset, self._advantages, args.max_dynamic_sampling_rounds,
            keep_step_signal=args.dynamic_sampling_keep_step_signal and args.step_advantage_weight != 0,
            rank=self.accelerator.process_index, gather=gather_object if self.accelerator.num_processes > 1 else None,
        ) if args.dynamic_sampling else None
        self.async_rollouts = AsyncRollouts(self, args.max_staleness, args.async_rollout_timeout) if (
            args.max_staleness) else None  # rollouts collected while the trainer optimises (gigpo_trl.rollout.async_producer)
        self.setup_critic()  # estimator="ppo": the critic and its optimizer (gigpo_trl.critic)

    def make_collector(self, policy: Policy | None = None, env_factories=None, templates=None,
                       progress: bool = False) -> RolloutCollector:
        """A collector of this run (:func:`~gigpo_trl.rollout.collector.build_collector`, TRL's chat templating, the prompt limit,
        :attr:`rollout_observers`); default policy: the model through TRL's generation; default envs: the trainer's."""
        if policy is None:
            decode = trl_compat.ChatTemplating(self).decode  # under the tokenizer's lock (the producer's thread)
            policy = GenerationPolicy(self.generate_turn, decode, self._sync_max if self.accelerator.num_processes > 1
                                      else None, kv_caches=kv_caches_for(self))
        return build_collector(self.args, env_factories or self.env_factories, policy,
                               trl_compat.ChatTemplating(self), self.prompt_limit, progress,
                               templates, self.rollout_observers)

    def add_rollout_observer(self, observer: RolloutObserver) -> None:
        """Register a :class:`~gigpo_trl.observers.RolloutObserver` (in :attr:`rollout_observers`): it sees every
        rollout of the trainer's collectors, advantage computation and evaluation (see :mod:`gigpo_trl.observers`)."""
        self.rollout_observers.append(observer)

    def train(self, *args, **kwargs):
        """``Trainer.train``; the env pools (worker processes) are closed at the end, also when training raises.
        A later :meth:`evaluate` or ``train`` starts fresh ones. Refused up front (``RuntimeError``) in vLLM server
        mode without CUDA when the trained weights cannot reach the server (see ``gigpo_trl.generation.server_weights``)."""
        if self._vllm_no_sync_message is not None:  # refuse before any rollout, not at the first weight sync
            raise RuntimeError(self._vllm_no_sync_message)
        try:
            return super().train(*args, **kwargs)
        finally:
            self.collector.close_pools()
            if self.async_rollouts is not None:
                self.async_rollouts.close()

    # ------------------------------------------------------------------ small helpers
    def _set_signature_columns_if_needed(self):  # TRL hook (see trl_compat): the task columns the collector reads
        trl_compat.set_signature_columns(self, ["task", "seed", "task_type", "env", "prompt"])

    def mark_weights_changed(self) -> None:
        """Tell the trainer that its trainable weights were written outside its own optimizer steps (the expert
        warm-up, a loaded adapter or checkpoint): the next generate call, rollout or evaluation, pushes them to
        vLLM first. Raises ``RuntimeError`` in vLLM server mode without CUDA when they cannot reach the server
        (see ``gigpo_trl.generation.server_weights``)."""
        if self._vllm_no_sync_message is not None:
            raise RuntimeError(self._vllm_no_sync_message)
        self.weights_version.bump()

    def push_weights_if_changed(self) -> bool:
        """Push the weights to vLLM if they changed since it last got them (:func:`~gigpo_trl.generation.weight_sync.
        sync_weights_if_changed`; server mode without CUDA: only the version moves); whether it pushed. Trainer's
        thread only: pushes happen between optimizer steps."""
        timeout = self.args.async_rollout_timeout if self.args.max_staleness else None  # the producer's lock
        return sync_weights_if_changed(self, self.weights_version, can_push=self._vllm_no_sync_message is None,
                                       timeout=timeout)

    def generate_turn(self, prompt_ids: list[list[int]], vllm_generation=None):
        """The one-turn generate: ``(completion_ids, sampling log-probs or None)``, one list per prompt of
        ``prompt_ids``. Through TRL's dispatch, after :meth:`push_weights_if_changed` with vLLM; with a
        ``vllm_generation`` (the asynchronous producer's copy of TRL's) through that one, without a push."""
        if vllm_generation is not None:
            return trl_compat.vllm_generate(vllm_generation, prompt_ids)
        if self.use_vllm:  # weights changed since vLLM last got them: push them first (once)
            self.push_weights_if_changed()
        return trl_compat.generate_single_turn(self, prompt_ids)

    def _eval_sampling(self):
        """:func:`~gigpo_trl.generation.contexts.eval_sampling` at ``eval_temperature`` with this trainer's generation
        settings (transformers' or vLLM's)."""
        return eval_sampling(self.model, self.args.eval_temperature, getattr(self, "generation_config", None),
                             getattr(self, "generation_kwargs", None), self.vllm_generation if self.use_vllm else None)

    def _rollout_context(self, mode: str, name: str | None = None) -> RolloutContext:
        """The observers' context of a rollout starting now (``iteration``: TRL's micro-steps, restored on resume)."""
        iteration = self.args.rollout_index(trl_compat.rollout_position(self)[0]) + 1 if mode == "train" else None
        return RolloutContext(mode, self.accelerator.process_index, self.state.global_step, iteration, name)

    def _sync_max(self, local: int) -> int:  # the largest count over processes (GenerationPolicy.turn_size)
        return max_over_ranks(self.accelerator, local)

    def group_ids(self, inputs: list[dict]) -> list[str]:
        """The task group of each of this rank's task rows ``inputs`` (as TRL's sampler hands them out)."""
        # RepeatSampler yields each task num_generations times in a row over the global generation batch, and
        # ranks hold consecutive slices of it: the global position // num_generations is the group.
        offset = self.accelerator.process_index * len(inputs)
        return [f"{(offset + i) // self.num_generations}:{x['task']!r}:{x.get('seed')!r}" for i, x in
                enumerate(inputs)]

    # ------------------------------------------------------------------ collect → advantages → batch (TRL's hook)
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """TRL's hook (``GRPOTrainer._prepare_inputs``): this rank's task rows (one per episode, each task
        ``num_generations`` times in a row) → one episode each → A = A_E + ω·A_S per (episode, turn) row, computed
        over all ranks' rows → TRL's batch dict of N rows (``prompt_ids`` (N, P), ``completion_ids`` (N, C),
        ``advantages`` (N,), …; N is this rank's row count padded with zero-mask filler rows, see
        :meth:`_rows_to_batch`)."""
        mode, rank = "train" if self.model.training else "eval", self.accelerator.process_index
        t0 = time.perf_counter()
        group_ids = self.group_ids(inputs)
        context = self._rollout_context(mode)
        with (generation_params_gathered(self.model_wrapped, self.accelerator, self.args, self.use_vllm),
              lora_merged_for_generation(self.model_wrapped, self.accelerator, self.use_vllm)):
            batch = (self.async_rollouts.take(inputs, group_ids, context) if self.async_rollouts and mode == "train"
                     else self.collector.collect(inputs, group_ids, trajectory_prefix=rank, context=context))
            if self.dynamic_sampler is not None and mode == "train":
                batch = self.dynamic_sampler.resample(list(inputs), group_ids, batch, self.state.global_step,
                                                      trl_compat.metrics(self, "train"), context)
        rows, t_rollout = batch.rows, time.perf_counter() - t0

        # GiGPO advantages over whole task groups: gather every rank's row keys, compute, keep the local slice.
        t1 = time.perf_counter()
        keys = advantage_keys(rows)
        all_keys = gather_object(keys) if self.accelerator.num_processes > 1 else keys
        counts = gather_object([len(rows)]) if self.accelerator.num_processes > 1 else [len(rows)]
        start = sum(counts[:rank])
        # a non-finite reward, return or advantage raises here, naming its rows, or (drop_nonfinite_rows) its
        # trajectory is left out of the estimate and zero-masked
        screened = screened_advantages(all_keys, self._advantages, self.args.drop_nonfinite_rows) if all_keys \
            else Screened(None, None, None)
        advantages, keep = local_advantages(screened, start, len(rows))
        t_adv = time.perf_counter() - t1

        if mode == "train":  # forward/tokens_per_unique_token counts the iteration against its generation batch
            self.begin_iteration_count([r.prompt_ids + r.completion_ids for r, k in zip(rows, keep) if k]
                                       if keep is not None else [r.prompt_ids + r.completion_ids for r in rows])
        output = self._rows_to_batch(rows, advantages, counts, mode, keep)
        self.critic_advantages(rows, output)  # estimator="ppo": GAE from the critic's values (gigpo_trl.critic)
        notify_scored(self.rollout_observers, batch, screened.result, output, replace(context, row_start=start))
        record_rollout_metrics(self, mode, batch, screened.estimated, advantages, t_rollout, t_adv)
        return output

    # ------------------------------------------------------------------ advantages
    def _advantages(self, keys: list[AdvantageKey]):
        """:func:`compute_gigpo_advantages` over rows given as :class:`~gigpo_trl.advantage.keys.AdvantageKey`s (all
        ranks' rows, in order), with this config's estimator settings."""
        return compute_gigpo_advantages(**estimator_columns(keys), settings=self.args.estimator_settings)

    # ------------------------------------------------------------------ batch
    def _rows_to_batch(self, rows: list[StepRow], advantages: np.ndarray, counts: list[int], mode: str,
                       keep: np.ndarray | None = None) -> dict:
        """Pad the rows into TRL's batch dict (:func:`~gigpo_trl.forward.batch.row_batch`); zero-mask filler rows make
        every rank hold the same multiple of steps_per_generation rows (``split_tensor_dict`` drops remainders). Rows
        where ``keep`` is false are zero-masked like filler (dropped without changing any rank's row count)."""
        spg = self.args.steps_per_generation if mode == "train" else 1
        target = max(spg, math.ceil(max(counts) / spg) * spg)
        keep = [True] * len(rows) if keep is None else [bool(k) for k in keep]
        pad_id = trl_compat.tokenizer(self).pad_token_id
        output = row_batch(
            [r.prompt_ids for r in rows], [r.completion_ids for r in rows], keep, list(advantages),
            [r.trajectory_id for r in rows], [r.group_id for r in rows], target, eos_id=self.eos_token_ids[0],
            pad_id=pad_id, device=self.accelerator.device, pad_to_multiple_of=self.pad_to_multiple_of,
            truncation_ends=[*self.eos_token_ids, pad_id] if self.mask_truncated_completions else None)
        output["num_items_in_batch"] = self.accelerator.gather(output["completion_mask"].sum()).sum()
        logps_list = [r.sampling_logps for r in rows] + [[0.0]] * (target - len(rows))
        prompt_ids, prompt_mask = output["prompt_ids"], output["prompt_mask"]
        completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
        output.update(self._score_logps(prompt_ids, prompt_mask, completion_ids, completion_mask, logps_list, mode,
                                        real_rows=len(rows)))
        return output

    def _score_logps(self, prompt_ids, prompt_mask, completion_ids, completion_mask, logps_list, mode,
                     real_rows: int | None = None) -> dict:
        """The old / reference / sampling log-probs and vLLM importance-sampling ratio, under the same conditions
        as ``GRPOTrainer._generate_and_score_completions`` computes them. Rows from ``real_rows`` on are filler."""
        out: dict[str, torch.Tensor] = {}
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        is_correction = self.use_vllm and self.vllm_importance_sampling_correction
        have_sampling = all(lp is not None for lp in logps_list)
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            if self.args.rollout_spans_optimizer_steps or is_correction:
                out["old_per_token_logps"] = self._score_in_budget(
                    self.model, input_ids, attention_mask, logits_to_keep, batch_size, real_rows
                )
            if self.beta != 0.0:
                if self.ref_model is not None:
                    ref = self._score_in_budget(self.ref_model, input_ids, attention_mask, logits_to_keep, batch_size,
                                                real_rows)
                else:
                    unwrapped = self.accelerator.unwrap_model(self.model)
                    with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
                        ref = self._score_in_budget(self.model, input_ids, attention_mask, logits_to_keep,
                                                    batch_size, real_rows)
                out["ref_per_token_logps"] = ref
        if self.use_vllm and (have_sampling or is_correction):
            sampling = sampling_logps(logps_list, completion_ids)
            out["sampling_per_token_logps"] = sampling
            if is_correction:
                old, sampling_mode = out["old_per_token_logps"], self.vllm_importance_sampling_mode
                clip = (self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max)
                ratio = importance_ratio(old, sampling, completion_mask, sampling_mode, *clip)
                out["importance_sampling_ratio"] = ratio
                logged = trl_compat.metrics(self, mode)
                for key, value in sampling_metrics(old, sampling, ratio, completion_mask, sampling_mode,
                                                   self.accelerator.gather, clip).items():
                    logged[key].append(value)
        return out

    # ------------------------------------------------------------------ micro-batch → loss (TRL's hooks)
    def _prepare_inputs(self, generation_batch):
        """TRL's hook (``Trainer.training_step``, once per micro-step): the micro-batch of the buffered generation
        batch. In training with ``steps_per_generation`` > 1 and ``micro_batch_split="trajectory"``, TRL's buffering
        (:func:`trl_compat.buffered_micro_batch`) with the generation batch split by whole trajectories (:func:`~gigpo_trl.forward.trajectory_split.
        split_by_trajectories`, padded to the ranks' largest micro-batch) instead of TRL's row shuffle and split, so
        that trajectory chains stay in one forward (multimodal batches are not supported: no split by image grid);
        otherwise TRL's own. On an on-policy micro-step (:meth:`GiGPOConfig.is_on_policy_micro_step`) without
        ``old_per_token_logps``, so that TRL's ``_compute_loss`` takes the training forward's own (detached)
        log-probs as π_old and π/π_old is exactly 1. The stored values come from a scoring pass with other shapes
        (other padding, other sub-batches), whose bf16 rounding differs enough to clip tokens spuriously. vLLM's
        importance-sampling ratio, computed from the stored values at scoring time, is left as it is."""
        spg, micro_step = self.args.steps_per_generation, trl_compat.rollout_position(self)[0]
        if self.model.training and spg > 1 and self.args.micro_batch_split == "trajectory":
            inputs = trl_compat.buffered_micro_batch(self, generation_batch, lambda batch: split_by_trajectories(
                self._generate_and_score_completions(batch), spg,
                shuffle_generator(self.args.seed, self.args.rollout_index(micro_step)),
                self._sync_max if self.accelerator.num_processes > 1 else None))
        else:  # evaluation, one micro-batch per generation batch, or micro_batch_split="row": TRL's own path
            inputs = super()._prepare_inputs(generation_batch)
        if self.model.training and self.args.is_on_policy_micro_step(micro_step):
            inputs = {key: value for key, value in inputs.items() if key != "old_per_token_logps"}
        return inputs

    # (loss: ForwardMixin.compute_loss runs TRL's _compute_loss on each micro-batch, in token-budget sub-batches)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Run one episode per eval task at ``eval_temperature``, in eval mode (dropout off), and report success rates.

        Episodes run ``per_device_eval_batch_size`` at a time per process (one batched generate call per turn).

        Returns ``{f"{metric_key_prefix}_success_rate": …, f"{metric_key_prefix}_success_rate/<task_type>": …,
        return_mean, length_mean, invalid_action_rate, failed_rate}``, also logged through TRL/Trainer logging.
        Tasks are split across processes; every process returns the same dict. When a rollout raises, the env pools
        are closed before the error propagates (as in ``train``); the next call starts fresh ones.
        """
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            dataset = env_tasks(self._probe_env, "eval", "eval_dataset")
        if isinstance(dataset, Mapping):
            metrics = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(part, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        check_task_dataset(dataset, None, "eval_dataset")
        tasks = [dict(row) for row in itertools.islice(dataset, self.args.eval_max_tasks)]  # None: all
        world = self.accelerator.num_processes
        t0 = time.perf_counter()
        context = self._rollout_context("eval", metric_key_prefix)
        with (self.collector.pools_closed_on_error(), self._eval_sampling(),
              generation_params_gathered(self.model_wrapped, self.accelerator, self.args, self.use_vllm),
              lora_merged_for_generation(self.model_wrapped, self.accelerator, self.use_vllm)):
            episodes = self.collector.collect_evaluation(tasks, context.rank, world,
                                                         self.args.per_device_eval_batch_size, context)
        notify(self.rollout_observers, "on_evaluation", episodes, context)
        trajectories = gather_object(episodes.trajectories) if world > 1 else episodes.trajectories
        metrics = {f"{metric_key_prefix}_{k.split('/', 1)[1]}": v for k, v in episode_metrics(trajectories).items()}
        metrics[f"{metric_key_prefix}_num_tasks"] = float(len(trajectories))
        metrics[f"{metric_key_prefix}_runtime"] = time.perf_counter() - t0
        Trainer.log(self, metrics)  # not GRPOTrainer.log: that would flush the pending train metrics
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

