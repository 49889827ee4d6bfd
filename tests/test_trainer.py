"""GiGPOTrainer on CPU with a tiny random model and the toy line-walk environment (tests/toy_env.py)."""

import numpy as np
import pytest
import torch
from conftest import capture_rollouts, tiny_train_config
from toy_env import LineWalkEnv, NoisyLineWalkEnv

from gigpo_trl import GiGPOConfig, GiGPOTrainer, compute_gigpo_advantages


make_args = tiny_train_config  # tests/conftest.py


def test_advantages_equal_estimator_on_same_rows(tmp_path, tiny_model_dir, tiny_tokenizer):
    args = make_args(tmp_path, step_advantage_weight=1.0, advantage_mode="mean_norm")
    trainer = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=args, processing_class=tiny_tokenizer)
    batches = capture_rollouts(trainer)
    trainer.model.train()  # as inside Trainer.train: padding to steps_per_generation applies in train mode
    inputs = [{"task": 4, "seed": 1}] * 4 + [{"task": 5, "seed": 2}] * 4
    out = trainer._generate_and_score_completions(inputs)
    rows = batches[0].rows
    assert len(rows) == sum(t.num_turns for t in batches[0].trajectories)
    expected = compute_gigpo_advantages(
        rewards=np.array([r.reward for r in rows]), group_ids=[r.group_id for r in rows],
        trajectory_ids=[r.trajectory_id for r in rows], anchor_states=[r.anchor_state for r in rows],
        action_valid=np.array([r.action_valid for r in rows]), gamma=0.95, step_advantage_weight=1.0,
        mode="mean_norm", invalid_action_penalty=0.1,
    ).advantages
    n = len(rows)
    torch.testing.assert_close(out["advantages"][:n], torch.tensor(expected, dtype=torch.float32))
    # the two groups are told apart (4 rollouts each), the first observations of a group are identical
    assert len({r.group_id for r in rows}) == 2
    first = {r.group_id: set() for r in rows}
    for r in rows:
        if r.turn == 0:
            first[r.group_id].add(r.anchor_state)
    assert all(len(v) == 1 for v in first.values())
    # filler rows pad to a multiple of steps_per_generation and carry no loss tokens and no advantage
    total = out["completion_mask"].shape[0]
    assert total % 2 == 0 and total - n in (0, 1)
    assert out["completion_mask"][n:].sum() == 0 and out["advantages"][n:].abs().sum() == 0
    assert out["num_items_in_batch"] == out["completion_mask"].sum()
    assert out["prompt_ids"].shape[0] == total
    # as in GRPOTrainer: old log-probs when generation and optimizer steps are misaligned (spg 2, GA 1); no
    # reference log-probs at beta 0
    assert out["old_per_token_logps"].shape == out["completion_ids"].shape
    assert "ref_per_token_logps" not in out


def _weights(model):
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


@pytest.mark.parametrize("use_lora, beta", [(False, 0.0), (True, 0.0), (False, 0.04), (True, 0.04)])
def test_one_step_changes_weights(tmp_path, tiny_model_dir, tiny_tokenizer, use_lora, beta):
    peft_config = None
    if use_lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = make_args(tmp_path, beta=beta)
    trainer = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=args, processing_class=tiny_tokenizer,
                           peft_config=peft_config)
    batches = capture_rollouts(trainer)
    before = _weights(trainer.model)
    if use_lora:
        assert all("lora" in k for k in before)
    trainer.train()
    after = _weights(trainer.model)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    returns = {t.episode_return for t in batches[0].trajectories}
    assert len(returns) > 1, "the toy rollouts must differ for the step to carry signal"
    assert changed, "no trainable weight changed after one GiGPO step"
    log = trainer.state.log_history[0]
    assert log["rollout/generate_calls"] <= 4 and log["rollout/rows"] == len(batches[0].rows)
    assert log["episode/success_rate"] == pytest.approx(np.mean([t.won for t in batches[0].trajectories]))
    if beta:
        assert "kl" in log


def test_evaluate_reports_success_per_task_type(tmp_path, tiny_model_dir, tiny_tokenizer):
    args = make_args(tmp_path, max_turns=4, per_device_eval_batch_size=8)
    trainer = GiGPOTrainer(tiny_model_dir, env=LineWalkEnv, args=args, processing_class=tiny_tokenizer)
    seen = []

    sizes = []

    def always_right(prompt_ids):
        seen.append(trainer.generation_config.do_sample)
        sizes.append(len(prompt_ids))
        return [tiny_tokenizer.encode("<think>go</think><action>right</action>")] * len(prompt_ids), None

    trainer.collector.generate_fn = always_right
    metrics = trainer.evaluate()
    # eval split: lengths [3, 4, 5, 6] * 4, seeds 100..115, start = seed % (length - 1); success iff the
    # distance length - 1 - start fits in 4 turns.
    lengths, seeds = [3, 4, 5, 6] * 4, range(100, 116)
    wins = [(n - 1 - s % (n - 1)) <= 4 for n, s in zip(lengths, seeds)]
    assert metrics["eval_success_rate"] == pytest.approx(np.mean(wins))
    for n in (3, 4, 5, 6):
        per_type = np.mean([w for w, m in zip(wins, lengths) if m == n])
        assert metrics[f"eval_success_rate/len{n}"] == pytest.approx(per_type)
    assert metrics["eval_num_tasks"] == 16 and metrics["eval_invalid_action_rate"] == 0.0
    # 16 tasks, per_device_eval_batch_size 8: two chunks of 8 episodes, each generating 8 prompts per turn
    assert max(sizes) == 8 and len(sizes) >= 2
    assert seen and not any(seen), "evaluation must be greedy at eval_temperature=0"
    assert trainer.generation_config.do_sample, "sampling must be restored after evaluation"


def test_dynamic_sampling_replaces_flat_groups(tmp_path, tiny_model_dir, tiny_tokenizer):
    import datasets

    # Train tasks: corridors of length 3 from position 0. A policy alternating right/left by position in the call
    # wins with some envs only, so a length-3 group is not flat. The length-60
    # group passed in below can never be finished in 4 turns: all returns 0, flat, and must be replaced.
    train = datasets.Dataset.from_dict({"task": [3] * 8, "seed": [0] * 8})
    args = make_args(tmp_path, dynamic_sampling=True, max_dynamic_sampling_rounds=2)
    trainer = GiGPOTrainer(tiny_model_dir, env=LineWalkEnv, args=args, train_dataset=train,
                           processing_class=tiny_tokenizer)
    texts = ["<think>r</think><action>right</action>", "<think>l</think><action>left</action>"]
    trainer.collector.generate_fn = lambda ids: ([tiny_tokenizer.encode(texts[i % 2]) for i in range(len(ids))], None)
    batches = capture_rollouts(trainer)
    trainer.model.train()
    out = trainer._generate_and_score_completions([{"task": 60, "seed": 0}] * 4 + [{"task": 3, "seed": 0}] * 4)
    assert len(batches) == 2  # the first rollout, then one extra round for the flat group only
    assert [t.task for t in batches[1].trajectories] == [3, 3, 3, 3]
    assert trainer._metrics["train"]["dynamic_sampling/replaced_groups"] == [1.0]
    # envs 0 and 2 go right twice and win; once they are done, env 1 is first in the call and goes right too
    returns = [t.episode_return for t in batches[1].trajectories]
    assert returns == [1.0, 1.0, 1.0, 0.0]
    assert out["advantages"].abs().sum() > 0


def _dropout_model(tokenizer, p=0.5):
    from gigpo_trl.models import build_tiny_model

    model = build_tiny_model(tokenizer)
    for module in model.modules():
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = p
    return model


def test_evaluate_runs_in_eval_mode_and_restores_the_mode(tmp_path, tiny_tokenizer):
    import datasets

    tasks = datasets.Dataset.from_dict({"task": [5, 6], "seed": [0, 1]})
    args = make_args(tmp_path, disable_dropout=False, max_turns=2, per_device_eval_batch_size=2)
    trainer = GiGPOTrainer(_dropout_model(tiny_tokenizer), env=LineWalkEnv, args=args, processing_class=tiny_tokenizer)
    generate, calls = trainer.collector.generate_fn, []

    def policy_logits(prompt):  # the policy as the generator sees it at this moment (dropout applies in train mode)
        with torch.no_grad():
            return trainer.model(torch.tensor([prompt])).logits[0, -1]

    def recording(prompt_ids):
        calls.append((trainer.model.training, policy_logits(prompt_ids[0])))
        return generate(prompt_ids)

    trainer.collector.generate_fn = recording
    prompt = trainer.collector.check_task({"task": 5, "seed": 0})
    trainer.model.train()  # the test can fail: in train mode the same prompt gives other logits each time
    assert not torch.equal(policy_logits(prompt), policy_logits(prompt))
    trainer.evaluate(tasks)
    assert trainer.model.training, "the previous (train) mode must be restored"
    n = len(calls)
    trainer.evaluate(tasks)
    assert n == 2 and len(calls) == 4 and not any(training for training, _ in calls)  # 2 turns per evaluation
    for (_, a), (_, b) in zip(calls[:n], calls[n:]):
        assert torch.equal(a, b), "the same weights must give the same policy in two evaluations"
    # restored also when the evaluation raises
    trainer.collector.generate_fn = lambda ids: (_ for _ in ()).throw(RuntimeError("generation failed"))
    with pytest.raises(RuntimeError, match="generation failed"):
        trainer.evaluate(tasks)
    assert trainer.model.training and trainer.generation_config.do_sample
    trainer.collector.close()


def test_dropout_is_off_by_default_so_sampling_and_scoring_agree(tmp_path, tiny_tokenizer):
    from peft import LoraConfig

    assert GiGPOConfig(output_dir=str(tmp_path), num_generations=2, use_cpu=True, bf16=False).disable_dropout is True
    peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules=["q_proj"], task_type="CAUSAL_LM")
    trainer = GiGPOTrainer(_dropout_model(tiny_tokenizer), env=LineWalkEnv, args=make_args(tmp_path),
                           processing_class=tiny_tokenizer, peft_config=peft_config)
    modules = list(trainer.model.modules())
    lora = [m for m in modules if isinstance(m, torch.nn.Dropout)]
    attention = [m.attention_dropout for m in modules if isinstance(getattr(m, "attention_dropout", None), float)]
    assert len(lora) == 2 and all(m.p == 0 for m in lora)  # one LoRA dropout per q_proj of the 2 layers
    assert attention == [0.0, 0.0]
    trainer.collector.close()


def test_env_pools_closed_after_train_and_on_errors(tmp_path, tiny_model_dir, tiny_tokenizer):
    args = make_args(tmp_path, num_env_workers=1, env_step_timeout=30)
    trainer = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=args, processing_class=tiny_tokenizer)
    pool = trainer.collector.pools["default"]
    workers = [w.process for w in pool._workers]
    assert len(workers) == 1 and workers[0].is_alive()
    trainer.train()
    workers[0].join(timeout=5)
    assert pool._closed and trainer.collector.pools == {} and not workers[0].is_alive()
    # evaluate (or train) afterwards starts a fresh pool
    metrics = trainer.evaluate(trainer.train_dataset.select(range(2)))
    assert metrics["eval_num_tasks"] == 2.0 and trainer.collector.pools["default"].worker_pids()[0] is not None
    second = trainer.collector.pools["default"]
    alive = [w.process for w in second._workers]
    assert all(p.is_alive() for p in alive)
    # an error inside train() closes the pool too
    trainer.collector.generate_fn = lambda ids: (_ for _ in ()).throw(RuntimeError("generation failed"))
    trainer.args.max_steps = 2
    with pytest.raises(RuntimeError, match="generation failed"):
        trainer.train()
    assert second._closed and trainer.collector.pools == {}
    for p in alive:
        p.join(timeout=5)
    assert not any(p.is_alive() for p in alive)
    trainer.collector.close()


def test_iterable_task_datasets(tmp_path, tiny_model_dir, tiny_tokenizer):
    import datasets

    tasks = datasets.Dataset.from_dict({"task": [3, 4, 5, 6], "seed": [0, 1, 2, 3]})
    with pytest.raises(ValueError, match=r"train_dataset is a datasets.IterableDataset; GiGPO needs a map-style "
                                         r"datasets.Dataset of tasks .* datasets.Dataset.from_list"):
        GiGPOTrainer(tiny_model_dir, env=LineWalkEnv, args=make_args(tmp_path), processing_class=tiny_tokenizer,
                     train_dataset=tasks.to_iterable_dataset())
    trainer = GiGPOTrainer(tiny_model_dir, env=LineWalkEnv, args=make_args(tmp_path, eval_max_tasks=3),
                           processing_class=tiny_tokenizer)
    right = tiny_tokenizer.encode("<think>go</think><action>right</action>")
    trainer.collector.generate_fn = lambda ids: ([right] * len(ids), None)
    # an iterable eval set is accepted: same episodes as the map-style one (the first 3 tasks)
    iterable, mapped = trainer.evaluate(tasks.to_iterable_dataset()), trainer.evaluate(tasks)
    assert iterable["eval_num_tasks"] == mapped["eval_num_tasks"] == 3.0
    # lengths 3, 4, 5 from positions 0, 1, 2: 2 turns each, all within max_turns=4
    assert iterable["eval_success_rate"] == mapped["eval_success_rate"] == 1.0
    assert iterable["eval_length_mean"] == mapped["eval_length_mean"] == 2.0
    with pytest.raises(ValueError, match=r"eval_dataset has no 'task' column \(columns: \['goal'\]\)"):
        trainer.evaluate(datasets.Dataset.from_dict({"goal": [1]}).to_iterable_dataset())
    trainer.collector.close()


@pytest.mark.parametrize("keep_step_signal, step_grouping", [(True, "state"), (False, "state"), (True, "hierarchical")])
def test_dynamic_sampling_keeps_step_signal_and_reports_still_flat_groups(tmp_path, tiny_model_dir, tiny_tokenizer,
                                                                            keep_step_signal, step_grouping, caplog):
    import datasets

    # Group "3": corridor 3 from 0. In the first call envs 1 and 3 go left (stay at 0), the others right; then all go
    # right: envs 0, 2 win at turn 2 and envs 1, 3 at turn 3. Returns all 1 (flat for DAPO), but the step group of
    # position 0 holds G = 0.95 (env 0, 2 at turn 0) and 0.9025, 0.95 (env 1, 3 at turns 0 and 1): A_S != 0.
    # Group "60" never reaches its goal in 4 turns: returns all 0 and identical trajectories, no signal at all. Its
    # replacements (length-3 corridors, always right) are identical wins: flat again, after both extra rounds.
    # With HGPO's grouping the check uses the same A_S as training: level 0 is the group above, and level 1 (the turn-0
    # rows, empty history) holds G = 0.95, 0.9025, 0.95, 0.9025: non-zero too, so the group is kept as well.
    train = datasets.Dataset.from_dict({"task": [3] * 8, "seed": [0] * 8})
    args = make_args(tmp_path, dynamic_sampling=True, max_dynamic_sampling_rounds=2,
                     dynamic_sampling_keep_step_signal=keep_step_signal, step_grouping=step_grouping)
    trainer = GiGPOTrainer(tiny_model_dir, env=LineWalkEnv, args=args, train_dataset=train,
                           processing_class=tiny_tokenizer)
    right, left = (tiny_tokenizer.encode(f"<think>x</think><action>{a}</action>") for a in ("right", "left"))
    calls = []

    def policy(ids):
        calls.append(len(ids))
        return [left if len(calls) == 1 and pos in (1, 3) else right for pos in range(len(ids))], None

    trainer.collector.generate_fn = policy
    collect, batches = trainer.collector.collect, []  # (trajectories, (return, turns) as collected)

    def recording(*a, **k):
        batch = collect(*a, **k)
        batches.append((batch.trajectories, [(t.episode_return, t.num_turns) for t in batch.trajectories]))
        return batch

    trainer.collector.collect = recording
    trainer.model.train()
    inputs = [{"task": 3, "seed": 0}] * 4 + [{"task": 60, "seed": 0}] * 4
    with caplog.at_level("WARNING", logger="gigpo_trl.trainer"):
        out = trainer._generate_and_score_completions(inputs)
        trainer._generate_and_score_completions(inputs)
    assert batches[0][1][:4] == [(1.0, 2), (1.0, 3), (1.0, 2), (1.0, 3)]
    logged = trainer._metrics["train"]
    if keep_step_signal:
        assert [len(b[0]) for b in batches[:3]] == [8, 4, 4]  # group "60" replaced twice, group "3" kept
        assert logged["dynamic_sampling/replaced_groups"][0] == 2.0
        assert logged["dynamic_sampling/still_flat_groups"][0] == 1.0
        n = 2 + 3 + 2 + 3
        assert out["advantages"][:n].abs().sum() > 0  # the kept group's step signal reaches the loss
    else:  # DAPO's rule: both groups replaced in each round, both still flat at the end
        assert [len(b[0]) for b in batches[:3]] == [8, 8, 8]
        assert logged["dynamic_sampling/replaced_groups"][0] == 4.0
        assert logged["dynamic_sampling/still_flat_groups"][0] == 2.0
    warnings = [r for r in caplog.records if "still have all-equal returns" in r.getMessage()]
    assert len(warnings) == 1, "warned once, not on every iteration"
    trainer.collector.close()
