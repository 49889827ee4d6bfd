"""Shared prompt prefixes, the trainer's side: :class:`PrefixSharingMixin` runs every forward over training rows
(TRL's ``_get_per_token_logps_and_entropies``, called by the loss and by the scoring passes) with each prompt prefix
that rows share computed once, when ``args.share_prompt_prefix`` is on and the model supports it.

:mod:`gigpo_trl.prefix_sharing` plans the groups and runs the shared forward (model-level functions); this mixin
decides when to use it and keeps TRL's contract (same values as TRL's forward up to float rounding).
"""

from __future__ import annotations

import logging

import torch

from .prefix_sharing import plan_prefix_groups, prompts_from_batch, shared_prefix_logps, unsupported_reason

logger = logging.getLogger(__name__)


class PrefixSharingMixin:
    """TRL's per-token log-prob hook with shared prompt prefixes (mixed into a ``GRPOTrainer`` subclass, before it in
    the bases; :class:`~gigpo_trl.token_budget.TokenBudgetMixin` builds on it)."""

    def _prefix_sharing_reason(self, model, training: bool) -> str | None:
        """``None`` when forwards of ``model`` share prompt prefixes, else why not (warned once per reason):
        ``share_prompt_prefix`` off, the model's attention (:func:`~gigpo_trl.prefix_sharing.unsupported_reason`),
        reentrant gradient checkpointing in a training forward (its replay cannot send gradient back into a
        prefix computed outside the checkpointed layer)."""
        if not self.args.share_prompt_prefix:
            return "share_prompt_prefix=False"
        cache = vars(self).setdefault("_prefix_sharing_checked", {})
        if id(model) not in cache:
            cache[id(model)] = unsupported_reason(model)
        reason = cache[id(model)]
        if reason is None and training and self.args.gradient_checkpointing and \
                (self.args.gradient_checkpointing_kwargs or {}).get("use_reentrant"):
            reason = "reentrant gradient checkpointing (gradient_checkpointing_kwargs={'use_reentrant': True})"
        if reason is not None:
            warned = vars(self).setdefault("_prefix_sharing_warned", set())
            if reason not in warned:
                warned.add(reason)
                logger.warning("share_prompt_prefix: every row is computed whole (no shared prefix): %s", reason)
        return reason

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **kwargs):
        """TRL's hook (see :mod:`gigpo_trl.trl_compat`): ``(logps, entropies, aux_loss)`` of the last
        ``logits_to_keep`` columns, in chunks of ``batch_size`` rows, each chunk computed with shared prompt
        prefixes (:func:`~gigpo_trl.prefix_sharing.shared_prefix_logps`; same values as TRL's forward up to float
        rounding). TRL's own forward runs instead when sharing is off or unsupported (:meth:`_prefix_sharing_reason`),
        for an MoE aux loss or multimodal inputs, and, on a single process, for a chunk where sharing would not
        reduce the padded tokens (with several processes every chunk takes the same two forwards, so that ZeRO-3's
        parameter gathers stay in step across ranks)."""
        grad = torch.is_grad_enabled() and getattr(model, "training", False)
        if (compute_aux_loss or any(v is not None for v in kwargs.values())
                or self._prefix_sharing_reason(model, training=grad) is not None):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss,
                **kwargs)
        batch_size = batch_size or input_ids.size(0)
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            ids, mask = input_ids[start : start + batch_size], attention_mask[start : start + batch_size]
            plan = plan_prefix_groups(prompts_from_batch(ids, mask, logits_to_keep), logits_to_keep)
            if self.accelerator.num_processes == 1 and plan.padded_tokens() >= plan.unshared_tokens():
                lp, ent, _ = super()._get_per_token_logps_and_entropies(
                    model, ids, mask, logits_to_keep, None, compute_entropy)
            else:
                lp, ent = shared_prefix_logps(model, ids, mask, logits_to_keep, plan, compute_entropy,
                                              self.accelerator.autocast)
            logps.append(lp)
            entropies.append(ent)
        return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None
