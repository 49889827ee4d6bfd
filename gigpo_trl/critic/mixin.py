"""The trainer's side of ``estimator="ppo"``: :class:`CriticMixin` (mixed into
:class:`~gigpo_trl.trainer.GiGPOTrainer` before the forward mixin) builds the :class:`~gigpo_trl.critic.model.Critic`,
replaces a rollout's advantages by GAE from its values, trains it on every training micro-batch, steps its optimizer
with the policy's, and saves / restores it with the policy's checkpoints.

Order within one rollout (verl-agent's): values of every row from the critic as it is (no gradient) → GAE
(:mod:`gigpo_trl.advantage.gae`) → whitened advantages for the policy's loss, ``old_values`` and ``returns`` in the
batch → on each micro-batch the clipped value loss (:func:`~gigpo_trl.critic.loss.clipped_value_loss`) backwarded
into the critic alone, before the policy's loss → at each optimizer step the critic's gradients averaged over
processes, clipped to ``max_grad_norm`` and applied by its own AdamW (``critic_learning_rate``).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from accelerate.utils import broadcast
from transformers import TrainerCallback
from trl.trainer.utils import disable_dropout_in_model

from .. import trl_compat
from ..advantage.gae import row_rewards, token_gae, turn_gae, whiten
from ..models import disable_attention_dropout
from .loss import clipped_value_loss
from .model import CRITIC_NAME, Critic

OPTIMIZER_FILE = "optimizer.pt"


def critic_refusal(args, distributed_type: str, is_peft: bool) -> str | None:
    """Why this run cannot train a critic (``None``: it can): the settings ``estimator="ppo"`` does not support."""
    if distributed_type in ("DEEPSPEED", "FSDP"):
        return (f"estimator='ppo' does not run under {distributed_type} yet (its critic trains outside the sharded "
                "engine; ZeRO-3 / FSDP would need its parameter gathers): use DDP or one process")
    if args.use_vllm and is_peft and args.critic_model_name_or_path is None:
        return ("estimator='ppo' with use_vllm=True and the critic as a second LoRA adapter is not supported: the "
                "weight sync would push both adapters; set critic_model_name_or_path")
    return None


class _CriticStep(TrainerCallback):
    """Steps the critic's optimizer right after the policy's (``on_optimizer_step``, before Trainer zeroes grads)."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.trainer.critic_optimizer_step()


class CriticMixin:
    """``estimator="ppo"``: the critic beside the policy (see the module docstring). ``critic`` is ``None`` for every
    other estimator, and then nothing here changes the trainer."""

    critic: Critic | None = None

    def setup_critic(self) -> None:
        """Build the critic and its optimizer when ``args.estimator == "ppo"`` (called at the end of ``__init__``).

        Raises:
            ValueError: a setting the critic cannot run with (:func:`critic_refusal`), naming it.
        """
        args = self.args
        if args.estimator != "ppo":
            return
        policy = self.accelerator.unwrap_model(self.model)
        reason = critic_refusal(args, str(getattr(self.accelerator.distributed_type, "value", "")),
                                hasattr(policy, "peft_config"))
        if reason is not None:
            raise ValueError(reason)
        # The critic's initial weights (a LoRA adapter's or the value head's) come from the run's seed and leave
        # torch's global generator where it was: the policy's sampling then draws what it draws with any other
        # estimator of the same seed (a same-start comparison, e.g. the iteration-0 evaluation, sees equal draws).
        device = self.accelerator.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(args.seed)
            self.critic = Critic(policy, args.critic_model_name_or_path, device)
        if args.disable_dropout:  # the critic's adapter and model come after TRL disabled dropout in the policy: the
            # adapter's lora_dropout would be on, noising the values and turning off every shared forward
            for model in (policy, self.critic.model):
                if model is not None:
                    disable_dropout_in_model(model)
                    disable_attention_dropout(model)
        if self.critic.model is not None and args.gradient_checkpointing:
            # a separate critic (a copy of the decoder made here, before Trainer enables checkpointing on the policy,
            # or a model by path) keeps the memory the setting promises; the kwargs as Trainer reads them for the
            # policy: every_n_layers and offload are gradient_checkpointing_enable's, the rest torch checkpoint's
            kwargs = dict(args.gradient_checkpointing_kwargs or {})
            self.critic.model.gradient_checkpointing_enable(
                every_n_layers=kwargs.pop("every_n_layers", 1), offload=kwargs.pop("offload", False),
                gradient_checkpointing_kwargs=kwargs or None)
        params = self.critic.parameters(policy)
        if self.accelerator.num_processes > 1:  # TRL seeds each process differently: start from rank 0's critic
            flat = broadcast(torch.cat([p.detach().reshape(-1).float() for p in params]), from_process=0)
            with torch.no_grad():
                offset = 0
                for p in params:
                    p.copy_(flat[offset: offset + p.numel()].view_as(p))
                    offset += p.numel()
        self.critic_optimizer = torch.optim.AdamW(
            params, lr=args.critic_learning_rate, betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon, weight_decay=args.weight_decay)
        self._critic_grads: dict[torch.nn.Parameter, torch.Tensor] = {}
        self.add_callback(_CriticStep(self))

    # ------------------------------------------------------------------ rollout: values → GAE → advantages
    def critic_advantages(self, rows, output: dict) -> None:
        """Replace ``output["advantages"]`` (TRL's batch dict of :meth:`_rows_to_batch`, rows then filler) by PPO's
        whitened GAE advantages from the critic's values, and add ``old_values`` and ``returns`` (``(N, C)`` for
        ``gae_level="token"``, ``(N,)`` for ``"turn"``; 0 on filler and dropped rows). Logs ``critic/*`` rollout
        metrics over every process's value positions. No effect without a critic or outside training."""
        if self.critic is None or not self.model.training:
            return
        args, level = self.args, self.args.gae_level
        policy = self.accelerator.unwrap_model(self.model)
        real = torch.nonzero(output["real_row_mask"][: len(rows)]).flatten().tolist()
        self.critic.forwarded_tokens = 0  # critic/tokens_per_unique_token: this generation batch's forwards
        V = self.critic.values(policy, output, level, real, args.max_tokens_per_microbatch,
                               self._critic_shares(policy, training=False), self.pad_to_multiple_of)
        V = V.double().cpu().numpy()
        reward = np.array([r.reward for r in rows], dtype=np.float64)
        valid = np.array([r.action_valid for r in rows], dtype=bool)
        trajectory = [(r.group_id, r.trajectory_id) for r in rows]
        codes = {t: i for i, t in enumerate(dict.fromkeys(trajectory))}
        traj = np.array([codes[t] for t in trajectory], dtype=np.int64)
        if level == "token":
            R_tau = np.bincount(traj, weights=reward, minlength=len(codes))[traj] if len(rows) else reward
            lengths = output["completion_mask"][real].sum(1).cpu().numpy()
            A, G = token_gae(row_rewards(R_tau[real], valid[real], args.invalid_action_penalty), V, lengths,
                             args.gamma, args.lam)
            mask = np.arange(V.shape[1])[None, :] < lengths[:, None]
        else:
            r = reward - args.invalid_action_penalty * (~valid)
            A, G = turn_gae(r[real], V, traj[real], args.gamma, args.lam)
            mask = np.ones(len(real), dtype=bool)
        sums = self._global_sums(A, G, V, mask)
        n = sums[0]
        A = whiten(A, mask, n, sums[1], sums[2])
        device = output["advantages"].device
        shape = (output["prompt_ids"].size(0),) + tuple(V.shape[1:])
        for key, value in (("advantages", A), ("old_values", np.where(mask, V, 0.0)), ("returns", G)):
            full = torch.zeros(shape, dtype=torch.float32, device=device)
            if real:
                full[real] = torch.as_tensor(value, dtype=torch.float32, device=device)
            output[key] = full
        if n > 0:
            logged = trl_compat.metrics(self, "train")
            g_mean, e_mean = sums[3] / n, sums[5] / n
            var_g, var_e = sums[4] / n - g_mean**2, sums[6] / n - e_mean**2
            logged["critic/explained_variance"].append(1.0 - var_e / var_g if var_g > 0 else float("nan"))
            logged["critic/value_error"].append(sums[7] / n)
            logged["critic/value_mean"].append(sums[8] / n)
            logged["critic/return_mean"].append(g_mean)

    def _critic_shares(self, policy, training: bool) -> bool:
        """Whether the critic's forwards share prefixes and chains: as the policy's would
        (:meth:`~gigpo_trl.forward.mixin.ForwardMixin._prefix_sharing_reason`), asked of the critic's own model when it
        has one."""
        model = self.critic.body(policy) if self.critic.model is not None else policy  # in the policy's mode
        return self._prefix_sharing_reason(model, training) is None

    def _global_sums(self, A, G, V, mask) -> list[float]:
        """Sums over every process's value positions: count, ΣA, ΣA², ΣG, ΣG², Σ(G−V), Σ(G−V)², Σ|G−V|, ΣV."""
        a, g, v = A[mask], G[mask], V[mask]
        e = g - v
        local = [float(mask.sum()), a.sum(), (a**2).sum(), g.sum(), (g**2).sum(), e.sum(), (e**2).sum(),
                 np.abs(e).sum(), v.sum()]
        if self.accelerator.num_processes == 1:
            return [float(x) for x in local]
        t = torch.tensor(local, dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.reduce(t, reduction="sum").tolist()

    # ------------------------------------------------------------------ training: value loss → critic step
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The critic's value loss on this micro-batch first (:meth:`critic_backward`), then the policy's loss."""
        if self.critic is not None and not return_outputs and self.model.training and torch.is_grad_enabled():
            self.critic_backward(inputs)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def critic_backward(self, inputs: dict) -> None:
        """Backward ``vf_coef`` × the clipped value loss's mean over the micro-batch's value positions (every
        completion token for ``gae_level="token"``, every row for ``"turn"``) / ``gradient_accumulation_steps`` into
        the critic, in forwards of at most ``max_tokens_per_microbatch`` padded tokens; its gradients are then moved
        aside, so that the policy's gradient clipping and zeroing never see them (:meth:`critic_optimizer_step`
        applies them). Logs ``critic/loss`` (the unweighted mean) and ``critic/clip_fraction``, and at the
        iteration's last micro-step ``critic/tokens_per_unique_token``: the real tokens the critic's forwards computed
        over the generation batch (its scoring pass and every training forward), per pass (1 + ``num_iterations``),
        over the batch's distinct token prefixes (the policy's ``forward/tokens_per_unique_token`` count; 1.0: each
        token once per pass)."""
        args, level = self.args, self.args.gae_level
        policy = self.accelerator.unwrap_model(self.model)
        real = inputs.get("real_row_mask")
        rows = list(range(inputs["prompt_ids"].size(0))) if real is None else torch.nonzero(real).flatten().tolist()
        if level == "token":
            rows = [i for i in rows if bool(inputs["completion_mask"][i].any())]
            count = float(inputs["completion_mask"][rows].sum()) if rows else 0.0
        else:
            count = float(len(rows))
        if not rows:
            return
        total, clipped = 0.0, 0.0
        scale = args.vf_coef / count / args.gradient_accumulation_steps
        sharing = self._critic_shares(policy, training=True)
        for forward in self.critic.forwards(inputs, level, rows, args.max_tokens_per_microbatch, sharing,
                                            self.pad_to_multiple_of):
            index = torch.tensor(forward[0], device=inputs["prompt_ids"].device)
            mask = inputs["completion_mask"][index] if level == "token" else torch.ones(len(index), device=index.device)
            with self.critic.active(policy):
                values = self.critic.pack_values(policy, inputs, level, forward)
                loss, n_clipped = clipped_value_loss(values, inputs["old_values"][index], inputs["returns"][index],
                                                     mask, args.cliprange_value)
                (loss * scale).backward()
            total, clipped = total + float(loss.detach()), clipped + float(n_clipped)
        for p in self.critic.parameters(policy):
            if p.grad is not None:
                stash = self._critic_grads.get(p)
                self._critic_grads[p] = p.grad if stash is None else stash + p.grad
                p.grad = None
        logged = trl_compat.metrics(self, "train")
        logged["critic/loss"].append(total / count)
        logged["critic/clip_fraction"].append(clipped / count)
        counts = getattr(self, "_iteration_tokens", None)  # the policy's count of this generation batch (forward/)
        if counts is not None and counts[1] and \
                (trl_compat.rollout_position(self)[0] + 1) % args.steps_per_rollout == 0:
            logged["critic/tokens_per_unique_token"].append(
                self.critic.forwarded_tokens / (1 + self.num_iterations) / counts[1])

    def critic_optimizer_step(self) -> None:
        """Apply the critic's gradients gathered since the last step: averaged over processes (one all-reduce),
        clipped to ``max_grad_norm`` (if > 0), one AdamW step. Every process steps, with zeros where it had none."""
        policy = self.accelerator.unwrap_model(self.model)
        params = self.critic.parameters(policy)
        grads = [self._critic_grads.pop(p, None) for p in params]
        self._critic_grads.clear()
        flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float()
                          for p, g in zip(params, grads)])
        if self.accelerator.num_processes > 1:
            flat = self.accelerator.reduce(flat, reduction="mean")
        offset = 0
        for p in params:
            p.grad = flat[offset: offset + p.numel()].view_as(p).to(p.dtype)
            offset += p.numel()
        if self.args.max_grad_norm and self.args.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm)
            trl_compat.metrics(self, "train")["critic/grad_norm"].append(float(norm))
        self.critic_optimizer.step()
        self.critic_optimizer.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------ save / resume
    def _save(self, output_dir=None, state_dict=None):
        """The policy (Trainer's ``_save``; PEFT writes the critic's adapter into ``critic/``), then the critic's head
        (and a separate critic model) into ``critic/`` of the same folder."""
        super()._save(output_dir, state_dict)
        if self.critic is not None:
            self.critic.save(output_dir or self.args.output_dir, self.accelerator.unwrap_model(self.model))

    def _save_checkpoint(self, model, trial):
        """Trainer's checkpoint, plus the critic's optimizer state (``critic/optimizer.pt``, main process)."""
        super()._save_checkpoint(model, trial)
        if self.critic is not None and self.args.should_save and not self.args.save_only_model:
            folder = os.path.join(trl_compat.output_dir(self, trial), f"checkpoint-{self.state.global_step}",
                                  CRITIC_NAME)
            os.makedirs(folder, exist_ok=True)
            torch.save(self.critic_optimizer.state_dict(), os.path.join(folder, OPTIMIZER_FILE))

    def _load_optimizer_and_scheduler(self, checkpoint):
        """Trainer's (the policy's weights were loaded just before), then the critic: its adapter or model, head and
        optimizer state from ``checkpoint``/critic. ``FileNotFoundError`` when the checkpoint holds no critic."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None or self.critic is None:
            return
        self.critic.load(checkpoint, self.accelerator.unwrap_model(self.model))
        path = os.path.join(checkpoint, CRITIC_NAME, OPTIMIZER_FILE)
        if os.path.isfile(path):
            self.critic_optimizer.load_state_dict(torch.load(path, map_location=self.accelerator.device,
                                                             weights_only=True))


__all__ = ["CriticMixin", "critic_refusal"]
