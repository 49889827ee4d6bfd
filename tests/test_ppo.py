"""estimator="ppo": the critic (gigpo_trl.critic) on hand values and in end-to-end tiny-model runs."""

import json
import os

import numpy as np
import pytest
import torch
from transformers import TrainerCallback
from conftest import tiny_train_config
from toy_env import NoisyLineWalkEnv

from gigpo_trl import GiGPOConfig, GiGPOTrainer
from gigpo_trl.advantage.gae import row_rewards, token_gae, turn_gae, whiten
from gigpo_trl.critic import CRITIC_NAME, clipped_value_loss
from gigpo_trl.observers import RolloutObserver


def _lora():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def make_args(folder, **overrides):
    return tiny_train_config(folder, **{"estimator": "ppo", "critic_learning_rate": 5e-2, **overrides})


# ---------------------------------------------------------------------------------------------- hand values
def test_clipped_value_loss_by_hand():
    # eps 0.5; entry 0: V 1.0, V_old 0.2, G 2.0: plain (1-2)^2 = 1, clipped V -> 0.7: (0.7-2)^2 = 1.69 -> 1.69, clipped
    # entry 1: V 0.3, V_old 0.2, G 0.0: plain 0.09, clip leaves 0.3: 0.09 -> 0.09, not clipped
    # entry 2: V -1.0, V_old 0.0, G -2.0: plain 1, clipped -0.5: 2.25 -> 2.25, clipped; entry 3 masked out
    V = torch.tensor([1.0, 0.3, -1.0, 5.0], requires_grad=True)
    loss, clipped = clipped_value_loss(V, torch.tensor([0.2, 0.2, 0.0, 0.0]), torch.tensor([2.0, 0.0, -2.0, 0.0]),
                                       torch.tensor([1, 1, 1, 0]), 0.5)
    assert loss.item() == pytest.approx(1.69 + 0.09 + 2.25)
    assert clipped.item() == 2.0
    loss.backward()  # the clipped entries carry no gradient to V; the plain one 2 (V - G) = 0.6
    torch.testing.assert_close(V.grad, torch.tensor([0.0, 0.6, 0.0, 0.0]))


def test_config_resolves_ppo_and_refuses_bad_values(tmp_path):
    args = make_args(tmp_path)
    assert (args.gamma, args.step_advantage_weight, args.lam, args.cliprange_value, args.gae_level) == (
        1.0, 0.0, 1.0, 0.5, "token")
    for bad, message in ((dict(gae_level="step"), "gae_level must be one of"), (dict(lam=1.5), "lam must be in"),
                         (dict(cliprange_value=0.0), "cliprange_value must be"),
                         (dict(dynamic_sampling=True), "dynamic_sampling=True is not supported with estimator='ppo'")):
        with pytest.raises(ValueError, match=message):
            make_args(tmp_path, **bad)


# ---------------------------------------------------------------------------------------------- end to end
class _Batches(RolloutObserver):
    """A rollout observer keeping each (rollout batch, TRL's batch dict) and the critic's values of every row computed
    by hand at that moment: one unpadded row at a time through PEFT's own adapter switch."""

    def __init__(self, trainer):
        self.trainer, self.seen = trainer, []

    def on_batch(self, batch, trl_batch, context):
        policy, critic = self.trainer.model, self.trainer.critic
        values = []
        with torch.no_grad():
            policy.set_adapter(CRITIC_NAME)
            try:
                for row in batch.rows:
                    ids = torch.tensor([row.prompt_ids + row.completion_ids])
                    hidden = policy.get_base_model().model(input_ids=ids).last_hidden_state
                    v = critic.value_head(hidden.float())[0, :, 0]
                    values.append(v[len(row.prompt_ids) - 1: len(row.prompt_ids) - 1 + len(row.completion_ids)])
            finally:
                policy.set_adapter("default")
        self.seen.append((batch, {k: v.clone() if torch.is_tensor(v) else v for k, v in trl_batch.items()}, values))


def _critic_weights(trainer):
    named = [(n, p) for n, p in trainer.model.named_parameters() if f".{CRITIC_NAME}." in n]
    named += [(f"head.{n}", p) for n, p in trainer.critic.value_head.named_parameters()]
    return {n: p.detach().clone() for n, p in named}


@pytest.mark.parametrize("peft", [True, False])
def test_the_critic_leaves_the_policys_random_draws_as_without_it(tmp_path, tiny_model_dir, tiny_tokenizer, peft):
    """Building the critic draws nothing from torch's global generator: after the trainer is built, the next draws
    equal a GRPO trainer's of the same seed (the iteration-0 evaluation of a same-start comparison samples alike),
    and the critic's initial weights depend on the seed only."""
    def build(estimator, seed=0):
        args = make_args(tmp_path / f"{estimator}{seed}", estimator=estimator, seed=seed)
        trainer = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=args, processing_class=tiny_tokenizer,
                               peft_config=_lora() if peft else None)
        draws = torch.rand(8)
        trainer.collector.close()
        return trainer, draws

    _, grpo = build("grpo")
    ppo, draws = build("ppo")
    assert torch.equal(draws, grpo)
    again, _ = build("ppo")
    other, _ = build("ppo", seed=1)
    head = lambda t: t.critic.value_head.weight.detach()  # noqa: E731
    assert torch.equal(head(ppo), head(again)) and not torch.equal(head(ppo), head(other))


@pytest.mark.parametrize("disable", [True, False])
def test_the_critic_adapter_follows_disable_dropout(tmp_path, tiny_model_dir, tiny_tokenizer, disable):
    """The critic's adapter copies the policy's LoRA config (lora_dropout 0.05 here) after TRL zeroed the policy's
    dropout: with disable_dropout (the default) its dropout is zeroed too, so its values are not noised and the
    forwards still share prefixes; without it, policy and critic both keep theirs."""
    from peft import LoraConfig

    from gigpo_trl.models import active_dropout

    args = make_args(tmp_path, estimator="ppo", disable_dropout=disable)
    trainer = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=args, processing_class=tiny_tokenizer,
                           peft_config=LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, target_modules=["q_proj"],
                                                  task_type="CAUSAL_LM"))
    trainer.collector.close()
    ps = {name: m.p for name, m in trainer.model.named_modules() if isinstance(m, torch.nn.Dropout)}
    assert sorted({n.rsplit(".", 1)[-1] for n in ps}) == [CRITIC_NAME, "default"]
    assert set(ps.values()) == ({0.0} if disable else {0.05})
    trainer.model.train()
    assert (active_dropout(trainer.model) is None) == disable
    assert trainer._critic_shares(trainer.model, training=True) == disable


@pytest.mark.parametrize("level, history_mode, checkpointing, budget", [
    ("token", "window", False, 64), ("turn", "window", True, 64),
    ("token", "conversation", True, 1024), ("turn", "conversation", False, 1024)])  # a budget that chains fit in
def test_ppo_trains_the_critic_and_the_policy_gets_gae(tmp_path, tiny_model_dir, tiny_tokenizer, level, history_mode,
                                                       checkpointing, budget):
    """One rollout, two optimizer steps, a token budget: the advantages TRL's loss receives are the whitened GAE of
    the critic's values (computed here row by row, unpadded); the critic's adapter and head change, the policy's
    adapter too; the critic's metrics are logged. The critic's forwards share prefixes and, in conversation mode,
    run trajectory chains, as the policy's do: the values equal the row-by-row ones; under gradient checkpointing the
    critic's backward replays its forward with its own adapter active."""
    args = make_args(tmp_path, max_steps=2, gae_level=level, gamma=0.9, lam=0.8, max_tokens_per_microbatch=budget,
                     history_mode=history_mode, gradient_checkpointing=checkpointing)
    trainer = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=args, processing_class=tiny_tokenizer,
                           peft_config=_lora())
    observer = _Batches(trainer)
    trainer.add_rollout_observer(observer)
    critic_before = _critic_weights(trainer)
    policy_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert all(".default." in n for n in policy_before)  # the critic's adapter is not in the policy's optimizer
    trainer.train()
    (batch, out, values), = observer.seen
    rows, n = batch.rows, len(batch.rows)
    valid = np.array([r.action_valid for r in rows])
    traj = [(r.group_id, r.trajectory_id) for r in rows]
    if level == "token":
        R_tau = {t: sum(r.reward for r, u in zip(rows, traj) if u == t) for t in traj}
        width = out["completion_ids"].size(1)
        V = np.array([np.pad(v.double().numpy(), (0, width - len(v))) for v in values])
        lengths = np.array([len(r.completion_ids) for r in rows])
        A, G = token_gae(row_rewards(np.array([R_tau[t] for t in traj]), valid, 0.1), V, lengths, 0.9, 0.8)
        mask = np.arange(width)[None, :] < lengths[:, None]
        torch.testing.assert_close(out["old_values"][:n], torch.tensor(np.where(mask, V, 0), dtype=torch.float32),
                                   atol=2e-5, rtol=1e-4)
    else:
        V = np.array([float(v[0]) for v in values])
        codes = {t: i for i, t in enumerate(dict.fromkeys(traj))}
        r = np.array([row.reward for row in rows]) - 0.1 * ~valid
        A, G = turn_gae(r, V, np.array([codes[t] for t in traj]), 0.9, 0.8)
        mask = np.ones(n, dtype=bool)
    expected = whiten(A, mask)
    torch.testing.assert_close(out["advantages"][:n], torch.tensor(expected, dtype=torch.float32), atol=2e-4,
                               rtol=1e-4)
    torch.testing.assert_close(out["returns"][:n], torch.tensor(G, dtype=torch.float32), atol=2e-5, rtol=1e-4)
    assert out["advantages"][n:].abs().sum() == 0 and float(out["advantages"][:n].abs().max()) > 0.1
    critic_after = _critic_weights(trainer)
    assert [k for k in critic_before if not torch.equal(critic_before[k], critic_after[k])] == list(critic_before)
    assert any(not torch.equal(p, dict(trainer.model.named_parameters())[k]) for k, p in policy_before.items())
    logs = [entry for entry in trainer.state.log_history if "critic/loss" in entry]
    assert len(logs) == 2 and all(np.isfinite(e["critic/loss"]) and e["critic/loss"] > 0 for e in logs)
    # the critic's tokens per pass over the batch's distinct token prefixes: a budget of 64 fits one row per forward,
    # so exactly the plain forwards' tokens (every row whole, the prompts alone for turn values); at 1,024 the
    # chained forwards share them
    from gigpo_trl.forward.chains import unique_tokens

    plain = sum(len(r.prompt_ids) + (len(r.completion_ids) if level == "token" else 0) for r in rows)
    unique = unique_tokens([r.prompt_ids + r.completion_ids for r in rows])
    ratio = [e["critic/tokens_per_unique_token"] for e in trainer.state.log_history
             if "critic/tokens_per_unique_token" in e]
    assert len(ratio) == 1
    assert ratio[0] == pytest.approx(plain / unique) if budget == 64 else 0 < ratio[0] < 0.8 * plain / unique
    e_v = 1 - np.var((G - np.where(mask, V, 0))[mask]) / np.var(G[mask])
    assert logs[0]["critic/explained_variance"] == pytest.approx(e_v, abs=1e-4)
    assert logs[0]["critic/value_error"] == pytest.approx(np.abs(G - V)[mask].mean(), abs=1e-4)
    trainer.collector.close()


def test_critic_saved_and_restored_on_resume(tmp_path, tiny_model_dir, tiny_tokenizer):
    """A checkpoint holds the critic's adapter, head and optimizer; a fresh trainer resumed from it has that critic
    (not its own fresh one); save_model writes the critic beside the policy's adapter."""
    args = make_args(tmp_path, max_steps=1, save_strategy="steps", save_steps=1)
    trainer = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=args, processing_class=tiny_tokenizer,
                           peft_config=_lora())
    trainer.train()
    trained = _critic_weights(trainer)
    checkpoint = os.path.join(args.output_dir, "checkpoint-1")
    for name in ("value_head.safetensors", "adapter_model.safetensors", "optimizer.pt"):
        assert os.path.isfile(os.path.join(checkpoint, CRITIC_NAME, name)), name
    assert os.path.isfile(os.path.join(checkpoint, "adapter_model.safetensors"))  # the policy's, at the top
    trainer.save_model(str(tmp_path / "final"))
    assert os.path.isfile(tmp_path / "final" / CRITIC_NAME / "value_head.safetensors")
    assert os.path.isfile(tmp_path / "final" / CRITIC_NAME / "adapter_model.safetensors")
    trainer.collector.close()

    policy_trained = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if ".default." in n}
    fresh = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=make_args(tmp_path, max_steps=2),
                         processing_class=tiny_tokenizer, peft_config=_lora())
    before = _critic_weights(fresh)
    assert any(not torch.equal(before[k], trained[k]) for k in trained)
    at_start = {}

    class Snapshot(TrainerCallback):  # the weights right after the checkpoint is loaded, before any step
        def on_train_begin(self, args, state, control, **kwargs):
            at_start["critic"] = _critic_weights(fresh)
            at_start["policy"] = {n: p.detach().clone() for n, p in fresh.model.named_parameters() if ".default." in n}
            at_start["critic_steps"] = float(fresh.critic_optimizer.state_dict()["state"][0]["step"])

    fresh.add_callback(Snapshot())
    fresh.train(resume_from_checkpoint=checkpoint)
    for k in trained:
        torch.testing.assert_close(at_start["critic"][k], trained[k], rtol=0, atol=0)
    for k in policy_trained:  # Trainer alone would skip the top-level adapter once a sub-folder holds another
        torch.testing.assert_close(at_start["policy"][k], policy_trained[k], rtol=0, atol=0)
    assert at_start["critic_steps"] == 1
    assert fresh.critic_optimizer.state_dict()["state"][0]["step"] == 2  # one more step after the resume
    fresh.collector.close()


def test_ppo_refuses_what_it_cannot_run():
    from gigpo_trl.critic import critic_refusal

    args = GiGPOConfig(output_dir="unused", num_generations=2, per_device_train_batch_size=2, estimator="ppo",
                       use_cpu=True, report_to="none")
    assert "DEEPSPEED" in critic_refusal(args, "DEEPSPEED", True)
    assert critic_refusal(args, "MULTI_CPU", True) is None
    args.use_vllm = True
    assert "critic_model_name_or_path" in critic_refusal(args, "NO", True)
    assert critic_refusal(args, "NO", False) is None


def test_job_trains_with_estimator_ppo(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """`--estimator ppo` through the main job: trains (the critic's loss in the logs), saves the critic beside the
    policy's adapter, and the model card names the estimator's settings."""
    from gigpo_trl.job import build_parser, run

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "job"
    job, args, model_args = build_parser({"env": "frozenlake"}).parse_args_and_config(args=[
        "--model_name_or_path", tiny_model_dir, "--output_dir", str(out), "--lora_target_modules", "q_proj", "v_proj",
        "--num_generations", "2", "--per_device_train_batch_size", "2", "--max_steps", "1", "--max_turns", "2",
        "--max_completion_length", "8", "--eval_max_tasks", "2", "--disable_tqdm", "true", "--warmup_episodes", "0",
        "--eval_before", "false", "--estimator", "ppo", "--gae_level", "turn"])
    assert (args.estimator, args.gamma, args.gae_level, args.step_advantage_weight) == ("ppo", 1.0, "turn", 0.0)
    assert run(job, args, model_args) == 0
    assert (out / "adapter_model.safetensors").is_file()
    assert (out / CRITIC_NAME / "adapter_model.safetensors").is_file()
    assert (out / CRITIC_NAME / "value_head.safetensors").is_file()
    logs = [json.loads(line.replace("'", '"')) for line in capsys.readouterr().out.splitlines()
            if line.startswith("{'loss'")]  # Trainer's console log of each step (disable_tqdm)
    assert len(logs) == 1 and float(logs[0]["critic/loss"]) > 0 and "critic/explained_variance" in logs[0]


@pytest.mark.parametrize("extra", [[], ["--turn", "--budget", "96"]])
def test_two_processes_train_one_critic(tmp_path, extra):
    """`accelerate launch` of 2 processes (gloo, CPU), 2 rollouts, each one optimizer step of 2 accumulated micro-batches: both
    ranks end with the same critic (its gradients averaged over processes) and the same policy, both changed; the
    advantages are whitened over both ranks' value positions together (mean 0, Bessel variance 1 over the union,
    not per rank); both ranks log the critic's loss each step."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="",
               TOKENIZERS_PARALLELISM="false", ACCELERATE_USE_CPU="true")
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(port), "--config_file",
           str(root / "configs" / "accelerate" / "multi_cpu.yaml"),  # 2 processes, gloo
           str(root / "tests" / "scripts" / "distributed_ppo.py"), str(tmp_path / "out"), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=root)
    assert proc.returncode == 0, proc.stdout[-3000:] + "\n--- stderr ---\n" + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / "out-reports" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["before"] == pytest.approx(ranks[1]["before"], rel=1e-12)
    assert ranks[0]["after"] == pytest.approx(ranks[1]["after"], rel=1e-9)
    assert all(a != b for a, b in zip(ranks[0]["before"], ranks[0]["after"]))
    assert len(ranks[0]["advantages"]) == len(ranks[1]["advantages"]) == 2  # one rollout per optimizer step
    for (n0, s0, q0), (n1, s1, q1) in zip(ranks[0]["advantages"], ranks[1]["advantages"]):
        n, total, squares = n0 + n1, s0 + s1, q0 + q1
        assert n0 > 0 and n1 > 0 and abs(total / n) < 1e-5
        assert max(abs(s0 / n0), abs(s1 / n1)) > 1e-3  # not centred per rank: one mean over both
        assert (squares - total**2 / n) / (n - 1) == pytest.approx(1.0, abs=1e-4)
    for report in ranks:
        assert len(report["metrics"]) == 2 and all(m["critic/loss"] > 0 for m in report["metrics"])


@pytest.mark.parametrize("by_path", [False, True])
def test_separate_critic_model_trains_and_restores(tmp_path, tiny_model_dir, tiny_tokenizer, by_path):
    """Without PEFT the critic is a copy of the policy's decoder (or, by_path, the model critic_model_name_or_path
    names): every one of its weights changes in training, and a fresh critic loaded from the checkpoint equals it."""
    extra = {"critic_model_name_or_path": tiny_model_dir} if by_path else {}
    args = make_args(tmp_path, max_steps=1, save_strategy="steps", save_steps=1, **extra)
    trainer = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=args, processing_class=tiny_tokenizer)
    before = [p.detach().clone() for p in trainer.critic.model.parameters()]
    trainer.train()
    trained = list(trainer.critic.model.parameters())
    assert all(not torch.equal(a, b) for a, b in zip(before, trained))
    fresh = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=make_args(tmp_path / "fresh", **extra),
                         processing_class=tiny_tokenizer)
    fresh.critic.load(os.path.join(args.output_dir, "checkpoint-1"), fresh.model)
    for a, b in zip(fresh.critic.model.parameters(), trained):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(fresh.critic.value_head.weight, trainer.critic.value_head.weight, rtol=0, atol=0)
    trainer.collector.close()
    fresh.collector.close()


@pytest.mark.parametrize("by_path", [False, True])
def test_a_separate_critic_follows_gradient_checkpointing(tmp_path, tiny_model_dir, tiny_tokenizer, by_path):
    """A separate critic model (the decoder's copy, or by_path the model critic_model_name_or_path names) recomputes
    its activations in the backward when the run sets gradient_checkpointing (the memory the setting promises: its
    first layer runs once more per training forward, which transformers does only in train mode), and trains to the
    same weights as without it."""
    extra = {"critic_model_name_or_path": tiny_model_dir} if by_path else {}
    weights, calls = {}, {}
    for checkpointing in (False, True):
        args = make_args(tmp_path / str(checkpointing), max_steps=1, gradient_checkpointing=checkpointing, **extra)
        trainer = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=args, processing_class=tiny_tokenizer)
        assert trainer.critic.model.is_gradient_checkpointing is checkpointing
        layer = trainer.critic.model.layers[0]
        count = {"forward": 0, "backward": 0}
        forward = layer.forward  # counted as called, checkpoint replays included (module hooks miss the replay)
        layer.forward = lambda *a, **k: (count.__setitem__("forward", count["forward"] + torch.is_grad_enabled()),
                                         forward(*a, **k))[1]
        backward = trainer.critic_backward
        trainer.critic_backward = lambda inputs: (count.__setitem__("backward", count["backward"] + 1),
                                                  backward(inputs))[1]
        before = [p.detach().clone() for p in trainer.critic.model.parameters()]
        trainer.train()
        calls[checkpointing] = count
        weights[checkpointing] = [p.detach().clone() for p in trainer.critic.model.parameters()]
        assert any(not torch.equal(a, b) for a, b in zip(before, weights[checkpointing]))
        trainer.collector.close()
    for a, b in zip(weights[False], weights[True]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # the same micro-batches; checkpointing replays each training forward of the layer once in the backward
    assert calls[True]["backward"] == calls[False]["backward"] > 0
    assert calls[True]["forward"] == 2 * calls[False]["forward"] > 0
