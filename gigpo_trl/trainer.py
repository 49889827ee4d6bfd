"""GiGPOTrainer: TRL's GRPOTrainer with multi-turn rollouts and GiGPO advantages.

The subclass is glue: rollouts come from :class:`~gigpo_trl.rollout.RolloutCollector` (generating through
TRL's own ``_generate_single_turn``), advantages from :func:`~gigpo_trl.advantage.compute_gigpo_advantages`,
and the loss, optimizer, logging, checkpointing, PEFT, DeepSpeed and vLLM paths stay TRL's.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import os
import time
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import datasets
import numpy as np
import torch
from accelerate.utils import DistributedType, gather_object
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import pad, use_adapter

from .advantage import compute_gigpo_advantages
from .config import GiGPOConfig, scrubbed_tokens
from .envs import get_env_class
from .memory import warn_if_budget_exceeds_memory
from .metrics import anchor_metrics, completion_metrics, episode_metrics, level_metrics
from .microbatch import pack_rows, row_lengths, sub_batch_widths, take_rows
from .rollout import DEFAULT_ENV_KEY, RolloutCollector, StepRow
from .vllm_glue import (check_vllm_args, install_cpu_colocate_sync, server_weight_sync_guard,
                        shutdown_engine_before_end_training, skip_initial_server_sync, vllm_max_model_len)

logger = logging.getLogger(__name__)

# Per-process rollout state written into every checkpoint next to TRL/Trainer's files (see _save_checkpoint).
ROLLOUT_STATE_NAME = "gigpo_rollout_state_{rank}.pt"


def _env_reward(completions, **kwargs):
    """Placeholder for GRPOTrainer's required reward function: GiGPO's rewards come from the environment."""
    raise RuntimeError("GiGPOTrainer takes rewards from the environment; this function is never called")


def _resolve_envs(env: Any) -> dict[str, Callable[[], Any]]:
    """``env`` as ``{name: zero-argument factory}``; accepts a class, a factory, a registered name, or a dict."""
    if env is None:
        raise ValueError("GiGPOTrainer needs env=: an environment class, a factory, a registered name or a dict")
    if isinstance(env, Mapping):
        if not env:
            raise ValueError("env= is an empty dict; give at least one environment")
        return {str(name): _resolve_envs(factory)[DEFAULT_ENV_KEY] for name, factory in env.items()}
    if isinstance(env, str):
        env = get_env_class(env)
    if not callable(env):
        raise TypeError(f"env must be an environment class or a zero-argument factory, got {type(env).__name__}")
    return {DEFAULT_ENV_KEY: env}


def _disable_attention_dropout(model) -> None:
    """Complete TRL's ``disable_dropout_in_model`` (which zeroes ``nn.Dropout`` modules only): attention layers of
    transformers models apply their float ``attention_dropout`` functionally, in train mode."""
    for module in model.modules():
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


class GiGPOTrainer(GRPOTrainer):
    """Trainer for Group-in-Group Policy Optimization (GiGPO, arXiv 2505.10978) of multi-turn LLM agents.

    Each training iteration rolls out ``num_generations`` episodes per task (same seed, so a group starts from the
    same state) for up to ``max_turns`` turns; every (environment, turn) becomes one training row whose advantage
    is A = A_E + ω·A_S (episode-level plus anchor-state step-level advantage). ``step_advantage_weight=0`` is GRPO.

    Args:
        model (`str` or `PreTrainedModel` or `PeftModel`): the policy; a path/Hub id is loaded by TRL.
        env: an environment class or zero-argument factory (see :mod:`gigpo_trl.envs.base`), a registered name
            (``"webshop"``, ``"alfworld"``, ``"frozenlake"``, ``"sokoban"``), or a dict ``{name: env}`` routed by the
            task dataset's ``env`` column.
        args (`GiGPOConfig`, *optional*): training configuration.
        train_dataset (`datasets.Dataset`, *optional*): tasks, columns ``task``, ``seed`` (optional ``task_type``,
            ``env``). Default: the environment's ``tasks("train")``.
        eval_dataset (`datasets.Dataset`, *optional*): tasks for :meth:`evaluate`. Default: ``tasks("eval")``.
        processing_class (`PreTrainedTokenizerBase`, *optional*): tokenizer with a chat template.
        peft_config (`peft.PeftConfig`, *optional*): LoRA etc., handled by TRL.
        callbacks, optimizers: as for `transformers.Trainer`.

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
        self.env_factories = _resolve_envs(env)
        if args is None:
            args = GiGPOConfig(output_dir="gigpo-output")
        if not isinstance(args, GiGPOConfig):
            raise TypeError(f"args must be a GiGPOConfig, got {type(args).__name__}")
        self._probe_env = next(iter(self.env_factories.values()))()
        if train_dataset is None:
            train_dataset = self._probe_env.tasks("train")
        _check_task_dataset(train_dataset, args, "train_dataset")
        check_vllm_args(args)
        with server_weight_sync_guard(args) as server_sync:  # vLLM server mode without CUDA: one warning, no sync
            super().__init__(
                model=model,
                reward_funcs=[_env_reward],
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                processing_class=processing_class,
                peft_config=peft_config,
                callbacks=callbacks,
                optimizers=optimizers,
            )
        self._vllm_no_sync_message = server_sync.message
        if self.use_vllm:
            install_cpu_colocate_sync(self.vllm_generation)  # colocate on vLLM's CPU backend
            shutdown_engine_before_end_training(self)
            if server_sync.message is not None:
                skip_initial_server_sync(self)
        if args.max_tokens_per_microbatch is not None and self.aux_loss_enabled:
            raise ValueError(
                "the model's MoE load-balancing loss (router_aux_loss_coef="
                f"{self.router_aux_loss_coef}) is a statistic of one whole forward, not a sum over rows; set "
                "max_tokens_per_microbatch=None or router_aux_loss_coef=0.0"
            )
        warn_if_budget_exceeds_memory(self.model, args, self.accelerator.device)  # budget x memory/token > free
        if args.disable_dropout:
            _disable_attention_dropout(self.model)
        if getattr(self._tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the tokenizer has no chat template, and GiGPO prompts are chat messages; set "
                "processing_class.chat_template (e.g. a ChatML template) or use an instruct model's tokenizer"
            )
        self.collector = RolloutCollector(
            self.env_factories,
            generate_fn=self._generate_turn,
            tokenize_fn=lambda messages: self._tokenize_prompts(messages)[0],
            decode_fn=functools.partial(self.processing_class.batch_decode, skip_special_tokens=True),
            max_turns=args.max_turns,
            history_length=args.history_length,
            max_prompt_length=self._resolve_max_prompt_length(),
            sync_fn=self._sync_max if self.accelerator.num_processes > 1 else None,
            num_env_workers=args.num_env_workers,
            step_timeout=args.env_step_timeout,
            progress=self.accelerator.is_main_process and not args.disable_tqdm,
            require_think=args.require_think,
            templates={next(iter(self.env_factories)): self._probe_env},  # built above; not twice at start-up
            history_key_depth=args.hierarchy_depth if args.step_grouping == "hierarchical" else 0,
        )
        self._check_first_prompt(train_dataset)

    def train(self, *args, **kwargs):
        """``Trainer.train``; the env pools (worker processes) are closed at the end, also when training raises.
        A later :meth:`evaluate` or ``train`` starts fresh ones. Refused up front (``RuntimeError``) in vLLM server
        mode without CUDA, where the trained weights could never reach the server (see ``gigpo_trl.vllm_glue``)."""
        if self._vllm_no_sync_message is not None:  # refuse before any rollout, not at the first weight sync
            raise RuntimeError(self._vllm_no_sync_message)
        try:
            return super().train(*args, **kwargs)
        finally:
            self.collector.close_pools()

    # ------------------------------------------------------------------ small helpers
    def _check_first_prompt(self, dataset) -> None:
        """Reset each environment once on its first training task and build that turn's prompt, so a bad
        observation or a prompt that cannot fit fails here, before any model time is spent (see
        :meth:`RolloutCollector.check_task`)."""
        if len(dataset) == 0:
            return
        names = getattr(dataset, "column_names", None) or list(dataset[0])
        column = list(dataset["env"]) if "env" in names and len(self.env_factories) > 1 else None
        for key in self.env_factories:
            if column is None:
                index = 0
            elif key in column:
                index = column.index(key)
            else:
                continue
            self.collector.check_task(dataset[index], key)

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["task", "seed", "task_type", "env", "prompt"]

    def _resolve_max_prompt_length(self) -> int | None:
        context = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        if self.use_vllm:  # vLLM rejects prompt + completion past its own max_model_len
            context = vllm_max_model_len(self) or context
        if self.args.max_prompt_length is not None:
            total = self.args.max_prompt_length + (self.max_completion_length or 0)
            if context is not None and total > context:
                raise ValueError(
                    f"max_prompt_length={self.args.max_prompt_length} + max_completion_length="
                    f"{self.max_completion_length} = {total} is more than the model's context of {context} positions "
                    f"(max_position_embeddings); lower them so that they sum to at most {context}, or leave "
                    "max_prompt_length=None (the context minus max_completion_length)"
                )
            return self.args.max_prompt_length
        return None if context is None else max(1, context - (self.max_completion_length or 0))

    def _generate_turn(self, prompt_ids: list[list[int]]):
        # num_generations=1: every prompt of a turn is distinct (one per environment).
        return self._generate_single_turn(prompt_ids, None, {}, 1)

    def _sync_max(self, local: int) -> int:
        value = torch.tensor([local], device=self.accelerator.device)
        return int(self.accelerator.gather(value).max().item())

    def _group_ids(self, inputs: list[dict]) -> list[str]:
        # RepeatSampler yields each task num_generations times in a row over the global generation batch, and
        # ranks hold consecutive slices of it: the global position // num_generations is the group.
        offset = self.accelerator.process_index * len(inputs)
        return [f"{(offset + i) // self.num_generations}:{x['task']!r}:{x.get('seed')!r}" for i, x in
                enumerate(inputs)]

    # ------------------------------------------------------------------ checkpoint and resume
    def _save_checkpoint(self, model, trial):
        """Also save this process's rollout position: TRL's micro-step counter ``_step`` and, when the checkpoint
        falls inside a generation cycle, the buffered generation batch the next steps train on. Without them a
        resumed run would regenerate at once (new samples, a shifted generation cycle) instead of continuing."""
        if not self.args.save_only_model:
            folder = os.path.join(self._get_output_dir(trial=trial),
                                  f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            os.makedirs(folder, exist_ok=True)
            generate_every = self.args.steps_per_generation * self.num_iterations
            reuse = self._buffered_inputs is not None and self._step % generate_every != 0
            state = {"step": self._step, "buffered_inputs": self._buffered_inputs if reuse else None}
            # Tensors, lists, dicts and ints only: loadable with torch.load(weights_only=True).
            torch.save(state, os.path.join(folder, ROLLOUT_STATE_NAME.format(rank=self.accelerator.process_index)))
        super()._save_checkpoint(model, trial)

    # Trainer writes the config (``torch.save(self.args)``, training_args.bin) in these two methods only, the second
    # before pushing the folder to the Hub: no token in those files, while the live config keeps its token.
    # _save also writes PEFT's model card: see _card_names_hub_base_model.
    def _save(self, output_dir=None, state_dict=None):
        with scrubbed_tokens(), self._card_names_hub_base_model():
            super()._save(output_dir, state_dict)

    def _push_from_checkpoint(self, checkpoint_folder):
        with scrubbed_tokens():
            super()._push_from_checkpoint(checkpoint_folder)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, ROLLOUT_STATE_NAME.format(rank=self.accelerator.process_index))
        if os.path.isfile(path):
            state = torch.load(path, map_location=self.accelerator.device, weights_only=True)
            self._step = int(state["step"])
            self._buffered_inputs = state["buffered_inputs"]
        else:  # a checkpoint of another version: keep the generation cycle aligned, regenerate at once
            self._step = self.state.global_step * self.args.gradient_accumulation_steps
            self._buffered_inputs = None

    # ------------------------------------------------------------------ model cards
    # TRL's card (create_model_card, also written with every checkpoint) and PEFT's (written by save_model) name the
    # base model after the model's `name_or_path` / its config's `_name_or_path`. For the default model that is its
    # cached local conversion, which TRL writes as "[None]" and PEFT as a local path. While they write, both name the
    # Hub id instead (models.hub_model_id; a local folder of unknown origin stays as it is), then they are restored.
    @contextlib.contextmanager
    def _card_names_hub_base_model(self):
        from .models import hub_model_id

        model = self.accelerator.unwrap_model(self.model)
        model = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT: the transformers model
        config = getattr(model, "config", None)
        local = getattr(config, "_name_or_path", None)
        hub_id = hub_model_id(local) if local else None
        if hub_id is None or hub_id == local:
            yield
            return
        saved = model.name_or_path
        config._name_or_path = model.name_or_path = hub_id
        try:
            yield
        finally:
            config._name_or_path, model.name_or_path = local, saved

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        with self._card_names_hub_base_model():
            super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)

    # ------------------------------------------------------------------ the override
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        mode = "train" if self.model.training else "eval"
        rank = self.accelerator.process_index
        t0 = time.perf_counter()
        group_ids = self._group_ids(inputs)
        with self._generation_params_gathered():
            batch = self.collector.collect(inputs, group_ids, trajectory_prefix=rank)
            if self.args.dynamic_sampling and mode == "train":
                batch = self._resample_flat_groups(list(inputs), group_ids, batch)
        rows = batch.rows
        t_rollout = time.perf_counter() - t0

        # GiGPO advantages over whole task groups: gather every rank's row keys, compute, keep the local slice.
        t1 = time.perf_counter()
        keys = _advantage_keys(rows)
        all_keys = gather_object(keys) if self.accelerator.num_processes > 1 else keys
        counts = gather_object([len(rows)]) if self.accelerator.num_processes > 1 else [len(rows)]
        start = sum(counts[:rank])
        if all_keys:
            result = self._advantages(all_keys)
            advantages = np.asarray(result.advantages, dtype=np.float32)[start : start + len(rows)]
        else:
            result, advantages = None, np.zeros(0, dtype=np.float32)
        t_adv = time.perf_counter() - t1

        output = self._rows_to_batch(rows, advantages, counts, mode)
        self._record_metrics(mode, batch, result, advantages, t_rollout, t_adv)
        return output

    def _resample_flat_groups(self, inputs: list[dict], group_ids: list[str], batch):
        """Dynamic sampling (DAPO, arXiv 2503.14476, Sec. 3.2): a task group whose trajectory returns are all equal
        carries no episode-level signal; roll out a fresh task in its place, up to ``max_dynamic_sampling_rounds``
        extra rounds. Unlike DAPO's rule, a group whose step groups still carry a non-zero A_S is kept by default
        (``dynamic_sampling_keep_step_signal``; see :meth:`_flat_groups`). Every rank takes the same decisions
        (gathered returns, replacement tasks chosen by a hash of the group id, round and step), so all ranks make
        the same collect calls. Groups still flat after the last round are kept, counted in
        ``dynamic_sampling/still_flat_groups`` and warned about once."""
        dataset = self.train_dataset
        replaced = 0
        flat = self._flat_groups(batch)
        for round_ in range(1, self.args.max_dynamic_sampling_rounds + 1):
            if not flat:
                break
            replaced += len(flat)
            positions = [i for i, g in enumerate(group_ids) if g in flat]
            for i in positions:
                key = f"{group_ids[i]}|{round_}|{self.state.global_step}"
                inputs[i] = dict(dataset[zlib.crc32(key.encode()) % len(dataset)])
                group_ids[i] = f"{group_ids[i]}|r{round_}"
            fresh = self.collector.collect([inputs[i] for i in positions], [group_ids[i] for i in positions],
                                           trajectory_prefix=(self.accelerator.process_index, round_))
            dropped = {batch.trajectories[i].trajectory_id for i in positions}
            batch.rows = [r for r in batch.rows if r.trajectory_id not in dropped] + fresh.rows
            for n, i in enumerate(positions):
                batch.trajectories[i] = fresh.trajectories[n]
            batch.num_generate_calls += fresh.num_generate_calls
            batch.max_prompt_tokens = max(batch.max_prompt_tokens, fresh.max_prompt_tokens)
            flat = self._flat_groups(batch)
        self._metrics["train"]["dynamic_sampling/replaced_groups"].append(float(replaced))
        self._metrics["train"]["dynamic_sampling/still_flat_groups"].append(float(len(flat)))
        if flat and not getattr(self, "_warned_still_flat", False):
            self._warned_still_flat = True
            logger.warning(
                "dynamic sampling: %d task group(s) still have all-equal returns after max_dynamic_sampling_rounds=%d "
                "extra rounds and are kept (no episode-level signal); the tasks may be too easy or too hard for the "
                "policy. Raise max_dynamic_sampling_rounds or change the task mix (this warning is shown once; see "
                "the metric dynamic_sampling/still_flat_groups).", len(flat), self.args.max_dynamic_sampling_rounds,
            )
        return batch

    def _flat_groups(self, batch) -> set:
        """Task groups (all ranks) whose healthy trajectories' returns are all equal; unless
        ``dynamic_sampling_keep_step_signal`` is off (DAPO's rule) or ω = 0, minus those whose step groups give
        some row a non-zero A_S (e.g. equal returns reached in different numbers of turns)."""
        multi = self.accelerator.num_processes > 1
        local = [(t.group_id, t.episode_return) for t in batch.trajectories if not t.failed]
        returns: dict[str, set] = {}
        for group, value in (gather_object(local) if multi else local):
            returns.setdefault(group, set()).add(round(value, 9))
        flat = {g for g, values in returns.items() if len(values) == 1}
        if flat and self.args.dynamic_sampling_keep_step_signal and self.args.step_advantage_weight != 0:
            keys = _advantage_keys([r for r in batch.rows if r.group_id in flat])
            keys = gather_object(keys) if multi else keys
            if keys:  # the same estimator settings as the training advantages, so A_S is the one trained on
                groups = [key[0] for key in keys]
                A_S = self._advantages(keys).step_advantages
                flat -= {g for g, a in zip(groups, np.abs(A_S)) if a > 1e-9}
        return flat

    def _advantages(self, keys: list[tuple]):
        """:func:`compute_gigpo_advantages` over rows given as :func:`_advantage_keys` tuples (all ranks' rows, in
        order), with this config's estimator settings."""
        groups, trajs, anchors, rewards, valid, histories = zip(*keys)
        return compute_gigpo_advantages(
            rewards=np.asarray(rewards, dtype=np.float64),
            group_ids=list(groups),
            trajectory_ids=list(trajs),
            anchor_states=list(anchors),
            action_valid=np.asarray(valid, dtype=bool),
            gamma=self.args.gamma,
            step_advantage_weight=self.args.step_advantage_weight,
            mode=self.args.advantage_mode,
            invalid_action_penalty=self.args.invalid_action_penalty,
            episode_stats=self.args.episode_stats,
            similarity_threshold=self.args.anchor_similarity_threshold,
            step_grouping=self.args.step_grouping,
            hierarchy_depth=self.args.hierarchy_depth,
            history_keys=list(histories),
        )

    def _rows_to_batch(self, rows: list[StepRow], advantages: np.ndarray, counts: list[int], mode: str) -> dict:
        """Pad the rows into TRL's batch dict; zero-mask filler rows make every rank hold the same multiple of
        steps_per_generation rows (``split_tensor_dict`` drops remainders)."""
        device = self.accelerator.device
        spg = self.args.steps_per_generation if mode == "train" else 1
        target = max(spg, math.ceil(max(counts) / spg) * spg)
        eos = self.eos_token_ids[0]
        prompt_list = [r.prompt_ids for r in rows]
        completion_list = [r.completion_ids or [eos] for r in rows]
        mask_list = [[1] * len(r.completion_ids) if r.completion_ids else [0] for r in rows]
        logps_list = [r.sampling_logps for r in rows]
        adv = list(advantages)
        filler_prompt = prompt_list[0] if prompt_list else [eos]
        for _ in range(target - len(rows)):
            prompt_list.append(filler_prompt)
            completion_list.append([eos])
            mask_list.append([0])
            logps_list.append([0.0])
            adv.append(0.0)

        def _pad(seqs, value, side, dtype=torch.long):
            return pad([torch.tensor(s, dtype=dtype) for s in seqs], padding_value=value, padding_side=side,
                       pad_to_multiple_of=self.pad_to_multiple_of).to(device)

        pad_id = self._tokenizer.pad_token_id
        prompt_ids = _pad(prompt_list, pad_id, "left")
        prompt_mask = _pad([[1] * len(p) for p in prompt_list], 0, "left")
        completion_ids = _pad(completion_list, pad_id, "right")
        completion_mask = _pad(mask_list, 0, "right")
        if self.mask_truncated_completions:
            ends = [*self.eos_token_ids, pad_id]
            truncated = torch.tensor([c[-1] not in ends for c in completion_list], device=device)
            completion_mask = completion_mask * (~truncated).unsqueeze(1).int()
        num_items_in_batch = self.accelerator.gather(completion_mask.sum()).sum()
        output = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
            "advantages": torch.tensor(adv, dtype=torch.float32, device=device),
            "num_items_in_batch": num_items_in_batch,
            # 1 for a rollout row, 0 for filler: row-normalised losses divide by real rows (see _sub_batch_scale)
            "real_row_mask": torch.tensor([1] * len(rows) + [0] * (target - len(rows)), device=device),
        }
        output.update(self._score_logps(prompt_ids, prompt_mask, completion_ids, completion_mask, logps_list, mode))
        return output

    def _score_logps(self, prompt_ids, prompt_mask, completion_ids, completion_mask, logps_list, mode) -> dict:
        """The old / reference / sampling log-probs and vLLM importance-sampling ratio, under the same conditions
        as ``GRPOTrainer._generate_and_score_completions`` computes them."""
        out: dict[str, torch.Tensor] = {}
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        is_correction = self.use_vllm and self.vllm_importance_sampling_correction
        have_sampling = all(lp is not None for lp in logps_list)
        generate_every = self.args.steps_per_generation * self.num_iterations
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            if self.args.gradient_accumulation_steps % generate_every != 0 or is_correction:
                out["old_per_token_logps"] = self._score_in_budget(
                    self.model, input_ids, attention_mask, logits_to_keep, batch_size
                )
            if self.beta != 0.0:
                if self.ref_model is not None:
                    ref = self._score_in_budget(self.ref_model, input_ids, attention_mask, logits_to_keep, batch_size)
                else:
                    unwrapped = self.accelerator.unwrap_model(self.model)
                    with use_adapter(unwrapped, adapter_name="ref" if "ref" in unwrapped.peft_config else None):
                        ref = self._score_in_budget(self.model, input_ids, attention_mask, logits_to_keep,
                                                    batch_size)
                out["ref_per_token_logps"] = ref
        if self.use_vllm and (have_sampling or is_correction):
            sampling = self._sampling_logps(logps_list, completion_ids)
            out["sampling_per_token_logps"] = sampling
            if is_correction:
                ratio = self._importance_ratio(out["old_per_token_logps"], sampling, completion_mask)
                out["importance_sampling_ratio"] = ratio
                self._record_sampling_metrics(mode, out["old_per_token_logps"], sampling, ratio, completion_mask)
        return out

    @staticmethod
    def _sampling_logps(logps_list, completion_ids) -> torch.Tensor:
        """vLLM's per-token sampling log-probs as a (B, C) float32 tensor aligned with ``completion_ids`` (B, C):
        token j of row i is ``logps_list[i][j]``; a row without log-probs (``None``) or a token vLLM could not score
        (``None``) is NaN (importance ratio 1, as in TRL); columns past a row's length are 0 (masked)."""
        out = torch.zeros(completion_ids.shape, dtype=torch.float32)
        for i, lp in enumerate(logps_list):
            if lp is None:
                out[i].fill_(math.nan)
                continue
            lp = lp[: out.size(1)]
            out[i, : len(lp)] = torch.tensor([math.nan if x is None else x for x in lp], dtype=torch.float32)
        return out.to(completion_ids.device)

    def _importance_ratio(self, old, sampling, mask) -> torch.Tensor:
        """Truncated / masked importance ratio π_θold / π_vLLM of the sampled tokens (TRL's vLLM correction).

        ``old``, ``sampling``: (B, C) per-token log-probs of the trainer and of vLLM; ``mask``: (B, C) loss mask.
        Returns (B, C) for ``vllm_importance_sampling_mode`` ``token_*``, (B, 1) for ``sequence_*`` (the exp of the
        summed masked log-ratio); ``*_truncate`` clamps to [clip_min, clip_max], ``*_mask`` zeroes ratios outside it.
        NaN log-probs count as a log-ratio of 0. Same computation as ``GRPOTrainer._generate_and_score_completions``.
        """
        diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
        mode = self.vllm_importance_sampling_mode
        if mode.startswith("sequence"):
            diff = diff.sum(dim=-1, keepdim=True)
        ratio = torch.exp(diff)
        lo, hi = self.vllm_importance_sampling_clip_min, self.vllm_importance_sampling_clip_max
        if mode.endswith("truncate"):
            return torch.clamp(ratio, min=lo, max=hi)
        lo = -math.inf if lo is None else lo
        hi = math.inf if hi is None else hi
        return ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)

    def _record_sampling_metrics(self, mode, old, sampling, ratio, mask) -> None:
        """TRL's vLLM sampling metrics under TRL's names: |logp_trainer - logp_vLLM| over loss tokens (mean, max)
        and the importance ratio (min, mean, max; over loss tokens, or over sequences in ``sequence_*`` modes)."""
        device = mask.device
        keep = mask.bool()
        delta = torch.abs(old - sampling)[keep & ~torch.isnan(old - sampling)]
        if self.vllm_importance_sampling_mode.startswith("sequence"):  # (B, 1): rows with a loss token
            flat = ratio[keep.any(dim=1)].flatten()
        else:
            flat = ratio[keep]

        def stat(values, fn):
            return fn(values) if values.numel() else torch.tensor(math.nan, device=device)

        gather = self.accelerator.gather
        values = {
            "sampling/sampling_logp_difference/mean": gather(stat(delta, torch.mean)).nanmean(),
            "sampling/sampling_logp_difference/max": gather(stat(delta, torch.max)).nan_to_num(-math.inf).max(),
            "sampling/importance_sampling_ratio/min": gather(stat(flat, torch.min)).nan_to_num(math.inf).min(),
            "sampling/importance_sampling_ratio/mean": gather(stat(flat, torch.mean)).nanmean(),
            "sampling/importance_sampling_ratio/max": gather(stat(flat, torch.max)).nan_to_num(-math.inf).max(),
        }
        for key, value in values.items():  # ±inf: no loss token on any rank
            self._metrics[mode][key].append(value.item() if torch.isfinite(value) else math.nan)

    # ------------------------------------------------------------------ bounded memory: token-budget sub-batches
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's loss on one micro-batch, run as sub-batches of at most ``max_tokens_per_microbatch`` padded tokens.

        The rows are packed by length (:func:`gigpo_trl.microbatch.pack_rows`) and each sub-batch is trimmed to its
        own longest prompt and completion. Every sub-batch but the last is backwarded here, with the gradient
        all-reduce (DDP) and DeepSpeed's step held until the last one, which is returned for
        ``Trainer.training_step`` to backward; the returned value is the whole micro-batch loss. Each sub-batch loss
        is weighted (:meth:`_sub_batch_scale`) so that the summed gradient equals the unsplit one; every rank runs
        the same number of sub-batches (empty ones pad the short ranks) so collectives stay in step.
        """
        budget = self.args.max_tokens_per_microbatch
        if return_outputs or budget is None or not (self.model.training and torch.is_grad_enabled()):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            scale = self._sub_batch_scale(inputs, inputs)
            return loss if scale == 1.0 else loss * scale
        mode = "train"
        subs, weights = self._split_for_budget(inputs, budget)
        before = {key: len(values) for key, values in self._metrics[mode].items()}
        kwargs = {"scale_wrt_gas": False} if self.accelerator.distributed_type == DistributedType.DEEPSPEED else {}
        done = None
        with self._ragged_gather():
            for sub, scale in subs[:-1]:
                with self._gradient_sync_deferred(model):
                    loss = super().compute_loss(model, sub) * scale
                    self.accelerator.backward(loss, **kwargs)
                done = loss.detach() if done is None else done + loss.detach()
            sub, scale = subs[-1]
            loss = super().compute_loss(model, sub) * scale
        self._merge_sub_batch_metrics(mode, before, weights)
        return loss if done is None else loss + done  # `done` only carries the value: its gradient is applied

    def _sub_batch_scale(self, sub: dict, whole: dict) -> float:
        """Weight of a sub-batch loss so that the sub-batch losses sum to the whole micro-batch's loss.

        TRL's normaliser per ``loss_type`` (``GRPOTrainer._compute_loss``): ``dapo``/``cispo``/``vespo`` divide by
        the global token count (already the same for every sub-batch: weight 1); ``bnpo`` by the forward's own
        tokens (weight = sub tokens / micro-batch tokens); ``grpo``/``sapo``/``luspo`` average per-row values and
        ``dr_grpo`` divides by rows × ``max_completion_length`` (weight = sub rows / micro-batch rows). Rows counts
        exclude the zero-mask filler rows of :meth:`_rows_to_batch` (``real_row_mask``), which TRL would count:
        with ``sub is whole`` this is the whole correction (e.g. 10 real rows + 6 filler: weight 16/10).
        """
        if self.loss_type == "bnpo":
            def tokens(b):
                mask = b["completion_mask"] if "tool_mask" not in b else b["completion_mask"] * b["tool_mask"]
                return max(float(mask.sum()), 1.0)

            return 1.0 if sub is whole else tokens(sub) / tokens(whole)
        if self.loss_type in ("grpo", "sapo", "luspo", "dr_grpo"):
            real = whole.get("real_row_mask")
            rows = float(real.sum()) if real is not None else float(whole["completion_mask"].size(0))
            return sub["completion_mask"].size(0) / max(rows, 1.0)
        return 1.0

    def _split_for_budget(self, inputs: dict, budget: int) -> tuple[list[tuple[dict, float]], list[float]]:
        """``([(sub-batch, loss weight)], global loss tokens per sub-batch index)``; the list has the same length
        on every rank (the ranks' maximum; empty sub-batches of weight 0 fill the rest). Filler rows, which carry no
        loss tokens, are left out."""
        p_len, c_len = row_lengths(inputs["prompt_mask"], inputs["completion_mask"])
        multiple = self.pad_to_multiple_of
        real = inputs.get("real_row_mask")
        keep = list(range(len(p_len))) if real is None else torch.nonzero(real).flatten().tolist()  # no filler
        subs = []
        for packed in pack_rows([p_len[i] for i in keep], [c_len[i] for i in keep], budget, multiple):
            rows = [keep[j] for j in packed]
            sub = take_rows(inputs, rows, *sub_batch_widths(p_len, c_len, rows, multiple))
            subs.append((sub, self._sub_batch_scale(sub, inputs)))
        tokens = [float(sub["completion_mask"].sum()) for sub, _ in subs]
        n_max, weights = self._agree_on_sub_batches(len(subs), tokens)
        if n_max == 0:  # only filler rows on every rank: still one (empty) forward/backward
            n_max, weights = 1, [0.0]
        while len(subs) < n_max:
            subs.append((self._empty_sub_batch(inputs), 0.0))
        return subs, weights

    def _agree_on_sub_batches(self, count: int, tokens: list[float]) -> tuple[int, list[float]]:
        """The ranks' largest sub-batch count and, per sub-batch index, the tokens summed over ranks."""
        if self.accelerator.num_processes == 1:
            return count, tokens
        device = self.accelerator.device
        n_max = int(self.accelerator.gather(torch.tensor([count], device=device)).max().item())
        local = torch.zeros(n_max, dtype=torch.float32, device=device)
        local[:count] = torch.tensor(tokens, dtype=torch.float32)
        return n_max, self.accelerator.reduce(local, reduction="sum").tolist()

    @staticmethod
    def _empty_sub_batch(inputs: dict) -> dict:
        """One row, one prompt and one completion column, no loss tokens: a rank's filler forward/backward."""
        sub = take_rows(inputs, [0], 1, 1)
        sub["completion_mask"] = torch.zeros_like(sub["completion_mask"])
        sub["advantages"] = torch.zeros_like(sub["advantages"])
        return sub

    @contextlib.contextmanager
    def _gradient_sync_deferred(self, model):
        """Hold gradient synchronisation for a sub-batch that is not the last of the micro-batch.

        TRL/accelerate private state (one place): on the last micro-batch of an accumulation window Trainer sets
        ``gradient_state.sync_gradients``; accelerate's DeepSpeed backward then sets the accumulation boundary and
        calls ``engine.step()`` after every backward, and DDP all-reduces after every backward. Clearing the flag
        and entering ``no_sync`` for the earlier sub-batches makes them plain accumulation micro-steps for both.
        """
        state = self.accelerator.gradient_state
        if not state.sync_gradients:
            yield
            return
        state._set_sync_gradients(False)
        try:
            with self.accelerator.no_sync(model):
                yield
        finally:
            state._set_sync_gradients(True)

    @contextlib.contextmanager
    def _ragged_gather(self):
        """Let ``accelerator.gather`` take per-row tensors of different lengths on different ranks.

        TRL private behaviour (one place): ``_compute_loss`` gathers one value per row for its clip-ratio min/max
        metrics, which assumes every rank's forward holds the same rows; sub-batches do not. Inside this block,
        floating-point tensors are NaN-padded to the longest rank first (``pad_across_processes``); TRL reduces
        them with ``nanmin``/``nanmax``, so the padding is invisible.
        """
        accelerator = self.accelerator
        if accelerator.num_processes == 1 or "gather" in vars(accelerator):
            yield
            return
        plain = accelerator.gather

        def gather(tensor):
            if isinstance(tensor, torch.Tensor) and tensor.ndim > 0 and tensor.is_floating_point():
                tensor = accelerator.pad_across_processes(tensor, dim=0, pad_index=math.nan)
            return plain(tensor)

        accelerator.gather = gather
        try:
            yield
        finally:
            del accelerator.gather

    def _merge_sub_batch_metrics(self, mode: str, before: dict[str, int], weights: list[float]) -> None:
        """TRL private (``self._metrics``): ``_compute_loss`` appends one value per call; fold the sub-batches'
        values into one per micro-batch: ``*_min``/``*_max`` by min/max, the rest (global masked means) weighted
        by each sub-batch index's global token count, which reproduces the unsplit micro-batch's mean."""
        k = len(weights)
        if k < 2:
            return
        w = np.asarray(weights, dtype=np.float64)
        for key, values in self._metrics[mode].items():
            start = before.get(key, 0)
            new = np.asarray(values[start:], dtype=np.float64)
            if len(new) != k:
                continue
            ok = ~np.isnan(new)
            if not ok.any():
                merged = math.nan
            elif key.endswith("_min"):
                merged = float(new[ok].min())
            elif key.endswith("_max"):
                merged = float(new[ok].max())
            elif w[ok].sum() > 0:
                merged = float((new[ok] * w[ok]).sum() / w[ok].sum())
            else:
                merged = float(new[ok].mean())
            del values[start:]
            values.append(merged)

    def _score_in_budget(self, model, input_ids, attention_mask, logits_to_keep: int, batch_size: int):
        """Per-token log-probs ``(B, logits_to_keep)`` of the no-grad old/reference passes, in forwards of at most
        ``max_tokens_per_microbatch`` padded tokens (``None``: TRL's chunks of ``batch_size`` rows).

        Only prompt padding is trimmed: completions keep the batch's full width, because a training sub-batch of
        another width reads these values at masked positions too (``exp(ref - logp)`` there must stay finite).
        Every rank runs the same number of forwards (ZeRO-3 gathers parameters in each).
        """
        budget = self.args.max_tokens_per_microbatch
        if budget is None:
            return self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size
            )[0]
        width = input_ids.size(1) - logits_to_keep  # prompt columns
        p_len = attention_mask[:, :width].sum(dim=1).tolist()
        c_len = [logits_to_keep] * input_ids.size(0)
        bins = pack_rows(p_len, c_len, budget, self.pad_to_multiple_of)
        n_max, _ = self._agree_on_sub_batches(len(bins), [0.0] * len(bins))
        out = None
        for i in range(n_max):
            rows = bins[i] if i < len(bins) else [0]  # a short rank repeats a one-token-prompt forward of row 0
            wp = min(width, sub_batch_widths(p_len, c_len, rows, self.pad_to_multiple_of)[0]) if i < len(bins) else 1
            index = torch.tensor(rows, device=input_ids.device)
            logps = self._get_per_token_logps_and_entropies(
                model, input_ids[index, width - wp :], attention_mask[index, width - wp :], logits_to_keep
            )[0]
            if out is None:
                out = logps.new_zeros((input_ids.size(0), logits_to_keep))
            if i < len(bins):
                out[index] = logps
        return out

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
        with unwrap_model_for_generation(
            self.model_wrapped, self.accelerator, gather_deepspeed3_params=True,
            gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
        ):
            self.args.ds3_gather_for_generation = False
            try:
                yield
            finally:
                self.args.ds3_gather_for_generation = True

    def _record_metrics(self, mode, batch, result, advantages, t_rollout, t_adv) -> None:
        rows = batch.rows
        multi = self.accelerator.num_processes > 1
        all_trajs = gather_object(batch.trajectories) if multi else batch.trajectories
        metrics = episode_metrics(all_trajs)
        if result is not None:
            metrics.update(anchor_metrics(result.anchor_group_ids))
            if self.args.step_grouping == "hierarchical":
                metrics.update(level_metrics(result.level_group_ids))
        lengths = [len(r.completion_ids) for r in rows]
        totals = torch.tensor(
            [len(rows), sum(lengths), sum(len(r.prompt_ids) for r in rows)], device=self.accelerator.device
        )
        totals = self.accelerator.gather(totals).view(-1, 3).sum(dim=0).tolist()
        if mode == "train":
            self.state.num_input_tokens_seen += int(totals[1] + totals[2])
        metrics["rollout/rows"] = float(totals[0])
        metrics["rollout/generate_calls"] = float(batch.num_generate_calls)
        metrics["rollout/max_prompt_tokens"] = float(batch.max_prompt_tokens)
        metrics["rollout/seconds"] = t_rollout
        metrics["rollout/advantage_seconds"] = t_adv
        metrics["completions/mean_length"] = totals[1] / max(totals[0], 1)
        # TRL's clipped / terminated completion metrics; an empty completion was not cut at the limit
        ends = {*self.eos_token_ids, self._tokenizer.pad_token_id}
        local = [(len(r.completion_ids), bool(r.completion_ids) and r.completion_ids[-1] not in ends) for r in rows]
        gathered = gather_object(local) if multi else local
        if gathered:
            metrics.update(completion_metrics(*zip(*gathered)))
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)
        if self.log_completions:
            self._logs["prompt"].extend(gather_object([r.prompt_messages for r in rows]))
            self._logs["completion"].extend(gather_object([r.completion_text for r in rows]))
            self._logs["rewards"]["env"].extend(gather_object([r.reward for r in rows]))
            self._logs["advantages"].extend(gather_object([float(a) for a in advantages]))

    # ------------------------------------------------------------------ evaluation
    @contextlib.contextmanager
    def _eval_sampling(self):
        """Sample at ``eval_temperature`` (0 = greedy) with the model in eval mode (dropout off) for the duration of
        the block; the previous mode and sampling settings come back afterwards, also when the block raises."""
        temperature = self.args.eval_temperature
        saved = (self.generation_config.do_sample, self.generation_config.temperature,
                 dict(self.generation_kwargs)) if hasattr(self, "generation_config") else None
        saved_vllm = self.vllm_generation.temperature if self.use_vllm else None
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
            if self.use_vllm:
                self.vllm_generation.temperature = temperature
            yield
        finally:
            if saved is not None:
                self.generation_config.do_sample, self.generation_config.temperature = saved[0], saved[1]
                self.generation_kwargs.clear()
                self.generation_kwargs.update(saved[2])
            if self.use_vllm:
                self.vllm_generation.temperature = saved_vllm
            self.model.train(was_training)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Run one episode per eval task at ``eval_temperature``, in eval mode (dropout off), and report success rates.

        Episodes run ``per_device_eval_batch_size`` at a time per process (one batched generate call per turn).

        Returns ``{f"{metric_key_prefix}_success_rate": …, f"{metric_key_prefix}_success_rate/<task_type>": …,
        return_mean, length_mean, invalid_action_rate, failed_rate}``, also logged through TRL/Trainer logging.
        Tasks are split across processes; every process returns the same dict.
        """
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            dataset = self._probe_env.tasks("eval")
        if isinstance(dataset, Mapping):
            metrics = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(part, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        _check_task_dataset(dataset, None, "eval_dataset")
        tasks = [dict(row) for row in itertools.islice(dataset, self.args.eval_max_tasks)]  # None: all
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        local = tasks[rank::world]
        # Episodes run per_device_eval_batch_size at a time; every rank makes the same number of collect calls
        # (a rank with fewer tasks collects an empty chunk, generating filler prompts only).
        size = max(1, self.args.per_device_eval_batch_size)
        n_chunks = math.ceil(math.ceil(len(tasks) / world) / size)
        t0 = time.perf_counter()
        local_trajectories = []
        with self._eval_sampling(), self._generation_params_gathered():
            for c in range(n_chunks):
                chunk = local[c * size : (c + 1) * size]
                batch = self.collector.collect(chunk, [f"eval:{rank}:{c}:{i}" for i in range(len(chunk))],
                                               trajectory_prefix=("eval", rank, c))
                local_trajectories += batch.trajectories
        trajectories = gather_object(local_trajectories) if world > 1 else local_trajectories
        metrics = {f"{metric_key_prefix}_{k.split('/', 1)[1]}": v for k, v in episode_metrics(trajectories).items()}
        metrics[f"{metric_key_prefix}_num_tasks"] = float(len(trajectories))
        metrics[f"{metric_key_prefix}_runtime"] = time.perf_counter() - t0
        Trainer.log(self, metrics)  # not GRPOTrainer.log: that would flush the pending train metrics
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


def _advantage_keys(rows: list[StepRow]) -> list[tuple]:
    """What the advantage estimator reads of each row, small and picklable (gathered across ranks)."""
    return [(r.group_id, r.trajectory_id, r.anchor_state, r.reward, r.action_valid, r.history_key) for r in rows]


def _check_task_dataset(dataset, args: GiGPOConfig | None, name: str) -> None:
    """Fail early on a task dataset the collector cannot use."""
    if isinstance(dataset, datasets.IterableDataset):
        if args is not None:  # the training task set
            raise ValueError(
                f"{name} is a datasets.IterableDataset; GiGPO needs a map-style datasets.Dataset of tasks (its size "
                "and random access serve the init check, the group sampler and dynamic sampling): materialise it, "
                "e.g. datasets.Dataset.from_list(list(iterable_dataset.take(n))). An iterable eval_dataset is fine."
            )
        columns = dataset.column_names or list(next(iter(dataset), {"task": None}))
        if "task" not in columns:
            raise ValueError(f"{name} has no 'task' column (columns: {columns}); each row must give the task to reset")
        return
    columns = getattr(dataset, "column_names", None)
    if columns is None and len(dataset):
        columns = list(dataset[0])
    if columns is not None and "task" not in columns:
        raise ValueError(f"{name} has no 'task' column (columns: {columns}); each row must give the task to reset")
    if args is not None:
        needed = args.generation_batch_size // args.num_generations
        if len(dataset) < needed:
            raise ValueError(
                f"{name} has {len(dataset)} tasks, but one generation batch needs {needed} distinct tasks "
                f"(generation_batch_size={args.generation_batch_size} / num_generations={args.num_generations})"
            )
