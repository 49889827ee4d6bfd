"""Input checks of :class:`~gigpo_trl.trainer.GiGPOTrainer`: environments, task datasets, prompt limits.

Each fails at construction (or at the start of :meth:`~gigpo_trl.trainer.GiGPOTrainer.evaluate`) with an error that
names the bad value, before any model time is spent (see ``docs/errors.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import datasets

from .config import GiGPOConfig
from .envs import as_env_factory, get_env_class
from .rollout import DEFAULT_ENV_KEY


def env_reward(completions, **kwargs):
    """Placeholder for GRPOTrainer's required reward function: GiGPO's rewards come from the environment."""
    raise RuntimeError("GiGPOTrainer takes rewards from the environment; this function is never called")


def resolve_envs(env: Any) -> dict[str, Callable[[], Any]]:
    """``env`` as ``{name: zero-argument factory}``; accepts a class, a factory, a registered name, or a dict.

    Raises ``ValueError`` for ``None`` or an empty dict, ``TypeError`` for something not callable (after a
    registered name is looked up with :func:`gigpo_trl.envs.get_env_class`, which raises for an unknown name)."""
    if env is None:
        raise ValueError("GiGPOTrainer needs env=: an environment class, a factory, a registered name or a dict")
    if isinstance(env, Mapping):
        if not env:
            raise ValueError("env= is an empty dict; give at least one environment")
        return {str(name): resolve_envs(factory)[DEFAULT_ENV_KEY] for name, factory in env.items()}
    if isinstance(env, str):
        env = get_env_class(env)
    if not callable(env):
        raise TypeError(f"env must be an environment class or a zero-argument factory, got {type(env).__name__}")
    return {DEFAULT_ENV_KEY: as_env_factory(env)}  # TRL / OpenEnv environments get their adapter (envs/adapters.py)


def disable_attention_dropout(model) -> None:
    """Complete TRL's ``disable_dropout_in_model`` (which zeroes ``nn.Dropout`` modules only): attention layers of
    transformers models apply their float ``attention_dropout`` functionally, in train mode."""
    for module in model.modules():
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def check_first_prompt(collector, env_factories: Mapping, dataset) -> None:
    """Reset each environment once on its first training task and build that turn's prompt, so a bad
    observation or a prompt that cannot fit fails here, before any model time is spent (see
    :meth:`RolloutCollector.check_task`)."""
    if len(dataset) == 0:
        return
    names = getattr(dataset, "column_names", None) or list(dataset[0])
    column = list(dataset["env"]) if "env" in names and len(env_factories) > 1 else None
    for key in env_factories:
        if column is None:
            index = 0
        elif key in column:
            index = column.index(key)
        else:
            continue
        collector.check_task(dataset[index], key)


def max_prompt_length(context: int | None, max_prompt_length: int | None, max_completion_length: int | None):
    """The prompt limit (tokens) the collector fits every turn's prompt to: ``max_prompt_length`` when set, else the
    model's ``context`` (positions; with vLLM, its ``max_model_len``) minus ``max_completion_length``;
    ``None`` when both are unknown. Raises ``ValueError`` when the two lengths sum past ``context``."""
    if max_prompt_length is not None:
        total = max_prompt_length + (max_completion_length or 0)
        if context is not None and total > context:
            raise ValueError(
                f"max_prompt_length={max_prompt_length} + max_completion_length="
                f"{max_completion_length} = {total} is more than the model's context of {context} positions "
                f"(max_position_embeddings); lower them so that they sum to at most {context}, or leave "
                "max_prompt_length=None (the context minus max_completion_length)"
            )
        return max_prompt_length
    return None if context is None else max(1, context - (max_completion_length or 0))


def check_task_dataset(dataset, args: GiGPOConfig | None, name: str) -> None:
    """Fail early (``ValueError`` naming ``name`` and the bad value) on a task dataset the collector cannot use: no
    ``task`` column; for training (``args`` given) an ``IterableDataset`` or fewer tasks than one generation batch
    needs (``generation_batch_size / num_generations``)."""
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


def check_chat_template(tokenizer) -> None:
    """Refuse (``ValueError``) a tokenizer without a chat template: GiGPO's prompts are chat messages."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "the tokenizer has no chat template, and GiGPO prompts are chat messages; set "
            "processing_class.chat_template (e.g. a ChatML template) or use an instruct model's tokenizer"
        )


def check_budget_aux_loss(args: GiGPOConfig, aux_loss_enabled: bool, router_aux_loss_coef: float) -> None:
    """Refuse (``ValueError``) a token budget together with a MoE load-balancing loss: that loss is a statistic of
    one whole forward, not a sum over rows, so sub-batches would change it."""
    if args.max_tokens_per_microbatch is not None and aux_loss_enabled:
        raise ValueError(
            f"the model's MoE load-balancing loss (router_aux_loss_coef={router_aux_loss_coef}) is a statistic of one "
            "whole forward, not a sum over rows; set max_tokens_per_microbatch=None or router_aux_loss_coef=0.0"
        )
