"""Shared-prefix forward: rows of one forward that start with the same tokens compute those tokens once.

GiGPO trains one row per (trajectory, turn), so the rows of a group repeat the system prompt, the tool/action
schema and the task text, and the rows of a trajectory repeat its history. The forward over such rows
(:func:`shared_prefix_logps`) runs in two passes:

1. **prefix pass**: one row per prefix group, ``(G, P)`` left-padded, with a recording key/value cache
   (:class:`_RecordLayer`); gradient enabled, so the prefix's keys/values keep their autograd history;
2. **suffix pass**: every row's remaining tokens, ``(B, S)``, whose attention reads its group's prefix keys/values
   through a read-only cache (:class:`_ReadLayer`: ``cat([prefix[group of row], own])`` per layer), with the 2-D
   attention mask ``[prefix mask of its group | own mask]`` and positions continuing after the prefix
   (``Lp + cumsum(mask) − 1``, the rule of :func:`gigpo_trl.forward.positions.positions_from_mask` on the unshared row).
   The gradient of the suffix tokens flows back through the cache into the prefix pass.

Every query sees exactly the keys/values, positions and mask it sees in the unshared forward, so the result equals
the unshared forward up to floating-point summation order (tests/test_prefix_sharing.py pins fp32 log-probs and
gradients to 1e-5 relative, bf16 to what padding alone moves). Neither cache stores anything across calls of
``update``, so gradient checkpointing's recomputation (which replays ``update``) gives the same tensors; the
decoder layers must be allowed to keep the cache under checkpointing
(:func:`gigpo_trl.trl_compat.cache_under_checkpointing`).

Why not ``prefix-grouper`` (PyPI 0.0.1.post1): it needs model-file edits for positions and attention, one prefix
per group (the prompt), its own packed layout and by default flash-attention; here the model, TRL's fused LM head,
PEFT, checkpointing and DeepSpeed are used as they are, through transformers' public ``Cache`` API.

Why not one packed row with a prefix-tree mask: a dense ``(L, L)`` mask over all rows costs O((ΣL)²) memory in
eager/SDPA attention; the two passes cost ``G·P + B·S`` tokens and ``B·S·(P+S)`` attention, like the unshared
forward minus the prefixes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer

from .. import trl_compat
from .positions import positions_from_mask
from .layout import TokenKeys, as_keys, forward_tokens, key_common_prefix

SUPPORTED_ATTENTION = ("eager", "sdpa")


# ---------------------------------------------------------------------------------------------- planning (pure)
@dataclass(frozen=True)
class PrefixPlan:
    """Which rows share which prefix.

    Attributes:
        group_of_row: per row, its prefix group index, or -1 (no shared prefix: the whole row runs in the suffix).
        prefix_lengths: per group, the prefix length in tokens (>= 1).
        representative: per group, a row whose first ``prefix_lengths[g]`` prompt tokens are the prefix.
        prompt_lengths: per row, its (unpadded) prompt length.
        completion_width: the completion columns every row keeps (``logits_to_keep``).
    """

    group_of_row: tuple[int, ...]
    prefix_lengths: tuple[int, ...]
    representative: tuple[int, ...]
    prompt_lengths: tuple[int, ...]
    completion_width: int

    def prefix_of_row(self, i: int) -> int:
        g = self.group_of_row[i]
        return 0 if g < 0 else self.prefix_lengths[g]

    @property
    def prefix_width(self) -> int:
        """Padded width of the prefix pass (0 without groups)."""
        return max(self.prefix_lengths, default=0)

    @property
    def suffix_prompt_width(self) -> int:
        """Padded width of the prompt part of the suffix pass (>= 1)."""
        return max((p - self.prefix_of_row(i) for i, p in enumerate(self.prompt_lengths)), default=1)

    def padded_tokens(self) -> int:
        """``input_ids.numel()`` summed over both passes: ``G·P + B·(S + C)``."""
        return forward_tokens(len(self.prompt_lengths), self.suffix_prompt_width, self.completion_width,
                              len(self.prefix_lengths), self.prefix_width)

    def unshared_tokens(self) -> int:
        """``input_ids.numel()`` of the unshared forward over the same rows (prompts padded to the longest)."""
        return forward_tokens(len(self.prompt_lengths), max(self.prompt_lengths, default=1), self.completion_width)

    def computed_tokens(self, real_tokens: int) -> int:
        """Real tokens the two passes compute over rows holding ``real_tokens`` real tokens: each shared prefix once,
        plus the one-token dummy prefix of a plan without groups (:func:`shared_prefix_forward`)."""
        return real_tokens - self.saved_tokens() + (0 if self.prefix_lengths else 1)

    def saved_tokens(self) -> int:
        """Real (unpadded) tokens the prefix pass computes once instead of once per row."""
        sizes = [0] * len(self.prefix_lengths)
        for g in self.group_of_row:
            if g >= 0:
                sizes[g] += 1
        return sum((n - 1) * length for n, length in zip(sizes, self.prefix_lengths))


def plan_prefix_groups(prompts: Sequence[Sequence[int] | None] | TokenKeys, completion_width: int,
                       min_prefix: int = 1, shared_next: bool = False) -> PrefixPlan:
    """Group rows by common token prefix of their prompts (pure).

    Rows are sorted by prompt; the adjacent longest common prefixes (each row's capped at its prompt length − 1,
    so that the last prompt token, which predicts the first completion token, stays in the row's own suffix) form
    a tree: a range of rows either becomes one group with their common prefix, or splits where that prefix is
    shortest; the choice with more tokens saved (``Σ (rows − 1) × prefix``) wins, ties to one group. Rows left alone
    either run whole in the suffix pass or, when that pads less, form a group of their own (prefix = prompt − 1),
    whichever gives the fewer padded tokens (:meth:`PrefixPlan.padded_tokens`).

    Args:
        prompts: per row, its prompt token ids (unpadded) or their key (:class:`~gigpo_trl.forward.layout.TokenKeys`,
            compared exactly in C: rows share a prefix only when its tokens are equal); ``None`` (a prompt mask
            that is not one run, :func:`~gigpo_trl.forward.layout.rows_of_batch`): an empty prompt, the row shares
            nothing.
        completion_width: the completion columns of the forward.
        min_prefix: shortest prefix worth a group.
        shared_next: the token right after a group's prefix is also the same in every row of the group (each
            common prefix counts one token less), so that the prefix pass can score it
            (:func:`shared_prefix_forward` with ``prefix_labels``).

    Returns:
        A :class:`PrefixPlan` (possibly without groups). Deterministic for the same input.
    """
    keys = [key if key is not None else b"" for key in as_keys(prompts)]
    n = len(keys)
    lengths = tuple(len(key) // 4 for key in keys)
    order = sorted(range(n), key=lambda i: (keys[i], i))
    cap = [max(0, length - 1) for length in lengths]
    margin = 1 if shared_next else 0
    adj = [max(0, min(key_common_prefix(keys[order[k]], keys[order[k + 1]]) - margin, cap[order[k]],
                      cap[order[k + 1]])) for k in range(n - 1)]
    groups: list[tuple[list[int], int]] = []

    def best(lo: int, hi: int) -> tuple[int, list[tuple[list[int], int]]]:
        """(tokens saved, groups) over sorted positions lo..hi inclusive."""
        if lo >= hi:
            return 0, []
        m = min(adj[lo:hi])
        one = (hi - lo) * m if m >= min_prefix else -1
        split_value, split_groups, start = 0, [], lo
        for k in range(lo, hi + 1):
            if k == hi or adj[k] == m:
                value, found = best(start, k)
                split_value += value
                split_groups += found
                start = k + 1
        if m == 0 or split_value > one:
            return split_value, split_groups
        return one, [([order[k] for k in range(lo, hi + 1)], m)]

    # iterate over the top-level ranges split at LCP 0 to keep the recursion shallow
    start = 0
    for k in range(n):
        if k == n - 1 or adj[k] == 0:
            groups += best(start, k)[1]
            start = k + 1

    def build(with_singletons: bool) -> PrefixPlan:
        group_of_row = [-1] * n
        prefix, rep = [], []
        for rows, length in groups:
            for r in rows:
                group_of_row[r] = len(prefix)
            prefix.append(length)
            rep.append(min(rows))
        if with_singletons:
            for r in range(n):
                if group_of_row[r] < 0 and cap[r] >= min_prefix:
                    group_of_row[r] = len(prefix)
                    prefix.append(cap[r])
                    rep.append(r)
        return PrefixPlan(tuple(group_of_row), tuple(prefix), tuple(rep), lengths, completion_width)

    plans = [build(False), build(True)]
    return min(plans, key=lambda p: (p.padded_tokens(), len(p.prefix_lengths)))


# ---------------------------------------------------------------------------------------------- caches
class _RecordLayer(DynamicLayer):
    """Prefix pass: keeps the last ``update``'s keys/values (replaced, not appended: a checkpoint replay of the
    layer stores the same values again) and reports an empty cache to the mask builder."""

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self.values = key_states, value_states
        return key_states, value_states

    def get_seq_length(self) -> int:
        return 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return query_length, 0


class _ReadLayer(DynamicLayer):
    """Suffix pass: returns ``cat([prefix[index], new])`` along the sequence and stores nothing (so a checkpoint
    replay computes the same tensors and the prefix keeps its autograd history)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, index: torch.Tensor):
        super().__init__()
        self.prefix_keys, self.prefix_values, self.index = keys, values, index
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        keys = torch.cat([self.prefix_keys.index_select(0, self.index), key_states], dim=-2)
        values = torch.cat([self.prefix_values.index_select(0, self.index), value_states], dim=-2)
        return keys, values

    def get_seq_length(self) -> int:
        return self.prefix_keys.shape[-2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.prefix_keys.shape[-2] + query_length, 0


# ---------------------------------------------------------------------------------------------- support checks
def unsupported_reason(model) -> str | None:
    """``None`` when ``model``'s attention can run the shared-prefix forward, else why not: a decoder whose
    attention implementation is eager or SDPA (a 2-D padding mask over past + new keys), full attention in every
    layer (no sliding window, no linear/recurrent layers), text only."""
    top = model
    while hasattr(top, "module") and isinstance(top.module, torch.nn.Module):
        top = top.module
    if hasattr(top, "get_base_model"):
        top = top.get_base_model()
    config = getattr(top, "config", None)
    if config is None:
        return f"{type(top).__name__} has no config"
    if getattr(config, "vision_config", None) is not None:
        return "multimodal model"
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    attn = getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None)
    if attn not in SUPPORTED_ATTENTION:
        return f"attention implementation {attn!r} (supported: {', '.join(SUPPORTED_ATTENTION)})"
    layer_types = getattr(text, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        return f"layer types {sorted(set(layer_types))} (only full attention)"
    if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True) and not layer_types:
        return "sliding-window attention"
    if getattr(text, "output_router_logits", False) or getattr(config, "output_router_logits", False):
        # the model's own router aux loss masks its router logits with the full mask, which a suffix pass lacks
        return "MoE router logits (output_router_logits=True)"
    if not getattr(config, "is_decoder", True) or getattr(config, "is_encoder_decoder", False):
        return "not a decoder-only model"
    return None


# ---------------------------------------------------------------------------------------------- the forward
def _labels(ids: torch.Tensor, mask: torch.Tensor, logits_to_keep: int, label_mask=None) -> torch.Tensor:
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-logits_to_keep] = -100
    if label_mask is not None:
        labels[:, -logits_to_keep:] = labels[:, -logits_to_keep:].masked_fill(~label_mask, -100)
    return labels


@dataclass(frozen=True)
class _TwoPasses:
    """The inputs of :func:`shared_prefix_forward`'s two passes over one chunk: ``prefix`` and ``suffix`` (the keyword
    arguments of each forward, ``past_key_values`` aside), the suffix rows' own mask ``suffix_mask`` ``(B, S + C)``,
    ``suffix_width`` ``S`` (its prompt columns: every row's last prompt token at column ``S − 1``) and ``index``
    (each row's prefix group in the prefix batch)."""

    prefix: dict
    suffix: dict
    suffix_mask: torch.Tensor
    suffix_width: int
    index: torch.Tensor

    def read(self, record: Cache) -> Cache:
        """The suffix pass's read-only cache over the prefix pass's recorded keys/values."""
        return Cache(layers=[_ReadLayer(layer.keys, layer.values, self.index) for layer in record.layers])


def _two_pass_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                     plan: PrefixPlan) -> _TwoPasses:
    """The prefix batch ``(max(G, 1), max(prefix_width, 1))`` and the suffix batch ``(B, S + C)`` of ``plan`` over
    these rows (TRL's layout), with their masks and positions (see :func:`shared_prefix_forward`)."""
    device = input_ids.device
    b, total = input_ids.shape
    c = logits_to_keep
    width = total - c
    g_count = len(plan.prefix_lengths)
    # ---- prefix batch (G, P), left-padded
    p_width = max(plan.prefix_width, 1)
    prefix_ids = input_ids.new_zeros((max(g_count, 1), p_width))
    prefix_mask = attention_mask.new_zeros((max(g_count, 1), p_width))
    for g, (length, r) in enumerate(zip(plan.prefix_lengths, plan.representative)):
        start = width - plan.prompt_lengths[r]
        prefix_ids[g, p_width - length:] = input_ids[r, start : start + length]
        prefix_mask[g, p_width - length:] = 1
    if g_count == 0:  # dummy one-token prefix, masked out for every row below
        prefix_ids[0, 0] = input_ids[0, -1]
        prefix_mask[0, 0] = 1
    # ---- suffix batch (B, S + C): the prompt tail left-padded, then the completion columns as they are. A row's
    # prompt span runs from its first real column (a prompt mask with gaps keeps them, masked).
    real = attention_mask[:, :width] != 0
    first = torch.where(real.any(1), real.float().argmax(1), torch.full_like(real[:, 0], width, dtype=torch.long))
    spans = (width - first).tolist()
    s_width = max([1] + [spans[i] - plan.prefix_of_row(i) for i in range(b)])
    suffix_ids = input_ids.new_zeros((b, s_width + c))
    suffix_mask = attention_mask.new_zeros((b, s_width + c))
    suffix_ids[:, s_width:] = input_ids[:, width:]
    suffix_mask[:, s_width:] = attention_mask[:, width:]
    row_prefix = torch.zeros(b, dtype=torch.long, device=device)
    full_prefix_mask = attention_mask.new_zeros((b, p_width))
    index = torch.zeros(b, dtype=torch.long, device=device)
    for i in range(b):
        lp = plan.prefix_of_row(i)
        tail = spans[i] - lp
        if tail:
            suffix_ids[i, s_width - tail : s_width] = input_ids[i, width - tail : width]
            suffix_mask[i, s_width - tail : s_width] = attention_mask[i, width - tail : width]
        g = plan.group_of_row[i]
        if g >= 0:
            index[i] = g
            full_prefix_mask[i] = prefix_mask[g]
            row_prefix[i] = lp
    prefix_pos = positions_from_mask(prefix_mask)
    suffix_pos = positions_from_mask(suffix_mask, offset=row_prefix)
    prefix = dict(input_ids=prefix_ids, attention_mask=prefix_mask, position_ids=prefix_pos)
    suffix = dict(input_ids=suffix_ids, attention_mask=torch.cat([full_prefix_mask, suffix_mask], dim=1),
                  position_ids=suffix_pos)
    return _TwoPasses(prefix, suffix, suffix_mask, s_width, index)


def shared_prefix_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                        plan: PrefixPlan, compute_entropy: bool = False, autocast=None, label_mask=None):
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` columns, computed with shared prefixes:
    ``(logps (B, C), entropies (B, C) or None)`` of :func:`shared_prefix_forward` (its contract; no prefix
    labels)."""
    return shared_prefix_forward(model, input_ids, attention_mask, logits_to_keep, plan, compute_entropy, autocast,
                                 label_mask)[:2]


def shared_prefix_forward(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                          plan: PrefixPlan, compute_entropy: bool = False, autocast=None, label_mask=None,
                          prefix_labels: torch.Tensor | None = None):
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` columns, computed with shared prefixes,
    and, with ``prefix_labels``, of tokens inside the shared prefixes.

    Same contract as TRL's ``GRPOTrainer._get_per_token_logps_and_entropies`` on one chunk: ``input_ids`` /
    ``attention_mask`` ``(B, W + C)`` with left-padded prompts (``W`` columns) and right-padded completions
    (``C = logits_to_keep``); ``model`` has TRL's fused LM head (``model(..., labels=, fused_lm_head=True)``
    returns ``log_probs``/``entropy``, ``trl.trainer.utils.add_fused_lm_head``) and may be wrapped by PEFT, DDP or
    DeepSpeed. Runs exactly two forwards of ``model`` (prefix, suffix), also when ``plan`` has no group (then a
    one-token dummy prefix no row attends to), so ranks under ZeRO-3 stay in step. A row whose prompt mask is not one
    run (no group: :func:`~gigpo_trl.forward.layout.rows_of_batch` gives it no tokens) runs whole in the suffix pass,
    its prompt columns from the first real one copied with their mask, so its positions and keys are those of the
    unshared row.

    Args:
        plan: from :func:`plan_prefix_groups` on the prompts of :func:`~gigpo_trl.forward.layout.rows_of_batch` of
            these rows.
        autocast: a context manager factory for the forwards (TRL: ``accelerator.autocast``); ``None``: none.
        label_mask: ``(B, C)`` bool, the completion columns whose log-prob is computed (``None``: every real one);
            the others hold 0 (with TRL's fused LM head on a GPU, their vocabulary projection is skipped).
        prefix_labels: ``(G, plan.prefix_width)`` token ids or -100, laid out as the prefix batch (group ``g``'s
            prefix right-aligned): at column ``j`` the token the prefix's position ``j`` predicts, to be scored in
            the prefix pass (TRL's fused LM head with ``shift_labels``), or -100. Its last real column may name
            the token right after the prefix, which must then be the same in every row of the group
            (:func:`plan_prefix_groups` with ``shared_next``). ``None``: the prefix pass scores nothing.

    Returns:
        ``(logps (B, C), entropies (B, C) or None, prefix logps (G, prefix_width) or None, prefix entropies or
        None)`` (the prefix values 0 where ``prefix_labels`` is -100); gradients flow to the model parameters
        through both passes.
    """
    c = logits_to_keep
    enter = autocast if autocast is not None else contextlib.nullcontext
    g_count = len(plan.prefix_lengths)
    passes = _two_pass_inputs(input_ids, attention_mask, logits_to_keep, plan)
    scored = None
    with trl_compat.cache_under_checkpointing(model):
        record = Cache(layer_class_to_replicate=_RecordLayer)
        with enter():
            if prefix_labels is None:
                model(**passes.prefix, past_key_values=record, use_cache=False, logits_to_keep=1)
            else:
                if g_count == 0 or tuple(prefix_labels.shape) != (g_count, plan.prefix_width):
                    raise ValueError(f"prefix_labels of shape {tuple(prefix_labels.shape)} do not match the plan's "
                                     f"prefix batch ({g_count}, {plan.prefix_width})")
                scored = model(**passes.prefix, past_key_values=record,
                               shift_labels=prefix_labels.to(input_ids.device), fused_lm_head=True)
        labels = _labels(passes.suffix["input_ids"], passes.suffix_mask, c, label_mask)
        with enter():
            out = model(**passes.suffix, past_key_values=passes.read(record), labels=labels, fused_lm_head=True)
    logps = out.log_probs[:, -c:]
    entropies = out.entropy[:, -c:] if compute_entropy else None
    if scored is None:
        return logps, entropies, None, None
    return logps, entropies, scored.log_probs, (scored.entropy if compute_entropy else None)


def shared_prefix_hidden(decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                         plan: PrefixPlan, autocast=None) -> tuple[torch.Tensor, int, torch.Tensor]:
    """The last hidden states of :func:`shared_prefix_forward`'s two passes, for a head other than the LM head (the
    critic's value head): ``decoder`` is a transformer body returning ``last_hidden_state`` (``model.model`` of a
    Llama / Qwen2 causal LM, possibly under a PEFT adapter); same inputs, plan and two forwards.

    Returns:
        ``(suffix (B, S + C, H), S, prefix (max(G, 1), max(prefix_width, 1), H))``: in the suffix pass every row's
        last prompt token sits at column ``S − 1`` and completion column ``j`` at ``S + j`` (so the hidden state that
        predicts completion token ``j`` is at ``S − 1 + j``); the prefix pass is laid out as ``prefix_labels`` is
        (group ``g``'s prefix right-aligned). Equal to the unshared forward's hidden states at the same tokens up to
        float rounding; gradients flow through both passes.
    """
    enter = autocast if autocast is not None else contextlib.nullcontext
    passes = _two_pass_inputs(input_ids, attention_mask, logits_to_keep, plan)
    with trl_compat.cache_under_checkpointing(decoder):
        record = Cache(layer_class_to_replicate=_RecordLayer)
        with enter():
            prefix = decoder(**passes.prefix, past_key_values=record, use_cache=False)
        with enter():
            out = decoder(**passes.suffix, past_key_values=passes.read(record))
    return out.last_hidden_state, passes.suffix_width, prefix.last_hidden_state
