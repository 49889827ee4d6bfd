"""Numbers that hold in bf16: padding-invariant positions, LoRA weights merged out of place, a DeepSpeed step guard.

Three things a CPU suite in fp32 never shows (issue 20):

- **Positions from the attention mask.** A decoder called without ``position_ids`` (TRL's forwards pass none) numbers
  the columns 0..L-1 of the *padded* row, so a left-padded token sits at another position in a batch of another
  width. Rotary models then see another rotation: in bf16 the per-token log-probs of the same row move by ~1e-3
  between the scoring pass and a training sub-batch trimmed to another width (π/π_old ≠ 1 on-policy).
  :func:`install_mask_positions` makes every forward without ``position_ids`` use ``cumsum(mask) − 1``, what
  ``transformers``' ``generate`` (``GenerationMixin._prepare_position_ids_for_generation``) and vLLM use.
- **LoRA merged out of place.** TRL's weight sync to vLLM (``VLLMGeneration._iter_named_params``) calls PEFT's
  ``merge_adapter()`` then ``unmerge_adapter()``: ``W += ΔW; W -= ΔW`` in the weights' dtype, which in bf16 does
  not give W back (one ulp on a third of the elements per sync, accumulating). :func:`merged_lora_weight` computes
  ``(W + Σ scale·B·A)`` from an fp32 product into a new tensor and casts once; the base weights are never written.
- **DeepSpeed's step count.** :class:`DeepSpeedStepGuard` checks after every optimizer step that the engine
  stepped exactly once (the token-budget sub-batches rely on accelerate's ``sync_gradients`` handling for that).
"""

from __future__ import annotations

import contextlib
import inspect
import logging

import torch
from transformers import TrainerCallback

from . import trl_compat

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- positions
def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position of every column of a padded ``(B, L)`` 0/1 mask: ``cumsum − 1`` over the row's real tokens, 0 at
    padded columns (``transformers`` 5 ``generate``'s rule). Returns a ``(B, L)`` long tensor."""
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


def _backbone(model):
    """The decoder module whose forward takes ``position_ids`` (``Qwen2Model`` inside ``Qwen2ForCausalLM``), through
    accelerate/DeepSpeed wrappers (``.module``) and PEFT (``get_base_model``). TRL's fused LM head calls exactly
    this module (``getattr(model, "base_model")``, ``trl.trainer.utils.add_fused_lm_head``)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return getattr(model, "base_model", model), model


def install_mask_positions(model) -> bool:
    """Make every forward of ``model`` that passes no ``position_ids`` use :func:`positions_from_mask` of its 2-D
    attention mask, so a row's outputs do not depend on the left padding its batch carries.

    A forward pre-hook on the decoder backbone (see :func:`_backbone`) fills ``position_ids`` only when it is
    missing or ``None``, the attention mask is a ``(B, L)`` tensor as wide as the input, and no KV cache holds past
    tokens; ``generate`` (which passes its own, identical positions), cached decoding and packed inputs are untouched.
    Models whose backbone takes no ``position_ids`` or that number positions themselves from other inputs
    (multimodal rotary, ``config.vision_config``) are left as they are. Idempotent.

    The hook itself relies on how TRL and transformers call the backbone: see
    :func:`gigpo_trl.trl_compat.install_position_ids_pre_hook`.

    Returns:
        Whether the hook is (now) installed; its handle is ``backbone._gigpo_mask_positions``.
    """
    backbone, top = _backbone(model)
    if getattr(backbone, "_gigpo_mask_positions", None) is not None:
        return True
    try:
        accepts = "position_ids" in inspect.signature(backbone.forward).parameters
    except (TypeError, ValueError):
        accepts = False
    config = getattr(top, "config", None)
    if not accepts or backbone is top or getattr(config, "vision_config", None) is not None:
        return False

    trl_compat.install_position_ids_pre_hook(backbone, positions_from_mask)
    return True


def is_on_policy_micro_step(micro_step: int, generate_every: int, gradient_accumulation_steps: int) -> bool:
    """Whether TRL's micro-step ``micro_step`` (``GRPOTrainer._step``) trains with the weights its rollout was
    generated with: no optimizer step falls between the micro-step that generated (``micro_step −
    micro_step % generate_every``) and this one, i.e. no multiple of ``gradient_accumulation_steps`` in
    ``(start, micro_step]``. ``generate_every`` = ``steps_per_generation × num_iterations``."""
    if generate_every < 1 or gradient_accumulation_steps < 1:
        raise ValueError(f"generate_every={generate_every} and gradient_accumulation_steps="
                         f"{gradient_accumulation_steps} must be >= 1")
    start = micro_step - micro_step % generate_every
    return micro_step // gradient_accumulation_steps == start // gradient_accumulation_steps


def current_policy_as_old(inputs: dict) -> dict:
    """``inputs`` without ``old_per_token_logps``: TRL's ``_compute_loss`` then uses the training forward's own
    log-probs (detached) as π_old, so the ratio π/π_old is exactly 1. Right for an on-policy micro-step
    (:func:`is_on_policy_micro_step`), where π_old is the current policy: the scoring pass that produced the stored
    values ran with other shapes (other padding, other sub-batches), and in bf16 the kernels' rounding then differs
    by ~1e-3 in log-prob, enough to clip tokens spuriously. vLLM's importance-sampling ratio, computed from the stored
    values at scoring time, is left as it is."""
    return {key: value for key, value in inputs.items() if key != "old_per_token_logps"}


class ExactOnPolicyRatioMixin:
    """``_prepare_inputs`` for a ``GRPOTrainer`` subclass (mixed in before it): TRL's micro-batch, and on an
    on-policy micro-step (:func:`is_on_policy_micro_step`) π_old is the training forward's own log-probs (exact ratio
    1 in bf16, see :func:`current_policy_as_old`). TRL's hook: listed in :mod:`gigpo_trl.trl_compat`."""

    def _prepare_inputs(self, generation_batch):
        inputs = super()._prepare_inputs(generation_batch)
        generate_every = self.args.steps_per_generation * self.num_iterations
        micro_step = trl_compat.rollout_position(self)[0]
        if self.model.training and is_on_policy_micro_step(micro_step, generate_every,
                                                            self.args.gradient_accumulation_steps):
            inputs = current_policy_as_old(inputs)
        return inputs


# ---------------------------------------------------------------------------------------------- LoRA merge
def _lora_layers(model):
    """``{id(parameter): (lora layer, "weight" | "bias")}`` for every base weight (and merged bias) a PEFT LoRA
    layer would change on ``merge_adapter()``."""
    from peft.tuners.lora import LoraLayer

    found = {}
    for module in model.modules():
        if isinstance(module, LoraLayer):
            base = module.get_base_layer()
            found[id(base.weight)] = (module, "weight")
            if getattr(base, "bias", None) is not None:
                found[id(base.bias)] = (module, "bias")
    return found


def _adapters_to_merge(layer) -> list[str]:
    """The adapters PEFT's ``merge()`` would merge into ``layer`` now (``peft.tuners.tuners_utils.
    check_adapters_to_merge``): the active ones it holds that are not merged already; none when adapters are
    disabled."""
    if getattr(layer, "disable_adapters", False):
        return []
    held = set(getattr(layer, "lora_A", {}).keys()) | set(getattr(layer, "lora_embedding_A", {}).keys())
    merged = set(getattr(layer, "merged_adapters", []))
    return [a for a in layer.active_adapters if a in held and a not in merged]


def out_of_place_merge_supported(model) -> str | None:
    """``None`` when every LoRA layer of ``model`` is a plain additive one :func:`merged_lora_weight` can merge
    (``nn.Linear``/``Conv1D`` or ``nn.Embedding`` base, no DoRA or other ``lora_variant``); else the reason."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        adapters = _adapters_to_merge(module)
        if not adapters:
            continue
        if any(a in getattr(module, "lora_variant", {}) for a in adapters):
            return f"{name} uses a LoRA variant (e.g. DoRA), whose merge is not W + scale·B·A"
        if not (set(adapters) <= set(getattr(module, "lora_A", {}).keys())
                or set(adapters) <= set(getattr(module, "lora_embedding_A", {}).keys())):
            return f"{name} mixes adapter kinds"
        if getattr(module, "lora_A", {}) and module.get_base_layer().weight.dim() != 2:
            return f"{name} is a {type(module).__name__} LoRA layer (only Linear/Conv1D/Embedding are merged)"
    return None


def merged_lora_weight(layer, kind: str, base: torch.Tensor) -> torch.Tensor:
    """The weight (``kind="weight"``) or bias (``"bias"``) PEFT's ``merge()`` would leave in ``layer``'s base layer,
    as a new tensor: ``base + Σ_a scaling[a] · (B_a @ A_a)`` (transposed for ``fan_in_fan_out`` / embeddings; bias:
    ``base + Σ scaling[a] · lora_B[a].bias`` when ``lora_bias``) over the adapters it would merge, computed in fp32
    and cast once to ``base.dtype``. ``base`` (the current, possibly gathered, base tensor) is only read.

    Source: ``peft.tuners.lora.layer.Linear.merge`` / ``get_delta_weight`` and ``Embedding.merge`` (peft 0.21).
    """
    adapters = _adapters_to_merge(layer)
    if not adapters:
        return base
    total = base.detach().float()
    for a in adapters:
        scale = layer.scaling[a]
        if a in getattr(layer, "lora_embedding_A", {}):
            if kind == "bias":
                continue
            # Embedding: weight_B @ weight_A is (dim, vocab); the base weight is (vocab, dim)
            delta = (layer.lora_embedding_B[a].detach().float() @ layer.lora_embedding_A[a].detach().float()).T
        elif kind == "bias":
            if not getattr(layer, "lora_bias", {}).get(a, False):
                continue
            delta = layer.lora_B[a].bias.detach().float()
        else:
            delta = layer.lora_B[a].weight.detach().float() @ layer.lora_A[a].weight.detach().float()
            if getattr(layer, "fan_in_fan_out", False):
                delta = delta.T
        total = total + delta.to(total.device) * scale
    return total.to(base.dtype)


def iter_merged_named_params(model, named_params):
    """``(name, tensor)`` for ``named_params`` (``model.named_parameters()`` or a subset), where each base weight
    (bias) of a LoRA layer is replaced by :func:`merged_lora_weight`'s out-of-place merge; other tensors are the
    parameters' ``.data`` as they are. Lazy: one merged tensor exists at a time."""
    targets = _lora_layers(model)
    for name, param in named_params:
        target = targets.get(id(param))
        yield name, (param.data if target is None else merged_lora_weight(target[0], target[1], param.data))


# ---------------------------------------------------------------------------------------------- fp32 accumulation
class Fp32GradAccumulator:
    """Sum the gradients of a micro-batch's token-budget sub-batches in fp32 when the trainable parameters are bf16
    (or fp16), so k sub-batches cost two roundings of ``.grad`` instead of k.

    Protocol (:meth:`gigpo_trl.token_budget.TokenBudgetMixin.compute_loss`): :meth:`stash` before each backward of
    the sub-batches but the last (moves ``.grad``, i.e. earlier micro-batches' gradients and the previous
    sub-batch's, into an fp32 buffer and clears it, so each backward writes its own gradient exactly), once more
    after them, then :meth:`restore` (``.grad`` = the buffer cast once); the last sub-batch's backward then adds
    into that ``.grad`` as usual. Measured, relative gradient error against fp32 on the same weights: 16 unpadded
    one-row sub-batches of a bf16 tiny Qwen2 (benchmarks/bench_bf16_accumulation.py) 7.2e-3 to 7.5e-3 summed in
    bf16, 5.3e-3 to 5.6e-3 in fp32 (5.6e-3 to 5.9e-3 for one backward); through the trainer, 32 one-row sub-batches
    of rollout rows (tests/test_numerics.py) 5.7e-2 summed in bf16, 2.6e-2 in fp32 (3.4e-1 for one padded backward
    of all 32).

    Memory: one fp32 copy of the trainable parameters' gradients while a micro-batch runs (LoRA: the adapter only).
    Not used under DeepSpeed or FSDP, which own the gradients (see :meth:`for_model`).
    """

    def __init__(self, params):
        self.params = list(params)
        self.buffer: dict[int, torch.Tensor] = {}

    @classmethod
    def for_model(cls, model, owns_gradients: bool):
        """An accumulator over ``model``'s trainable bf16/fp16 parameters, or ``None`` when there are none or when
        ``owns_gradients`` is False (DeepSpeed, FSDP: their engines keep the gradients)."""
        if not owns_gradients:
            return None
        params = [p for p in model.parameters() if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16)]
        return cls(params) if params else None

    def stash(self) -> None:
        """Add every ``.grad`` to the fp32 buffer and clear it."""
        for p in self.params:
            if p.grad is None:
                continue
            held = self.buffer.get(id(p))
            if held is None:
                self.buffer[id(p)] = p.grad.detach().float()
            else:
                held.add_(p.grad.detach().float())
            p.grad = None

    def restore(self) -> None:
        """Set every ``.grad`` to its buffered sum, cast once to the parameter's dtype; empty the buffer."""
        for p in self.params:
            held = self.buffer.pop(id(p), None)
            if held is not None:
                p.grad = held.to(p.dtype)


# ---------------------------------------------------------------------------------------------- DeepSpeed steps
class DeepSpeedStepGuard(TrainerCallback):
    """``TrainerCallback`` that checks, after every optimizer step under DeepSpeed, that the engine made exactly as
    many optimizer steps as ``Trainer`` counts (``engine.global_steps − state.global_step`` stays what it was at the
    start of training: 0 for a fresh run, also 0 after a resume, which restores both).

    With token-budget sub-batches, the engine must step once per accumulation window, at the last backward of its
    last micro-batch; that holds because accelerate 1.15's ``Accelerator.backward`` sets DeepSpeed's accumulation
    boundary from ``gradient_state.sync_gradients``, which the trainer clears for all but the last sub-batch. A
    change of that handling would silently step the engine per sub-batch (or never): this turns it into an error.
    No effect without DeepSpeed (no engine with a ``global_steps`` count).

    Args:
        get_engine: zero-argument callable returning the DeepSpeed engine (``trainer.model_wrapped``) or any other
            model (then the guard does nothing).

    Raises (from ``on_step_end``):
        RuntimeError: the counts diverged; the message names both counts and the installed accelerate version.
    """

    def __init__(self, get_engine):
        self._get_engine = get_engine
        self._offset = None

    def on_train_begin(self, args, state, control, **kwargs):
        steps = getattr(self._get_engine(), "global_steps", None)
        self._offset = None if steps is None else steps - state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        if self._offset is None:
            return
        steps = self._get_engine().global_steps - self._offset
        if steps != state.global_step:
            import accelerate

            raise RuntimeError(
                f"DeepSpeed's engine made {steps} optimizer step(s) but Trainer counts state.global_step="
                f"{state.global_step}: the token-budget sub-batches hold DeepSpeed's accumulation boundary through "
                f"accelerate's gradient_state.sync_gradients, and accelerate {accelerate.__version__} handles it "
                "differently from the tested 1.15; pin accelerate==1.15.* or set max_tokens_per_microbatch=None"
            )
