"""The one place that touches private attributes of TRL, transformers and accelerate (and of argparse).

Every other module of the package goes through the functions below, so a TRL release means reading this file and
running ``tests/test_trl_compat.py``: each private name has a contract test there that fails with the name and the
installed TRL version when an upgrade changes what we rely on. Written against TRL 1.16.0, transformers 5.x,
accelerate 1.x.

Private names (``GiGPOTrainer`` is a ``GRPOTrainer``; "hook": a private method the trainer overrides, which TRL or
Trainer calls; the override calls ``super()`` except where noted). Contract tests in ``tests/test_trl_compat.py``:

=========================================================  ========  =============================================
private name                                                 use       contract test
=========================================================  ========  =============================================
``GRPOTrainer._generate_and_score_completions(inputs)``      hook      ``test_generate_and_score_hook``
``GRPOTrainer._set_signature_columns_if_needed()``           hook      ``test_signature_columns_hook``
``GRPOTrainer._signature_columns``                           write     ``test_signature_columns_hook``
``GRPOTrainer._save_checkpoint(model, trial)``               hook      ``test_checkpoint_hooks``
``Trainer._save(output_dir, state_dict)``                    hook      ``test_checkpoint_hooks``
``Trainer._push_from_checkpoint(checkpoint_folder)``         hook      ``test_checkpoint_hooks``
``GRPOTrainer._load_optimizer_and_scheduler(checkpoint)``    hook      ``test_checkpoint_hooks``
``Trainer._get_output_dir(trial)``                           call      ``test_get_output_dir``
``GRPOTrainer._step``                                        r/w       ``test_rollout_position``
``GRPOTrainer._buffered_inputs``                             r/w       ``test_rollout_position``
``GRPOTrainer._tag_names / _name / _paper``                  class     ``test_model_card_class_attributes``
``GRPOTrainer._generate_single_turn(ids, images, mm, n)``    call      ``test_generate_single_turn``
``GRPOTrainer._tokenize_prompts(prompts)``                   call      ``test_tokenize_prompts``
``GRPOTrainer._get_per_token_logps_and_entropies(...)``      call      ``test_per_token_logps``
``GRPOTrainer._compute_loss(model, inputs)`` normalisers     mirror    ``test_sub_batch_scale_matches_compute_loss``
``GRPOTrainer._compute_loss`` loss types                     mirror    ``test_compute_loss_loss_types_known``
``GRPOTrainer._compute_loss`` gathers per-row clip values    patch     ``test_compute_loss_gathers_per_row``
``GRPOTrainer._metrics``                                     r/w       ``test_metrics_and_logs``
``GRPOTrainer._logs``                                        write     ``test_metrics_and_logs``
``GRPOTrainer._tokenizer``                                   read      ``test_tokenizer``
``GRPOTrainer._last_loaded_step``                            write     ``test_last_loaded_step``
``VLLMGeneration._iter_named_params()``                      call      ``test_iter_named_params``
``PretrainedConfig._name_or_path``                           r/w       ``test_config_name_or_path``
``GradientState._set_sync_gradients(flag)``                  call      ``test_set_sync_gradients``
``ArgumentParser._optionals._group_actions``                 r/w       ``test_argparse_privates``
``ArgumentParser._option_string_actions``                    write     ``test_argparse_privates``
``_ArgumentGroup._group_actions``                            write     ``test_argparse_privates``
=========================================================  ========  =============================================

``test_no_private_library_attribute_outside_compat`` checks that no other module of the package names one of these
(or any other private attribute of those classes). The vLLM importance-sampling maths that
``GRPOTrainer._generate_and_score_completions`` computes inline is re-done in :mod:`gigpo_trl.vllm_glue` and pinned
to TRL's own code by ``test_importance_ratio_matches_trl``.
"""

from __future__ import annotations

from typing import Any

# Hooks of GRPOTrainer / Trainer that GiGPOTrainer (or one of its mixins) overrides; TRL calls them by these names.
OVERRIDDEN_HOOKS = (
    "_generate_and_score_completions",  # GRPOTrainer._prepare_inputs: list of rows -> batch dict (see DESIGN.md)
    "_set_signature_columns_if_needed",  # Trainer._remove_unused_columns: which dataset columns to keep
    "_save_checkpoint",  # Trainer._maybe_log_save_evaluate: writes checkpoint-<step>/ (GRPO adds the model card)
    "_save",  # Trainer.save_model: weights + training_args.bin (torch.save(self.args))
    "_push_from_checkpoint",  # Trainer._save_checkpoint with push_to_hub: uploads the folder, args included
    "_load_optimizer_and_scheduler",  # Trainer._inner_training_loop on resume, after the weights
)


# ---------------------------------------------------------------- TRL GRPOTrainer: generation and scoring
def generate_single_turn(trainer, prompt_ids: list[list[int]]):
    """One generate call through TRL's dispatch (vLLM server/colocate, continuous batching or ``model.generate``,
    weight sync to vLLM once per global step). Relies on ``_generate_single_turn(prompt_ids, images,
    multimodal_fields, num_generations)`` returning ``(completion_ids, logprobs or None)`` (lists per prompt; vLLM's
    sampled-token log-probs); ``num_generations=1`` because every prompt of a turn is distinct."""
    return trainer._generate_single_turn(prompt_ids, None, {}, 1)


def tokenize_prompts(trainer, messages: list[list[dict]]) -> list[list[int]]:
    """Chat-template token ids of each prompt (no padding). Relies on ``_tokenize_prompts(prompts)`` returning
    ``(prompt_ids, images, multimodal_fields)`` with ``prompt_ids`` a list of int lists."""
    return trainer._tokenize_prompts(messages)[0]


def per_token_logps(trainer, model, input_ids, attention_mask, logits_to_keep: int, batch_size: int | None = None):
    """``(B, logits_to_keep)`` log-probs of the last ``logits_to_keep`` tokens of each row, under ``model``, in
    chunks of ``batch_size`` rows (``None``: one). Relies on ``_get_per_token_logps_and_entropies`` taking these
    arguments and returning ``(logps, entropies, aux_loss)``."""
    return trainer._get_per_token_logps_and_entropies(
        model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size
    )[0]


def tokenizer(trainer):
    """The text tokenizer (``processing_class`` or its ``.tokenizer`` for a processor). Relies on ``_tokenizer``."""
    return trainer._tokenizer


def metrics(trainer, mode: str):
    """``{name: [value per call]}`` that ``GRPOTrainer.log`` averages and flushes. Relies on ``_metrics[mode]``
    being a ``defaultdict(list)`` keyed by metric name."""
    return trainer._metrics[mode]


def completion_logs(trainer) -> dict:
    """TRL's completion table buffers (``log_completions``). Relies on ``_logs`` holding deques ``prompt``,
    ``completion``, ``advantages`` and a dict ``rewards`` of deques per reward function name."""
    return trainer._logs


def set_signature_columns(trainer, columns: list[str]) -> None:
    """Keep these dataset columns (Trainer drops the others). Relies on ``_signature_columns`` (``None`` until set)."""
    if trainer._signature_columns is None:
        trainer._signature_columns = list(columns)


def mark_weights_loaded(trainer) -> None:
    """Tell TRL that vLLM already holds this step's weights, so the next generate call does not sync them. Relies
    on ``_generate_single_turn`` syncing when ``state.global_step != _last_loaded_step``."""
    trainer._last_loaded_step = trainer.state.global_step


def iter_named_params(vllm_generation):
    """``(name, tensor)`` pairs of the trainer's weights as TRL's vLLM sync pushes them (PEFT merged, ZeRO-3 / FSDP
    gathered). Relies on ``VLLMGeneration._iter_named_params()``."""
    return vllm_generation._iter_named_params()


# ---------------------------------------------------------------- TRL / Trainer: checkpoint and resume
def rollout_position(trainer) -> tuple[int, Any]:
    """``(micro-step counter, buffered generation batch or None)``: where TRL is in its generation cycle. Relies on
    ``_prepare_inputs`` regenerating when ``_step % (steps_per_generation × num_iterations) == 0`` or
    ``_buffered_inputs is None``, else training on ``_buffered_inputs[_step % steps_per_generation]``."""
    return trainer._step, trainer._buffered_inputs


def set_rollout_position(trainer, step: int, buffered_inputs) -> None:
    """Restore :func:`rollout_position` (see there)."""
    trainer._step = step
    trainer._buffered_inputs = buffered_inputs


def output_dir(trainer, trial) -> str:
    """The run folder that ``checkpoint-<step>`` folders go in. Relies on ``Trainer._get_output_dir(trial=…)``."""
    return trainer._get_output_dir(trial=trial)


def config_name_or_path(config) -> str | None:
    """The checkpoint path or Hub id a transformers config was loaded from. Relies on
    ``PretrainedConfig._name_or_path`` (what ``model.name_or_path`` and model cards read)."""
    return getattr(config, "_name_or_path", None)


def set_config_name_or_path(config, value: str | None) -> None:
    """Set :func:`config_name_or_path`."""
    config._name_or_path = value


# ---------------------------------------------------------------- accelerate
def set_sync_gradients(accelerator, flag: bool) -> None:
    """Set ``accelerator.gradient_state.sync_gradients``, which accelerate's DeepSpeed ``backward`` reads as the
    accumulation boundary (engine step) and DDP as the all-reduce point. Relies on
    ``GradientState._set_sync_gradients(flag)`` (the public attribute is read-only)."""
    accelerator.gradient_state._set_sync_gradients(flag)


# ---------------------------------------------------------------- argparse (the job's --help layout)
def parser_optional_actions(parser) -> list:
    """The live list of actions under the parser's default "options" heading (mutable: assign a slice to move
    actions out). Relies on ``ArgumentParser._optionals._group_actions``."""
    return parser._optionals._group_actions


def unregister_option_strings(parser, action) -> None:
    """Make ``action``'s flags unknown on the command line while its default still fills the field. Relies on
    ``ArgumentParser._option_string_actions`` (flag -> action) and ``parse_known_args`` reading defaults from
    ``_actions``."""
    for option in action.option_strings:
        parser._option_string_actions.pop(option, None)


def add_actions_to_group(group, actions: list) -> None:
    """Show existing ``actions`` under ``group``'s heading in ``--help``. Relies on
    ``_ArgumentGroup._group_actions`` (what ``format_help`` lists per group)."""
    group._group_actions.extend(actions)
