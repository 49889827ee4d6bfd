"""The one place that touches private attributes of TRL, transformers and accelerate (and of argparse and TextWorld).

Every other module of the package goes through the functions below, so a TRL release means reading this file and
running ``tests/test_trl_compat.py``: each private name has a contract test there that fails with the name and the
installed TRL version when an upgrade changes what we rely on. Written against TRL 1.16.0, transformers 5.x,
accelerate 1.x.

Private names (``GiGPOTrainer`` is a ``GRPOTrainer``; "hook": a private method the trainer overrides, which TRL or
Trainer calls; the override calls ``super()`` except where noted: ``_prepare_inputs`` in training at
``steps_per_generation`` > 1 mirrors it, :func:`buffered_micro_batch`). Contract tests in ``tests/test_trl_compat.py``:

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
``Trainer._init_training_state(...)``: epochs trained        hook      ``test_checkpoint_hooks``
``Trainer._get_output_dir(trial)``                           call      ``test_get_output_dir``
``GRPOTrainer._step``                                        r/w       ``test_rollout_position``
``GRPOTrainer._buffered_inputs``                             r/w       ``test_rollout_position``
``GRPOTrainer._prepare_inputs`` generate / buffer rule       mirror    ``test_buffered_micro_batch``
``GRPOTrainer._prepare_inputs(generation_batch)``            hook      ``test_prepare_inputs_hook``
``GRPOTrainer._compute_loss``: no π_old → own log-probs      relies    ``test_prepare_inputs_hook``
TRL's forwards pass no ``position_ids`` (pre-hook)          relies    ``test_forward_positions_from_mask``
``GRPOTrainer._tag_names / _name / _paper``                  class     ``test_model_card_class_attributes``
``GRPOTrainer._generate_single_turn(ids, images, mm, n)``    call      ``test_generate_single_turn``
``GRPOTrainer._dist.summon_full_params(model, recurse)``     call      ``test_summon_full_params``
``GRPOTrainer._tokenize_prompts(prompts)``                   call      ``test_tokenize_prompts``
``GRPOTrainer.chat_template / chat_template_kwargs``         read      ``test_tokenize_prompts``
``GRPOTrainer.eos_token_ids``                                read      ``test_tokenize_prompts``
``GRPOTrainer._get_per_token_logps_and_entropies(...)``      call      ``test_per_token_logps``
``GRPOTrainer._get_per_token_logps_and_entropies(...)``      hook      ``test_per_token_logps_hook``
``GradientCheckpointingLayer._can_checkpoint_with_cache``    write     ``test_cache_under_checkpointing``
``GRPOTrainer._compute_loss(model, inputs)`` normalisers     mirror    ``test_sub_batch_scale_matches_compute_loss``
``GRPOTrainer._compute_loss`` loss types                     mirror    ``test_compute_loss_loss_types_known``
``GRPOTrainer._compute_loss`` gathers per-row clip values    patch     ``test_compute_loss_gathers_per_row``
``GRPOTrainer._metrics``                                     r/w       ``test_metrics_and_logs``
``GRPOTrainer._logs``                                        write     ``test_metrics_and_logs``
``GRPOTrainer._tokenizer``                                   read      ``test_tokenizer``
``GRPOTrainer._last_loaded_step``                            write     ``test_last_loaded_step``
``trl.trainer.utils._use_triton`` (SFT's fused LM head)      patch     ``test_fused_lm_head_labelled_only``
``VLLMGeneration._iter_named_params()``                      call      ``test_iter_named_params``
``VLLMGeneration._iter_named_params``                        write     ``test_vllm_weight_walk``
``VLLMGeneration._dist.gather_params(params) / .is_fsdp``    r/w       ``test_vllm_weight_walk``
``VLLMGeneration._fix_param_name_to_vllm(name, prefixes)``   call      ``test_vllm_weight_walk``
``VLLMClient._post(url, **kwargs)``                          call      ``test_vllm_client_post``
``VLLMClient.session``: every request goes through it       r/w       ``test_vllm_client_session``
``PretrainedConfig._name_or_path``                           r/w       ``test_config_name_or_path``
``GradientState._set_sync_gradients(flag)``                  call      ``test_set_sync_gradients``
``ArgumentParser._optionals._group_actions``                 r/w       ``test_argparse_privates``
``ArgumentParser._option_string_actions``                    write     ``test_argparse_privates``
``_ArgumentGroup._group_actions``                            write     ``test_argparse_privates``
TextWorld ``textgen._parse_and_convert``                      r/w       ``test_textworld_textgen_privates``
TextWorld ``textgen._PARSER.parse``                          call      ``test_textworld_textgen_privates``
TextWorld ``textgen._Converter().walk(tree)``                call      ``test_textworld_textgen_privates``
=========================================================  ========  =============================================

``test_no_private_library_attribute_outside_compat`` checks that no other module of the package names one of these
(or any other private attribute of those classes). The vLLM importance-sampling maths that
``GRPOTrainer._generate_and_score_completions`` computes inline is re-done in :mod:`gigpo_trl.generation.vllm_engine` and pinned
to TRL's own code by ``test_importance_ratio_matches_trl``.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

# Hooks of GRPOTrainer / Trainer that GiGPOTrainer (or one of its mixins) overrides; TRL calls them by these names.
OVERRIDDEN_HOOKS = (
    "_generate_and_score_completions",  # GRPOTrainer._prepare_inputs: list of rows -> batch dict (see DESIGN.md)
    "_set_signature_columns_if_needed",  # Trainer._remove_unused_columns: which dataset columns to keep
    "_save_checkpoint",  # Trainer._maybe_log_save_evaluate: writes checkpoint-<step>/ (GRPO adds the model card)
    "_save",  # Trainer.save_model: weights + training_args.bin (torch.save(self.args))
    "_push_from_checkpoint",  # Trainer._save_checkpoint with push_to_hub: uploads the folder, args included
    "_load_optimizer_and_scheduler",  # Trainer._inner_training_loop on resume, after the weights
    "_init_training_state",  # Trainer._inner_training_loop: loads the state; (epochs, micro-steps) already trained
    "_prepare_inputs",  # Trainer.training_step, once per micro-step: generates / buffers / slices a micro-batch
    "_get_per_token_logps_and_entropies",  # _compute_loss and scoring: every forward over rows (shared prefixes)
)


# ---------------------------------------------------------------- TRL GRPOTrainer: construction
def env_reward(completions, **kwargs):
    """``GRPOTrainer`` requires a reward function; GiGPO's rewards come from the environment, so this one is never
    called."""
    raise RuntimeError("GiGPOTrainer takes rewards from the environment; this function is never called")


# ---------------------------------------------------------------- TRL GRPOTrainer: generation and scoring
def generate_single_turn(trainer, prompt_ids: list[list[int]]):
    """One generate call through TRL's dispatch (vLLM server/colocate, continuous batching or ``model.generate``;
    the caller decides the weight sync to vLLM, see :func:`mark_weights_loaded`). Relies on ``_generate_single_turn(prompt_ids, images,
    multimodal_fields, num_generations)`` returning ``(completion_ids, logprobs or None)`` (lists per prompt; vLLM's
    sampled-token log-probs); ``num_generations=1`` because every prompt of a turn is distinct."""
    return trainer._generate_single_turn(prompt_ids, None, {}, 1)


def summon_full_params(trainer):
    """TRL's context around a transformers generate call that gathers FSDP-sharded parameters (a no-op otherwise).
    Relies on ``GRPOTrainer._dist.summon_full_params(model, recurse=False)``."""
    return trainer._dist.summon_full_params(trainer.model_wrapped, recurse=False)


def vllm_generate(vllm_generation, prompt_ids: list[list[int]]):
    """One generate call through TRL's ``VLLMGeneration`` without the trainer's step check (so without a weight push;
    the caller decides it): ``(completion_ids, per-token sampling log-probs)``, one list per prompt. Relies on
    ``VLLMGeneration.generate(prompts, images, num_generations)`` returning ``(prompt_ids, completion_ids, logprobs,
    logprob_token_ids)`` with each token's top-k log-probs, the sampled token's first (as ``_generate_single_turn``
    reads them)."""
    _, completion_ids, logprobs, _ = vllm_generation.generate(prompts=prompt_ids, images=None, num_generations=1)
    return completion_ids, None if logprobs is None else [[lp[0] for lp in seq] for seq in logprobs]


def tokenize_prompts(trainer, messages: list[list[dict]]) -> list[list[int]]:
    """Chat-template token ids of each prompt (no padding). Relies on ``_tokenize_prompts(prompts)`` returning
    ``(prompt_ids, images, multimodal_fields)`` with ``prompt_ids`` a list of int lists."""
    return trainer._tokenize_prompts(messages)[0]


_TOKENIZER_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_TOKENIZER_LOCKS_GUARD = threading.Lock()


def tokenizer_lock(processing_class) -> threading.RLock:
    """The one lock of ``processing_class`` (a tokenizer or processor object): every rollout use of it (templating,
    decoding: :class:`ChatTemplating`) holds it, so the trainer's thread and the asynchronous rollout producer's never
    run it at once. A fast tokenizer's Rust backend keeps mutable settings (truncation, padding) that one call may
    change while another thread encodes ("Already borrowed")."""
    with _TOKENIZER_LOCKS_GUARD:
        return _TOKENIZER_LOCKS.setdefault(processing_class, threading.RLock())


class ChatTemplating:
    """The trainer's chat templating as the rollout collector uses it: calling it is :func:`tokenize_prompts`;
    :meth:`render` tokenizes one chat with or without the generation prompt as ``_tokenize_prompts`` does (the
    trainer's ``processing_class``, ``chat_template`` and ``chat_template_kwargs``); :meth:`decode` is the
    completions' text; :attr:`stop_ids` are the ids TRL's generation stops at. Each call holds the tokenizer's
    :func:`tokenizer_lock`. Relies on ``GRPOTrainer.chat_template``, ``chat_template_kwargs`` and
    ``eos_token_ids``."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.lock = tokenizer_lock(trainer.processing_class)

    def __call__(self, messages: list[list[dict]]) -> list[list[int]]:
        with self.lock:
            return tokenize_prompts(self.trainer, messages)

    def render(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        t = self.trainer
        with self.lock:
            ids = t.processing_class.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                         tokenize=True, return_dict=False,
                                                         chat_template=t.chat_template, **t.chat_template_kwargs)
        return list(ids[0] if ids and isinstance(ids[0], list) else ids)  # a processor returns a batch

    def decode(self, completion_ids: list[list[int]]) -> list[str]:
        """The text of each completion, special tokens skipped (``processing_class.batch_decode``)."""
        with self.lock:
            return self.trainer.processing_class.batch_decode(completion_ids, skip_special_tokens=True)

    @property
    def stop_ids(self) -> list[int]:
        return list(self.trainer.eos_token_ids)


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
    """Tell TRL that vLLM already holds this step's weights, so the next generate call does not sync them
    (:mod:`gigpo_trl.generation.weight_sync` pushes them itself, on a weights version). Relies on ``_generate_single_turn``
    syncing only when ``state.global_step != _last_loaded_step``."""
    trainer._last_loaded_step = trainer.state.global_step


def iter_named_params(vllm_generation):
    """``(name, tensor)`` pairs of the trainer's weights as TRL's vLLM sync pushes them (PEFT merged, ZeRO-3 / FSDP
    gathered). Relies on ``VLLMGeneration._iter_named_params()``."""
    return vllm_generation._iter_named_params()


# ---------------------------------------------------------------- TRL VLLMClient: HTTP to the server
def vllm_post(client, url: str, **kwargs) -> dict:
    """POST to the vLLM server through TRL's client: the answer's JSON. Relies on ``VLLMClient._post(url,
    **kwargs)`` (``session.post`` with those arguments; an exception naming the status on an answer other than
    200)."""
    return client._post(url, **kwargs)


def vllm_client_session(client):
    """The ``requests.Session`` (or stand-in) ``client`` (a TRL ``VLLMClient``) sends through; ``None`` without one."""
    return getattr(client, "session", None)


def set_vllm_client_session(client, session) -> None:
    """Make ``client`` send through ``session`` (anything with ``get(url, **kw)`` / ``post(url, **kw)`` returning a
    ``requests.Response``). Relies on every HTTP request of ``VLLMClient`` after its ``__init__`` going through
    ``self.session.get`` / ``self.session.post`` (its ``check_server`` sends on its own, at construction)."""
    client.session = session


# ---------------------------------------------------------------- TRL VLLMGeneration: the weight walk
def vllm_gather_params(vllm_generation, params: list):
    """Context manager holding ``params`` gathered (ZeRO-3; no-op otherwise and under FSDP) for the duration of a
    weight walk. Relies on ``VLLMGeneration._dist`` (a ``trl.distributed.DistributedBackend``) and its
    ``gather_params(list of parameters)``, what TRL's ``_iter_named_params`` enters around a PEFT merge."""
    return vllm_generation._dist.gather_params(params)


def vllm_uses_fsdp(vllm_generation) -> bool:
    """Whether the trainer's model is FSDP-sharded (TRL then walks it module by module). Relies on
    ``VLLMGeneration._dist.is_fsdp``."""
    return bool(vllm_generation._dist.is_fsdp)


def vllm_param_name(vllm_generation, name: str, extra_prefixes: list[str]) -> str:
    """The parameter name vLLM expects for the trainer's ``name`` (wrapper prefixes removed). Relies on
    ``VLLMGeneration._fix_param_name_to_vllm(name, extra_prefixes=…)``."""
    return vllm_generation._fix_param_name_to_vllm(name, extra_prefixes=extra_prefixes)


def replace_iter_named_params(vllm_generation, walk) -> None:
    """Make every TRL weight sync (``sync_weights``, all modes) and :func:`iter_named_params` read ``walk()`` (a
    zero-argument callable returning ``(name, tensor)`` pairs) instead of TRL's own walk. Relies on
    ``VLLMGeneration.sync_weights`` calling ``self._iter_named_params()`` (an instance attribute shadows it)."""
    vllm_generation._iter_named_params = walk


# ---------------------------------------------------------------- transformers / TRL forwards: positions
def install_position_ids_pre_hook(backbone, positions_fn) -> None:
    """Fill ``position_ids`` = ``positions_fn(attention_mask)`` in every forward of the decoder ``backbone`` that is
    called without them, with a ``(B, L)`` mask as wide as the input and no filled KV cache; the removable handle is
    stored as ``backbone._gigpo_mask_positions``.

    Relies on: TRL's forwards (``_get_per_token_logps_and_entropies``, the fused LM head through
    ``model.base_model``) passing no ``position_ids``, so that transformers numbers the padded row 0..L-1; and the
    decoder backbones' ``forward(input_ids, attention_mask, position_ids, past_key_values, inputs_embeds, …)``
    (transformers 5 ``Qwen2Model`` / ``LlamaModel`` order: a third positional argument is ``position_ids``).
    """
    import torch

    def hook(module, args, kwargs):
        if kwargs.get("position_ids") is not None or len(args) > 2:
            return None
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        inputs = kwargs.get("input_ids", args[0] if args else None)
        if inputs is None:
            inputs = kwargs.get("inputs_embeds")
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or inputs is None or mask.shape[1] != inputs.shape[1]:
            return None
        cache = kwargs.get("past_key_values")
        if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
            return None
        kwargs["position_ids"] = positions_fn(mask)
        return args, kwargs

    backbone._gigpo_mask_positions = backbone.register_forward_pre_hook(hook, with_kwargs=True)


def decoder_layers(model) -> list:
    """The decoder layers of ``model`` in module order (PEFT, DDP and DeepSpeed wrappers included): its transformers 5
    ``GradientCheckpointingLayer`` modules, or ``[]``."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def cache_under_checkpointing(model):
    """Context manager: the decoder layers of ``model`` keep a passed ``past_key_values`` under gradient
    checkpointing (else ``GradientCheckpointingLayer.__call__`` drops it in training). Only for caches whose
    ``update`` stores nothing a checkpoint replay could change (:mod:`gigpo_trl.forward.prefix`). Relies on
    transformers 5's ``GradientCheckpointingLayer._can_checkpoint_with_cache`` class flag (an instance attribute
    shadows it; removed on exit)."""
    import contextlib

    @contextlib.contextmanager
    def context():
        layers = [m for m in decoder_layers(model) if "_can_checkpoint_with_cache" not in vars(m)]
        for m in layers:
            m._can_checkpoint_with_cache = True
        try:
            yield
        finally:
            for m in layers:
                del m._can_checkpoint_with_cache

    return context()


def fused_lm_head_labelled_only():
    """Context manager: TRL's fused LM head (``add_fused_lm_head``, the loss of ``SFTTrainer``) projects only the
    positions that carry a label (≠ −100) on every device, as TRL already does on CUDA/XPU. TRL 1.16 projects every
    position elsewhere (its reason: tile shapes that change per batch recompile on Neuron), so on a CPU a
    completion-only SFT row, mostly prompt, pays the vocabulary-wide LM head, forward and backward, on every prompt
    position (the warm-up's cost of it: ``benchmarks/experiments/warmup.md``). The log-probs,
    loss and gradients are the same numbers up to float summation order (``test_fused_lm_head_labelled_only``).
    Relies on ``trl.trainer.utils._use_triton`` deciding only that choice in ``add_fused_lm_head``'s forward (the
    chunked kernel's own tile fold reads ``trl.kernels.chunked_logprob._use_triton``, left as it is); restored on
    exit."""
    import contextlib

    from trl.trainer import utils as trl_utils

    @contextlib.contextmanager
    def context():
        original = trl_utils._use_triton
        trl_utils._use_triton = lambda device: True
        try:
            yield
        finally:
            trl_utils._use_triton = original

    return context()


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


def buffered_micro_batch(trainer, generation_batch, generate_and_split):
    """The training micro-batch of ``GRPOTrainer._prepare_inputs`` with the caller's split: when TRL would
    generate (:func:`rollout_position`'s rule: ``_step % (steps_per_generation × num_iterations) == 0`` or nothing
    buffered), ``_buffered_inputs = generate_and_split(generation_batch)``, a list of ``steps_per_generation``
    micro-batch dicts (in place of TRL's ``_generate_and_score_completions``, pixel-grid split, row shuffle and
    ``split_tensor_dict``); returns ``_buffered_inputs[_step % steps_per_generation]``. ``_step`` is left to
    ``GRPOTrainer.training_step``, which advances it after each micro-step. Relies on ``_step``,
    ``_buffered_inputs`` and that rule. Raises ``ValueError`` when ``generate_and_split`` returns another number of
    micro-batches."""
    generate_every = trainer.args.steps_per_generation * trainer.num_iterations
    if trainer._step % generate_every == 0 or trainer._buffered_inputs is None:
        batches = list(generate_and_split(generation_batch))
        if len(batches) != trainer.args.steps_per_generation:
            raise ValueError(f"generate_and_split returned {len(batches)} micro-batches, expected "
                             f"steps_per_generation={trainer.args.steps_per_generation}")
        trainer._buffered_inputs = batches
    return trainer._buffered_inputs[trainer._step % trainer.args.steps_per_generation]


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


# ---------------------------------------------------------------- TextWorld text generation (ALFWorld's engine)
def textgen_parse_and_convert(textgen):
    """TextWorld's grammar-string reader, ``textgen._parse_and_convert(text, rule_name=..., **kwargs)`` -> a list of
    fresh symbol objects (``textgen`` is ``textworld.envs.pddl.textgen``); what ALFWorld's feedback and admissible
    commands are derived through, every step."""
    return textgen._parse_and_convert


def textgen_parse(textgen):
    """``textgen._PARSER.parse(text, rule_name=...)``: the tatsu PEG parse tree of a grammar string, a pure function
    of ``(text, rule_name)`` that :func:`textgen_converter`'s ``walk`` reads without changing it."""
    return textgen._PARSER.parse


def textgen_converter(textgen):
    """``textgen._Converter``: the class whose ``walk(tree)`` turns a parse tree into fresh symbol objects (a new
    object per call: derivations mutate them)."""
    return textgen._Converter


def set_textgen_parse_and_convert(textgen, fn) -> None:
    """Replace ``textgen._parse_and_convert`` (module global that ``ContextSensitiveGrammar`` calls by name) with
    ``fn``, which must take the same arguments and return the same symbols."""
    textgen._parse_and_convert = fn
