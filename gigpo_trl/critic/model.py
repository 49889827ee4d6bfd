"""The critic of ``estimator="ppo"``: a value head on a decoder's last hidden states, the decoder being a second LoRA
adapter on the policy's own base model (PEFT: one copy of the base weights) or a model of its own.

:class:`Critic` computes values of TRL-style batches (left-padded prompts, right-padded completions) in forwards of
at most ``max_tokens_per_microbatch`` padded tokens, and saves / loads itself in a folder (``critic/`` of a
checkpoint or of the output directory). Its forwards are separate from the policy's (one more forward over the rows
per scoring pass and per training micro-batch) but built the same way (:mod:`gigpo_trl.forward`): rows packed for the
budget by the policy's packer, and, where the policy's forward would share them, shared prompt prefixes
(:func:`~gigpo_trl.forward.prefix.shared_prefix_hidden`) and trajectory chains (a turn's values are one gather from its
trajectory's chained forward, :meth:`~gigpo_trl.forward.chains.ChainBatch.gather`). Same values as the plain forward
of each row whole, up to float rounding.
"""

from __future__ import annotations

import contextlib
import copy
import os

import torch
from torch import nn

from ..forward.chains import chain_batch, plan_chains
from ..forward.layout import BatchRows, batch_rows, forward_input
from ..forward.mixin import forward_kind
from ..forward.packing import pack_for_forward
from ..forward.prefix import plan_prefix_groups, shared_prefix_hidden

#: The PEFT adapter name of the critic, and the folder of a checkpoint / output directory holding the critic.
CRITIC_NAME = "critic"
VALUE_HEAD_FILE = "value_head.safetensors"


def _decoder(causal_lm):
    """The transformer body of a causal LM (``model.model`` for Llama / Qwen2): hidden states without the LM head."""
    return getattr(causal_lm, causal_lm.base_model_prefix, causal_lm)


class Critic:
    """The value function V. ``policy``: the trainer's unwrapped policy model (a ``peft.PeftModel`` for the adapter
    critic); ``model_name_or_path``: a separate critic model, ``None`` for the default (the adapter under PEFT, else a
    copy of the policy's decoder); ``device``: where a separate model and the head live.

    Raises:
        ValueError: a PEFT policy that already has an adapter named ``"critic"``.
    """

    def __init__(self, policy, model_name_or_path: str | None, device):
        self.adapter = model_name_or_path is None and hasattr(policy, "peft_config")
        if self.adapter:
            if CRITIC_NAME in policy.peft_config:
                raise ValueError(f"the policy already has a PEFT adapter named {CRITIC_NAME!r}; estimator='ppo' adds "
                                 "its critic under that name")
            self.policy_adapter = policy.active_adapter
            policy.add_adapter(CRITIC_NAME, copy.deepcopy(policy.peft_config[self.policy_adapter]))
            policy.set_adapter(self.policy_adapter)  # the policy's adapter trainable, the critic's frozen
            self.model = None
            hidden = policy.get_base_model().config.get_text_config().hidden_size
        else:
            if model_name_or_path is None:  # a copy of the policy's decoder, as verl-agent starts its critic
                self.model = copy.deepcopy(_decoder(policy))
            else:
                from transformers import AutoModel

                self.model = AutoModel.from_pretrained(model_name_or_path)
            self.model.to(device)
            self.model.requires_grad_(True)
            hidden = self.model.config.get_text_config().hidden_size
        self.forwarded_tokens = 0  # real tokens computed by pack_values (shared ones once): the caller resets it
        self.value_head = nn.Linear(hidden, 1, dtype=torch.float32, device=device)
        nn.init.normal_(self.value_head.weight, std=hidden**-0.5)
        nn.init.zeros_(self.value_head.bias)

    # ------------------------------------------------------------------ parameters and forward
    def parameters(self, policy) -> list[nn.Parameter]:
        """The critic's trainable parameters: its LoRA weights (or its model's) and the head's."""
        if self.adapter:
            params = [p for name, p in policy.named_parameters() if f".{CRITIC_NAME}." in name]
        else:
            params = list(self.model.parameters())
        return params + list(self.value_head.parameters())

    @contextlib.contextmanager
    def active(self, policy):
        """The critic's adapter active (and trainable) inside the block, the policy's again afterwards, also when the
        block raises. A critic forward *and its backward* run inside it: gradient checkpointing replays the forward
        in the backward, with whichever adapter is active then. No effect for a separate critic model."""
        if not self.adapter:
            yield
            return
        policy.set_adapter(CRITIC_NAME)
        try:
            yield
        finally:
            policy.set_adapter(self.policy_adapter)

    def hidden_values(self, policy, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``(B, L)`` float32 values at every column of the padded rows ``ids`` / ``mask`` (positions from the mask,
        so padding does not change them); with gradient when grad mode is on. Call inside :meth:`active`."""
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.body(policy)(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
        return self._head(out.last_hidden_state)

    def forwards(self, batch: dict, level: str, rows: list[int], budget: int | None, sharing: bool,
                 pad_to_multiple_of: int | None = None) -> list[tuple[list[int], str, BatchRows]]:
        """The forwards that compute the values of ``rows`` of a TRL batch dict (``prompt_ids``/``prompt_mask``
        left-padded ``(B, P)``, ``completion_ids``/``completion_mask`` right-padded ``(B, C)``): ``[(rows, kind,
        their BatchRows)]``, each row once.

        ``kind`` is the policy's choice (:func:`~gigpo_trl.forward.mixin.forward_kind`; ``sharing``: the model can
        share prefixes): ``"chains"`` reads a turn's values from its trajectory's chained forward, or shares prefixes
        where no row extends another (for ``level="turn"`` only when some row does and every row has a completion
        token: the value at completion column 0); ``"prefix"`` shares prompt prefixes (``level="turn"``: over the
        prompts alone); ``"plain"`` runs each row whole. Rows are packed by
        :func:`~gigpo_trl.forward.packing.pack_for_forward` within ``budget`` padded tokens as that forward counts
        them (``None``: one forward)."""
        if not rows:
            return []
        ids, mask, width = forward_input(batch)
        table = batch_rows(ids, mask, width)
        kind = forward_kind(table.prompts, table.completions, sharing)
        if level == "turn" and (kind != "chains" or min(table.completion_lengths[i] for i in rows) == 0
                                or not plan_chains(table.prompts, table.completions, full=table.full).chained_rows):
            table = batch_rows(batch["prompt_ids"], batch["prompt_mask"], 0)  # the prompts alone
            kind = "plain" if kind == "plain" else "prefix"
        if budget is None:
            packs = [list(rows)]
        else:
            packs = pack_for_forward(kind, rows, table.prompt_lengths, table.completion_lengths, table.prompts,
                                     table.completions, budget, pad_to_multiple_of, table.full)
        return [(pack, kind, table.take(pack)) for pack in packs]

    def pack_values(self, policy, batch: dict, level: str, forward: tuple[list[int], str, BatchRows]) -> torch.Tensor:
        """Values of one forward of :meth:`forwards`, trimmed to its rows' longest prompt and completion.
        ``level="token"``: ``(len(rows), C)``, column ``j`` the value before completion token ``j`` (read at the
        position that predicts it), 0 where the completion mask is 0; ``level="turn"``: ``(len(rows),)``, the value at
        the row's last prompt token. Call inside :meth:`active`; with gradient when grad mode is on. Adds the real
        tokens its forward computed (a shared one once) to :attr:`forwarded_tokens`."""
        rows, kind, table = forward
        index = torch.tensor(rows, device=batch["prompt_ids"].device, dtype=torch.long)
        P, width = batch["prompt_ids"].size(1), batch["completion_ids"].size(1)
        wp = max(max(table.prompt_lengths), 1)
        ids, mask = batch["prompt_ids"][index, P - wp:], batch["prompt_mask"][index, P - wp:]
        whole_rows = level == "token" or kind == "chains"
        wc = max(max(table.completion_lengths), 1) if whole_rows else 0
        if whole_rows:
            c_mask = batch["completion_mask"][index, :wc]
            ids = torch.cat([ids, batch["completion_ids"][index, :wc]], dim=1)
            mask = torch.cat([mask, c_mask], dim=1)
        if kind == "chains":
            plan = plan_chains(table.prompts, table.completions, full=table.full)
            units = chain_batch(ids, mask, wc, plan) if plan.chained_rows else None
            if units is not None and units.prefix_plan.padded_tokens() < ids.numel():
                hidden, s, prefix_hidden = shared_prefix_hidden(self.body(policy), units.input_ids,
                                                                units.attention_mask, units.completion_width,
                                                                units.prefix_plan)
                unit_c = units.completion_width
                self.forwarded_tokens += units.real_tokens()
                v = units.gather(self._head(hidden[:, s - 1 : s - 1 + unit_c]), self._head(prefix_hidden))
                return v[:, 0] if level == "turn" else torch.nn.functional.pad(v * c_mask, (0, width - wc))
            kind = "prefix"
        v = None
        if kind == "prefix":
            plan = plan_prefix_groups(table.prompts, wc)
            if plan.padded_tokens() < plan.unshared_tokens():
                hidden, s, _ = shared_prefix_hidden(self.body(policy), ids, mask, wc, plan)
                v = self._head(hidden[:, s - 1 : s - 1 + max(wc, 1)])
                self.forwarded_tokens += plan.computed_tokens(int(mask.sum()))
        if v is None:
            v = self.hidden_values(policy, ids, mask)[:, wp - 1 : wp - 1 + max(wc, 1)]
            self.forwarded_tokens += int(mask.sum())
        if level == "turn":
            return v[:, 0]
        return torch.nn.functional.pad(v * c_mask, (0, width - wc))

    def body(self, policy):
        """The decoder the critic's forward runs: its own model, or the policy's base decoder (adapter critic). A
        model of its own takes the policy's train / eval mode first (Trainer sets the policy's only): in eval mode
        transformers skips gradient checkpointing."""
        if self.model is None:
            return _decoder(policy.get_base_model())
        if self.model.training != policy.training:
            self.model.train(policy.training)
        return self.model

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.value_head(hidden.float()).squeeze(-1)

    @torch.no_grad()
    def values(self, policy, batch: dict, level: str, rows: list[int], budget: int | None, sharing: bool,
               pad_to_multiple_of: int | None = None) -> torch.Tensor:
        """Values of ``rows`` (:meth:`pack_values` of each of :meth:`forwards`), no gradient, in the order of
        ``rows``; shape ``(len(rows), C)`` or ``(len(rows),)``."""
        device = batch["prompt_ids"].device
        shape = (len(rows), batch["completion_ids"].size(1)) if level == "token" else (len(rows),)
        out = torch.zeros(shape, device=device)
        place = {r: k for k, r in enumerate(rows)}
        with self.active(policy):
            for forward in self.forwards(batch, level, rows, budget, sharing, pad_to_multiple_of):
                out[[place[r] for r in forward[0]]] = self.pack_values(policy, batch, level, forward).to(out.dtype)
        return out

    # ------------------------------------------------------------------ save / load
    def save(self, folder: str, policy) -> None:
        """Write the head (``critic/value_head.safetensors``) and, for a separate model, the model
        (``save_pretrained``) into ``folder``/critic; the adapter critic's LoRA weights are written there by PEFT's
        ``save_pretrained`` of the policy (every adapter, each but the first in its own folder)."""
        from safetensors.torch import save_file

        path = os.path.join(folder, CRITIC_NAME)
        os.makedirs(path, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.value_head.state_dict().items()},
                  os.path.join(path, VALUE_HEAD_FILE))
        if self.model is not None:
            self.model.save_pretrained(path)
        elif not os.path.isfile(os.path.join(path, "adapter_model.safetensors")):  # save_model not run here
            policy.save_pretrained(folder, selected_adapters=[CRITIC_NAME])

    def load(self, folder: str, policy) -> None:
        """Restore what :meth:`save` wrote into ``folder``/critic, and the policy's adapter from ``folder`` (the adapter
        critic). ``FileNotFoundError`` names a missing file."""
        from safetensors.torch import load_file

        path = os.path.join(folder, CRITIC_NAME)
        head = os.path.join(path, VALUE_HEAD_FILE)
        if not os.path.isfile(head):
            raise FileNotFoundError(f"no critic in {folder}: {head} is missing (a checkpoint saved without "
                                    "estimator='ppo'?)")
        device = self.value_head.weight.device
        self.value_head.load_state_dict(load_file(head, device=str(device)))
        if self.model is not None:
            state = load_file(os.path.join(path, "model.safetensors"), device=str(device))
            self.model.load_state_dict(state, strict=False)
        else:
            from peft import set_peft_model_state_dict

            state = load_file(os.path.join(path, "adapter_model.safetensors"), device=str(device))
            set_peft_model_state_dict(policy, state, adapter_name=CRITIC_NAME)
            # Trainer's resume loads only the adapters in sub-folders once there is one (``_load_from_checkpoint``):
            # the policy's own adapter, at the top of the folder, is restored here
            top = os.path.join(folder, "adapter_model.safetensors")
            if os.path.isfile(top):
                set_peft_model_state_dict(policy, load_file(top, device=str(device)), adapter_name=self.policy_adapter)
            policy.set_adapter(self.policy_adapter)  # PEFT's load_adapter of the critic's folder made it inactive


__all__ = ["CRITIC_NAME", "VALUE_HEAD_FILE", "Critic"]
