"""Trajectory chains: the rows of a conversation episode computed in one forward of its longest row.

In a conversation episode (``history_mode="conversation"``, :mod:`gigpo_trl.rollout.conversation`) turn t+1's prompt is
turn t's prompt + completion + the next observation, so the rows of one transcript repeat each other: a per-row
forward over T turns reads O(T²) tokens where the transcript has O(T). A **chain** is a set of rows whose real
tokens (prompt + completion) are each a prefix of one row's prompt + completion, its *leaf*: the forward of the leaf
alone holds every member's completion tokens at the same positions, after the same tokens, as the member's own
forward, so each member's completion log-probs and entropies are read from it (:func:`chain_logps`).

Chains are found from the token ids alone (:func:`plan_chains`), so rows that are not an extension (a window-mode
prompt, a transcript restarted by ``conversation_max_turns`` or the prompt limit, a left-truncated prompt) simply
form chains of their own: correctness never depends on episode metadata. The chain forward is the shared-prefix
forward (:func:`gigpo_trl.forward.prefix.shared_prefix_logps`) over one *unit* row per chain: the leaf's tokens,
split where the chain's shortest prompt ends, labelled only at the members' completion positions; the group's shared
prefix (system prompt, task) is still computed once across chains. Trajectories that agree token for token past their
first prompt (a peaked policy's first turns and the tool results after them) are computed once too: identical
transcripts are one chain, and chains may share their longest common prefix, the member tokens inside it scored by the
prefix pass (:func:`plan_unit_prefixes`).

Gradients: a member's completion tokens appear once in the unit; the loss on them (as a completion) and their role
as context of later members flow through the same activations, which is what the per-row forwards compute in sum.

Token budget (:func:`gigpo_trl.forward.packing.pack_rows_chained`): a chain counts its leaf's tokens once. A chain
whose leaf is longer than the budget is split, not recomputed: its members that fit the budget form one unit (they
are prefixes of one sequence, so the longest of them bounds that forward), and each longer member runs alone, as it
would without chains (a row longer than the budget always gets a forward of its own); no forward is then larger than
the unshared path's largest.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .prefix import PrefixPlan, plan_prefix_groups, shared_prefix_forward
from .layout import TokenKeys, as_keys, key_common_prefix


# ---------------------------------------------------------------------------------------------- planning (pure)
@dataclass(frozen=True)
class ChainPlan:
    """Which rows are read from which unit forward.

    Attributes:
        units: per unit, its member rows, shortest first; the last member is the leaf (its tokens are the unit's).
        prompt_lengths / completion_lengths: per row, its real prompt and completion lengths.
        keys: per row, its prompt + completion as a token key (``None`` for a row that stays alone), when known.
    """

    units: tuple[tuple[int, ...], ...]
    prompt_lengths: tuple[int, ...]
    completion_lengths: tuple[int, ...]
    keys: TokenKeys | None = field(default=None, compare=False, repr=False)

    @property
    def chained_rows(self) -> int:
        """Rows read from another row's forward (0: chains change nothing)."""
        return sum(len(u) - 1 for u in self.units)

    def unit_split(self, u: int) -> tuple[int, int]:
        """``(prompt length, completion length)`` of unit ``u``: its shortest prompt, and the rest of the leaf."""
        members = self.units[u]
        head = min(self.prompt_lengths[r] for r in members)
        leaf = members[-1]
        return head, self.prompt_lengths[leaf] + self.completion_lengths[leaf] - head


def plan_chains(prompts: Sequence[Sequence[int] | None] | TokenKeys,
                completions: Sequence[Sequence[int] | None] | TokenKeys, max_tokens: int | None = None,
                full: TokenKeys | None = None) -> ChainPlan:
    """Group rows into chains (pure).

    Row r extends row q when q's prompt + completion is a prefix of r's prompt and r's prompt is longer. A leaf is a
    row no other row extends; every other row joins the unit of a leaf reached by following extensions (its tokens
    are a prefix of that leaf's prompt; at each step the first extension in sorted prompt order, found by bisection:
    O(n log n) comparisons). Leaves with the same tokens (and a completion) are one unit, the first of them its leaf. Rows given as ``None`` (a prompt or completion mask that is not one run) stay alone.
    With ``max_tokens``, a unit's members whose prompt + completion exceed it each leave the unit and run alone (see
    the module docstring). ``full``: each row's prompt + completion key when known
    (:attr:`~gigpo_trl.forward.layout.BatchRows.full`), saving the concatenation.

    Rows are compared as token keys (:class:`~gigpo_trl.forward.layout.TokenKeys`, e.g. from
    :func:`~gigpo_trl.forward.layout.batch_rows`; token lists are keyed first): exact byte comparisons, so an
    extension is always a true token prefix, and the plan is the one token tuples give.

    Returns:
        A :class:`ChainPlan` (with each row's prompt + completion key in ``keys``): every row in exactly one unit;
        deterministic for the same input.
    """
    prompt_keys, completion_keys = as_keys(prompts), as_keys(completions)
    n = len(prompt_keys)
    ok = [prompt_keys[i] is not None and completion_keys[i] is not None for i in range(n)]
    p_len = tuple(len(prompt_keys[i]) // 4 if ok[i] else 0 for i in range(n))
    c_len = tuple(len(completion_keys[i]) // 4 if ok[i] else 0 for i in range(n))
    if full is None or len(full) != n:
        full = TokenKeys(prompt_keys[i] + completion_keys[i] if ok[i] else None for i in range(n))
    # the prompts that start with full[i] are one run of the sorted prompts, starting where full[i] would be inserted
    order = sorted((i for i in range(n) if ok[i]), key=lambda i: (prompt_keys[i], i))
    sorted_keys = [prompt_keys[i] for i in order]
    child = [-1] * n  # one row that extends this one
    for i in order:
        target = full[i]
        # a strictly longer prompt: a row without completion tokens is not extended by rows with its own prompt
        k = (bisect.bisect_left if c_len[i] else bisect.bisect_right)(sorted_keys, target)
        if k < len(order) and sorted_keys[k].startswith(target):
            child[i] = order[k]
    first_leaf: dict[bytes, int] = {}  # identical leaves (trajectories that agree to their end) share one unit
    for i in order:
        if child[i] < 0 and c_len[i]:
            child[i] = -1 if first_leaf.setdefault(full[i], i) == i else first_leaf[full[i]]
    leaf_of = list(range(n))
    for i in range(n):
        k = i
        while child[k] >= 0:  # each step strictly lengthens the prompt: no cycle
            k = child[k]
        leaf_of[i] = k
    members: dict[int, list[int]] = {}
    for i in range(n):
        members.setdefault(leaf_of[i], []).append(i)
    units: list[tuple[int, ...]] = []
    for leaf in sorted(members):
        rows = sorted(members[leaf], key=lambda r: (p_len[r] + c_len[r], r != leaf, r))
        if max_tokens is not None:
            fits = [r for r in rows if p_len[r] + c_len[r] <= max_tokens]
            units += [(r,) for r in rows if r not in fits]
            rows = fits
        if rows:
            units.append(tuple(rows))
    units.sort(key=lambda u: min(u))
    return ChainPlan(tuple(units), p_len, c_len, full)


def unique_tokens(sequences: Sequence[Sequence[int]] | TokenKeys) -> int:
    """Distinct prefixes among ``sequences`` (the nodes of their token trie): the tokens a forward must compute at
    least once. Sorted sequences share with their neighbour exactly their longest common prefix with any other.
    Token keys (:class:`~gigpo_trl.forward.layout.TokenKeys`; ``None``: empty) are compared in C, token lists are
    keyed first."""
    ordered = sorted(key or b"" for key in as_keys(sequences))
    total, previous = 0, b""
    for key in ordered:
        total += len(key) // 4 - key_common_prefix(previous, key)
        previous = key
    return total


# ---------------------------------------------------------------------------------------------- the forward
@dataclass(frozen=True)
class ChainBatch:
    """The unit rows of a chain forward (TRL's layout: left-padded prompt, then ``completion_width`` columns).

    Attributes:
        input_ids / attention_mask: ``(U, W + C)``, one row per unit: its leaf's tokens, split at the unit's
            *split* (:func:`plan_unit_prefixes`).
        label_mask: ``(U, C)``, the columns that are some member's completion token.
        source: ``(B, logits_to_keep)``, per output position its index in the flattened unit output: ``[0, U·C)``
            the ``(U, C)`` suffix pass, then (with ``prefix_labels``) ``G·P`` places of the ``(G, P)`` prefix pass;
            the last index, one past both, where the row has no completion token.
        prefix_plan: the shared prefixes of the unit rows (:func:`plan_unit_prefixes`).
        prefix_labels: ``(G, P)`` the member tokens scored inside the shared prefixes (the prefix pass's
            ``shift_labels``, :func:`~gigpo_trl.forward.prefix.shared_prefix_forward`), or ``None``: none.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    label_mask: torch.Tensor
    source: torch.Tensor
    prefix_plan: PrefixPlan
    prefix_labels: torch.Tensor | None = None

    @property
    def completion_width(self) -> int:
        return self.label_mask.size(1)

    def real_tokens(self) -> int:
        """Tokens the two passes compute, padding excluded: each shared prefix once, then every unit's own, and the
        one-token dummy prefix when no unit shares one (the padded count: ``prefix_plan.padded_tokens()``)."""
        return self.prefix_plan.computed_tokens(int(self.attention_mask.sum()))

    def gather(self, values: torch.Tensor, prefix_values: torch.Tensor | None) -> torch.Tensor:
        """Per member row, ``(B, logits_to_keep)``: the value at each completion token's place (:attr:`source`) in
        the suffix pass's ``values`` ``(U, C)`` and, when :attr:`prefix_labels` is set, the prefix pass's
        ``prefix_values`` ``(G, P)``; 0 past a row's completion. Differentiable."""
        parts = [values.reshape(-1)] + ([] if self.prefix_labels is None else [prefix_values.reshape(-1)])
        return torch.cat([*parts, values.new_zeros(1)])[self.source]


def plan_unit_prefixes(leaves: TokenKeys, heads: Sequence[int], first_labels: Sequence[int | None]
                       ) -> tuple[tuple[int, ...], PrefixPlan, bool]:
    """Where each unit row is split and which prefix its forward shares: ``(splits, plan, prefix scored)``.

    Args:
        leaves: per unit, its leaf's tokens as a key (:class:`~gigpo_trl.forward.layout.TokenKeys`).
        heads: per unit, its shortest member prompt (no member labels a token before it; >= 1).
        first_labels: per unit, the first token index some member labels (``None``: none).

    Two plans are compared. **Heads** (:func:`~gigpo_trl.forward.prefix.plan_prefix_groups` over the units' heads):
    units share a prefix of their first prompts only, so tokens that several trajectories hold past their first
    prompt (a group's rollouts that agree on their first turns, and the tool results that follow them) are computed
    once per trajectory. **Leaves** (the same over the whole leaf tokens, with ``shared_next``): units share their
    longest common prefix, wherever it ends, and the member tokens inside it are scored by the prefix pass; a unit
    is then split at ``max(head, prefix + 1)``. The leaves plan is taken when it computes fewer real tokens, pads no
    more than the heads plan (whose count the packer budgeted), and leaves the LM head no more positions to project
    (off a GPU TRL's fused head projects every position of a pass it scores: the suffix pass always, the prefix pass
    when it scores member tokens), so a few completion tokens that all trajectories start with never cost a
    projection of the whole prompt.

    Returns:
        ``splits`` (per unit, its prompt columns), the :class:`~gigpo_trl.forward.prefix.PrefixPlan` over the unit
        rows split there, and whether its prefix pass scores member tokens.
    """
    n = len(leaves)
    lengths = [len(key) // 4 for key in leaves]
    heads = [int(h) for h in heads]
    completion = max([1] + [length - h for length, h in zip(lengths, heads)])
    by_heads = plan_prefix_groups(TokenKeys(key[: 4 * h] for key, h in zip(leaves, heads)), completion)
    if n < 2 or min(heads, default=0) < 1:
        return tuple(heads), by_heads, False
    grouped = plan_prefix_groups(leaves, 0, shared_next=True)
    splits = [max(h, grouped.prefix_of_row(u) + 1) for u, h in enumerate(heads)]
    by_leaves = PrefixPlan(grouped.group_of_row, grouped.prefix_lengths, grouped.representative, tuple(splits),
                           max([1] + [length - s for length, s in zip(lengths, splits)]))
    scored = any(first is not None and first < s for first, s in zip(first_labels, splits))

    def projected(plan: PrefixPlan, prefix_scored: bool) -> int:  # positions TRL's fused head projects on a CPU
        return plan.padded_tokens() - (0 if prefix_scored else len(plan.prefix_lengths) * plan.prefix_width)

    if (sum(lengths) - by_leaves.saved_tokens() < sum(lengths) - by_heads.saved_tokens()
            and by_leaves.padded_tokens() <= by_heads.padded_tokens()
            and projected(by_leaves, scored) <= projected(by_heads, False)):
        return tuple(splits), by_leaves, scored
    return tuple(heads), by_heads, False


def chain_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                plan: ChainPlan) -> ChainBatch:
    """The :class:`ChainBatch` of ``plan`` over these rows (TRL's layout; every row with one-run masks), its unit
    rows split and sharing prefixes as :func:`plan_unit_prefixes` decides."""
    b, total = input_ids.shape
    width = total - logits_to_keep
    u_count = len(plan.units)
    leaves = [rows[-1] for rows in plan.units]
    tokens = [torch.cat([input_ids[leaf, width - plan.prompt_lengths[leaf] : width],
                         input_ids[leaf, width : width + plan.completion_lengths[leaf]]]) for leaf in leaves]
    keys = TokenKeys(plan.keys[leaf] if plan.keys is not None and plan.keys[leaf] is not None else
                     as_keys([t.tolist()])[0] for leaf, t in zip(leaves, tokens))
    heads = [plan.unit_split(u)[0] for u in range(u_count)]
    first_labels = [min((plan.prompt_lengths[r] for r in rows if plan.completion_lengths[r]), default=None)
                    for rows in plan.units]
    splits, prefix_plan, scored = plan_unit_prefixes(keys, heads, first_labels)
    unit_width = max(splits)
    unit_c = max(1, max(len(t) - s for t, s in zip(tokens, splits)))
    ids = input_ids.new_zeros((u_count, unit_width + unit_c))
    mask = attention_mask.new_zeros((u_count, unit_width + unit_c))
    labelled = torch.zeros((u_count, unit_c), dtype=torch.bool, device=input_ids.device)
    g_count, p_width = len(prefix_plan.prefix_lengths), prefix_plan.prefix_width
    prefix_labels = torch.full((g_count, p_width), -100, dtype=torch.long) if scored else None
    outputs = u_count * unit_c + (g_count * p_width if scored else 0)  # the zero slot's index
    source = torch.full((b, logits_to_keep), outputs, dtype=torch.long)
    for u, (rows, split, leaf_tokens) in enumerate(zip(plan.units, splits, tokens)):
        ids[u, unit_width - split : unit_width - split + len(leaf_tokens)] = leaf_tokens
        mask[u, unit_width - split : unit_width - split + len(leaf_tokens)] = 1
        g, lp = prefix_plan.group_of_row[u], prefix_plan.prefix_of_row(u)
        for r in rows:
            k = torch.arange(plan.prompt_lengths[r], plan.prompt_lengths[r] + plan.completion_lengths[r])
            after = k >= split  # scored by the suffix pass, at completion column k - split
            labelled[u, (k[after] - split).to(labelled.device)] = True
            place = u * unit_c + k - split
            if not bool(after.all()):  # inside the shared prefix (k <= lp): scored by the prefix pass at k - 1
                inside = k[~after]
                prefix_labels[g, p_width - lp + inside - 1] = leaf_tokens[inside].cpu()
                place = torch.where(after, place, u_count * unit_c + g * p_width + p_width - lp + k - 1)
            source[r, : len(k)] = place
    return ChainBatch(ids, mask, labelled, source.to(input_ids.device), prefix_plan,
                      None if prefix_labels is None else prefix_labels.to(input_ids.device))


def chain_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                units: ChainPlan | ChainBatch, compute_entropy: bool = False, autocast=None):
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` columns, each unit computed in one forward
    (with shared prefixes across units; member tokens inside a shared prefix scored by its prefix pass).

    Same contract as :func:`gigpo_trl.forward.prefix.shared_prefix_logps` on one chunk (TRL's layout, fused LM head,
    exactly two forwards of ``model``), except that columns past a row's completion hold 0 instead of the values
    TRL computes on padding (every loss masks them). Every row must have one-run masks
    (:func:`~gigpo_trl.forward.layout.rows_of_batch` gives no ``None``).

    Args:
        units: a :func:`plan_chains` over :func:`~gigpo_trl.forward.layout.rows_of_batch` of these rows, or its
            :func:`chain_batch`.

    Returns:
        ``(logps (B, C), entropies (B, C) or None)``, differentiable through the unit forward.
    """
    if isinstance(units, ChainPlan):
        units = chain_batch(input_ids, attention_mask, logits_to_keep, units)
    logps, entropies, prefix_logps, prefix_entropies = shared_prefix_forward(
        model, units.input_ids, units.attention_mask, units.completion_width, units.prefix_plan, compute_entropy,
        autocast, label_mask=units.label_mask, prefix_labels=units.prefix_labels)
    return units.gather(logps, prefix_logps), (units.gather(entropies, prefix_entropies) if compute_entropy else None)


__all__ = ["ChainBatch", "ChainPlan", "chain_batch", "chain_logps", "plan_chains", "plan_unit_prefixes", "unique_tokens"]
