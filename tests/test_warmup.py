"""The expert warm-up (gigpo_trl.warmup): demonstration rows are rollout rows, SFT labels cover the completion only,
SFT raises the expert action's log-probability, the job's three evaluations, the named error without an expert."""

import functools
import json
import re

import pytest
import torch

from gigpo_trl import GiGPOConfig, GiGPOTrainer
from gigpo_trl.envs.corridor import CorridorEnv
from gigpo_trl.warmup import EXPERT_COMPLETION, build_sft_trainer, check_expert, collect_demonstrations, expert_warmup

SHORT = functools.partial(CorridorEnv, length=3, max_turns=8)


def make_trainer(tmp_path, tokenizer, model_dir, **overrides):
    from peft import LoraConfig

    kwargs = dict(output_dir=str(tmp_path / "out"), num_generations=2, per_device_train_batch_size=2, max_steps=1,
                  max_turns=6, history_length=1, max_completion_length=16, bf16=False, gradient_checkpointing=False,
                  report_to="none", save_strategy="no", use_cpu=True, seed=0, disable_tqdm=True)
    kwargs.update(overrides)
    return GiGPOTrainer(model_dir, env=SHORT, args=GiGPOConfig(**kwargs), processing_class=tokenizer,
                        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]))


def test_demonstration_rows_are_the_collectors_rows(tmp_path, tiny_model_dir, tiny_tokenizer):
    """Replaying a demonstration's completions through the trainer's own collector (generate call replaced by the
    recorded tokens) records the same prompt ids at every turn: prompt, history window and chat template agree."""
    trainer = make_trainer(tmp_path, tiny_tokenizer, tiny_model_dir)
    tasks = trainer.train_dataset.select([0])
    data, stats = collect_demonstrations(trainer, 1, tasks=tasks, progress=False)
    assert stats["rows"] == len(data) == 3 and stats["success_rate"] == 1.0  # 3 rooms, 3 expert moves, won
    eos = tiny_tokenizer.eos_token_id
    env = SHORT()
    env.reset(tasks[0]["task"], tasks[0]["seed"])
    for turn, row in enumerate(data):
        n_prompt = row["completion_mask"].index(1)
        completion = row["input_ids"][n_prompt:]
        expert = env.expert_action()
        text = EXPERT_COMPLETION.format(thought="", action=expert)
        assert completion == tiny_tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        assert row["completion"] == [{"role": "assistant", "content": text}] and row["turn"] == turn
        assert row["completion_mask"] == [0] * n_prompt + [1] * len(completion)
        env.step(expert)
    completions = iter([row["input_ids"][row["completion_mask"].index(1):] for row in data])
    trainer.collector.policy.generate_fn = lambda prompt_ids: ([next(completions) for _ in prompt_ids], None)
    batch = trainer.collector.collect([dict(tasks[0])], ["g"], trajectory_prefix=0)
    assert [r.prompt_ids for r in batch.rows] == [row["input_ids"][:row["completion_mask"].index(1)] for row in data]
    assert [r.prompt_messages for r in batch.rows] == data["prompt"]
    assert batch.trajectories[0].won and all(r.action_valid for r in batch.rows)
    assert len(batch.rows[2].prompt_messages[1]["content"]) > len(batch.rows[0].prompt_messages[1]["content"])  # history


class ThinkingCorridor(CorridorEnv):
    """A corridor whose expert states its move (the optional ``expert_thought(action)``)."""

    def expert_thought(self, action: str) -> str:
        return f"go {action}"


def test_demonstration_thought_is_the_envs_expert_thought(tmp_path, tiny_model_dir, tiny_tokenizer):
    from peft import LoraConfig

    args = GiGPOConfig(output_dir=str(tmp_path / "out"), num_generations=2, per_device_train_batch_size=2, max_steps=1,
                       max_turns=6, history_length=1, max_completion_length=32, bf16=False, use_cpu=True,
                       report_to="none", save_strategy="no", disable_tqdm=True)
    trainer = GiGPOTrainer(tiny_model_dir, env=functools.partial(ThinkingCorridor, length=3, max_turns=8), args=args,
                           processing_class=tiny_tokenizer, peft_config=LoraConfig(r=8, target_modules=["q_proj"]))
    data, _ = collect_demonstrations(trainer, 1, tasks=trainer.train_dataset.select([0]), progress=False)
    env = ThinkingCorridor(length=3, max_turns=8)
    env.reset(trainer.train_dataset[0]["task"], trainer.train_dataset[0]["seed"])
    expected = []
    for _ in range(3):
        move = env.expert_action()
        expected.append(f"<think>go {move}</think><action>{move}</action>")
        env.step(move)
    assert [c[0]["content"] for c in data["completion"]] == expected


def test_perturbed_turns_are_not_demonstrations(tmp_path, tiny_model_dir, tiny_tokenizer):
    trainer = make_trainer(tmp_path, tiny_tokenizer, tiny_model_dir)
    data, stats = collect_demonstrations(trainer, 12, perturb_rate=0.5, seed=3, progress=False)
    assert stats["perturbed_turns"] > 0
    # every kept row's action is the expert's in the state its prompt shows (corridor: the passage, or the way out)
    for prompt, completion in zip(data["prompt"], data["completion"]):
        observation = prompt[1]["content"].split("You see:\n")[-1].splitlines()[0]
        expert = re.search(r"(up|down|left|right) (arch|stairs|way out)", observation).group(1)
        assert completion[0]["content"] == EXPERT_COMPLETION.format(thought="", action=expert), (observation, completion)
    assert len(data) + stats["perturbed_turns"] + stats["dropped_invalid"] > 12 * 3  # wrong doors cost turns
    with pytest.raises(ValueError, match=r"perturb_rate must be in \[0, 1\), got 1.0"):
        collect_demonstrations(trainer, 1, perturb_rate=1.0)


def test_sft_labels_cover_the_completion_only(tmp_path, tiny_model_dir, tiny_tokenizer):
    trainer = make_trainer(tmp_path, tiny_tokenizer, tiny_model_dir)
    data, stats = collect_demonstrations(trainer, 2, progress=False)
    sft = build_sft_trainer(trainer, data, stats, epochs=1, learning_rate=1e-3, batch_size=2, seed=0)
    prepared = sft.train_dataset
    assert len(prepared) == len(data)
    for row, ready in zip(data, prepared):
        assert ready["input_ids"] == row["input_ids"]  # TRL did not re-tokenize
        n_prompt = row["completion_mask"].index(1)
        assert ready["labels"] == [-100] * n_prompt + row["input_ids"][n_prompt:]
    assert sft.model is trainer.model  # the very adapter GiGPO trains


def _completion_logprob(model, data) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for row in data:
            ids = torch.tensor([row["input_ids"]])
            n_prompt = row["completion_mask"].index(1)
            logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
            targets = ids[0, 1:]
            token_logps = logps.gather(1, targets[:, None])[:, 0]
            total += float(token_logps[n_prompt - 1:].sum())
    return total / len(data)


def test_sft_raises_the_expert_actions_logprob(tmp_path, tiny_model_dir, tiny_tokenizer):
    trainer = make_trainer(tmp_path, tiny_tokenizer, tiny_model_dir)
    data, _ = collect_demonstrations(trainer, 4, progress=False)
    before = _completion_logprob(trainer.model, data)
    stats = expert_warmup(trainer, episodes=4, epochs=3, learning_rate=1e-2, perturb_rate=0.0)
    after = _completion_logprob(trainer.model, data)
    # measured: -80.9 -> -74.7 nats per completion (tiny random model, 4 episodes x 3 rooms, 36 SFT steps of one
    # row; its near-uniform head moves slowly, while the argmax token accuracy goes 0.23 -> 0.63)
    assert after > before + 4.0, (before, after)
    assert stats["rows"] == 12 and stats["sft_steps"] == 36  # one row per step


def test_check_expert_names_the_environment_class():
    from toy_env import FixedLengthEnv

    check_expert(SHORT())
    with pytest.raises(TypeError, match=r"^FixedLengthEnv has no expert_action\(\) method, so an expert warm-up "):
        check_expert(FixedLengthEnv())
    with pytest.raises(TypeError, match=r"^FixedLengthEnv \(env 'b'\) has no expert_action"):
        check_expert({"a": SHORT(), "b": FixedLengthEnv()})


def test_job_warm_up_without_expert_fails_before_any_model_is_loaded(tmp_path, monkeypatch):
    from gigpo_trl import models
    from gigpo_trl.envs import ENV_CLASSES
    from gigpo_trl.job import build_parser, run

    monkeypatch.setitem(ENV_CLASSES, "fixed", "toy_env:FixedLengthEnv")

    def no_model(*args, **kwargs):
        raise AssertionError("a model was resolved")

    monkeypatch.setattr(models, "resolve_model_path", no_model)
    job, args, model_args = build_parser({"env": "fixed"}).parse_args_and_config(
        args=["--output_dir", str(tmp_path / "out"), "--warmup_episodes", "2"])
    with pytest.raises(TypeError, match=r"^FixedLengthEnv has no expert_action\(\) method"):
        run(job, args, model_args)
    assert not (tmp_path / "out").exists()


def test_job_reports_three_phases(tmp_path, tiny_model_dir, capsys):
    from gigpo_trl.job import build_parser, run

    out = tmp_path / "job"
    job, args, model_args = build_parser({"env": "frozenlake"}).parse_args_and_config(args=[
        "--model_name_or_path", tiny_model_dir, "--output_dir", str(out), "--lora_target_modules", "q_proj", "v_proj",
        "--num_generations", "2", "--per_device_train_batch_size", "2", "--max_steps", "1", "--max_turns", "2",
        "--max_completion_length", "8", "--eval_max_tasks", "3", "--disable_tqdm", "true", "--warmup_episodes", "2",
        "--warmup_epochs", "1"])
    assert run(job, args, model_args) == 0
    results = json.loads((out / "eval_results.json").read_text())
    assert [k for k in ("before", "after_warmup", "after") if k in results] == ["before", "after_warmup", "after"]
    assert all(results[k]["num_tasks"] == 3 for k in ("before", "after_warmup", "after"))
    # the expert needs 6 turns on both tasks: 2 episodes cut at max_turns 2, every turn a demonstration (perturb 0)
    assert results["warmup"]["episodes"] == 2 and results["warmup"]["rows"] == 4
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[gigpo] ")]
    table = lines[lines.index(next(x for x in lines if x.split()[1:3] == ["phase", "success"])):][:4]
    assert [line.split()[1] for line in table] == ["phase", "before", "after", "after"]
    assert table[2].startswith("[gigpo] after warm-up") and table[3].startswith("[gigpo] after GiGPO")
    assert "| after_warmup |" in (out / "README.md").read_text()



def lost_expert_trainer(tmp_path, tokenizer, model_dir, **overrides):
    from toy_env import LostExpertEnv

    kwargs = dict(output_dir=str(tmp_path / "out"), num_generations=2, per_device_train_batch_size=2, max_steps=1,
                  max_turns=6, max_completion_length=16, bf16=False, report_to="none", save_strategy="no",
                  use_cpu=True, seed=0, disable_tqdm=True, **overrides)
    return GiGPOTrainer(model_dir, env=LostExpertEnv, args=GiGPOConfig(**kwargs), processing_class=tokenizer)


def test_expert_faults_are_the_experts_counted_and_stop_past_the_threshold(tmp_path, tiny_model_dir, tiny_tokenizer):
    """An expert_action() that raises fails its episode with the expert named (class, turn, exception), never as a
    reset failure; the statistics count the failed episodes; one of four gives one warning with the count; more than
    half (max_failed_fraction) stops with the first failure's cause, in process and in env workers alike."""
    import datasets

    trainer = lost_expert_trainer(tmp_path, tiny_tokenizer, tiny_model_dir)
    tasks = datasets.Dataset.from_dict({"task": [1, 3, 2, 4], "seed": [0, 0, 0, 0]})
    lost = ("slot 2, task 2: the expert failed: LostExpertEnv.expert_action() raised KeyError: 'expert lost its map' "
            "at turn 1")
    with pytest.warns(UserWarning) as caught:
        data, stats = collect_demonstrations(trainer, 4, tasks=tasks, progress=False)
    messages = [str(w.message) for w in caught if "expert warm-up" in str(w.message)]
    assert messages == [f"1 of 4 expert warm-up episodes failed and give no demonstration; the first: {lost}"]
    assert stats["failed_episodes"] == 1 and stats["episodes"] == 4 and stats["success_rate"] == 0.75
    assert stats["rows"] == len(data) == 1 + 3 + 4  # task 2's turn 0 row is dropped with its episode
    assert sorted(set(data["turn"])) == [0, 1, 2, 3]

    at_reset = datasets.Dataset.from_dict({"task": [5, 1, 5, 5], "seed": [0, 0, 0, 0]})
    with pytest.raises(RuntimeError) as raised:
        collect_demonstrations(trainer, 4, tasks=at_reset, progress=False)
    assert str(raised.value) == (
        "3 of 4 expert warm-up episodes failed (more than max_failed_fraction=0.5); the first: slot 0, task 5: the "
        "expert failed: LostExpertEnv.expert_action() raised KeyError: 'expert lost its map' at turn 0")
    assert "reset raised" not in str(raised.value)
    # the threshold is a choice: all four may fail only with 1.0, and then still stop (nothing to learn from)
    with pytest.warns(UserWarning, match=r"^3 of 4 expert warm-up episodes failed and give no demonstration"):
        assert collect_demonstrations(trainer, 4, tasks=at_reset, progress=False,
                                      max_failed_fraction=0.75)[1]["failed_episodes"] == 3
    with pytest.raises(RuntimeError, match=r"^4 of 4 expert warm-up episodes failed .*at turn 1$"):
        collect_demonstrations(trainer, 4, tasks=tasks.select([2, 2, 2, 2]), progress=False, max_failed_fraction=1.0)

    workers = lost_expert_trainer(tmp_path, tiny_tokenizer, tiny_model_dir, num_env_workers=2, env_step_timeout=30.0)
    with pytest.raises(RuntimeError) as raised:
        collect_demonstrations(workers, 4, tasks=at_reset, progress=False)
    assert str(raised.value).endswith("the first: slot 0, task 5: the expert failed: LostExpertEnv.expert_action() "
                                      "raised KeyError: 'expert lost its map' at turn 0")
    trainer.collector.close()
    workers.collector.close()


@pytest.mark.ray
def test_warm_up_with_the_ray_backend_steps_ray_actors(ray_local, tmp_path, tiny_model_dir, tiny_tokenizer):
    """``env_backend="ray"``: the warm-up's collector comes from the trainer's factory, so the expert's episodes run
    in Ray actors as training's do (each observation says where it was computed). Corridors of length 4 and 3 from
    position 0: the expert ("right") wins in 3 and 2 turns."""
    import datasets
    from conftest import tiny_run_config
    from toy_env import ActorReportingWalkEnv

    args = tiny_run_config(tmp_path, env_backend="ray", num_env_workers=2, max_turns=4, max_completion_length=16)
    trainer = GiGPOTrainer(tiny_model_dir, env=ActorReportingWalkEnv, args=args, processing_class=tiny_tokenizer)
    assert [pool.backend for pool in trainer.collector.pools.values()] == ["ray"]
    tasks = datasets.Dataset.from_dict({"task": [4, 3], "seed": [0, 0]})
    try:
        data, stats = collect_demonstrations(trainer, 2, tasks=tasks, progress=False)
        assert trainer.collector.pools == {}  # the trainer's actors gave way to the warm-up's (Ray has 2 CPUs)
    finally:
        trainer.collector.close()
    assert stats["rows"] == 5 and stats["success_rate"] == 1.0 and data["turn"] == [0, 0, 1, 1, 2]
    observations = [prompt[-1]["content"] for prompt in data["prompt"]]
    assert all("Ray actor: True." in text and "Ray actor: False." not in text for text in observations)
