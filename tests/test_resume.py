"""Checkpoint and resume: a run stopped after step k and resumed from checkpoint-k matches the uninterrupted run
(same tasks rolled out, same advantages, same weights within a CPU tolerance)."""

import copy
import json
from functools import partial

import numpy as np
import pytest
import torch
from conftest import tiny_run_config
from toy_env import NoisyLineWalkEnv
from transformers import AutoModelForCausalLM, TrainerCallback

from gigpo_trl import GiGPOTrainer
from gigpo_trl.config import scrubbed_tokens
from gigpo_trl.observers import RolloutObserver


# Three iterations, a checkpoint after each; output_dir is the folder given (no 'out' below it).
make_args = partial(tiny_run_config, subdir=None, max_steps=3, max_completion_length=10, learning_rate=5e-2,
                    save_strategy="steps", save_steps=1, logging_steps=1, save_only_model=False)


class StopAt(TrainerCallback):
    """Simulates a preemption: training stops right after global step ``k`` (its checkpoint is written)."""

    def __init__(self, k):
        self.k = k

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.k:
            control.should_training_stop = True
        return control


class _Record(RolloutObserver):
    def __init__(self):
        self.log = []

    def on_batch(self, batch, trl_batch, context):
        rows = batch.rows  # an episode's group id names its task, its seed and its group's place in the sampler
        self.log.append({"step": context.global_step, "tasks": [t.group_id for t in batch.trajectories],
                         "rewards": [r.reward for r in rows], "completions": [r.completion_ids for r in rows],
                         "advantages": trl_batch["advantages"].detach().clone()})


def record(trainer):
    """One entry per generation (rollout) of the run from now on (a rollout observer's on_batch)."""
    observer = _Record()
    trainer.add_rollout_observer(observer)
    return observer.log


def weights(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def build(tiny_model_dir, tiny_tokenizer, output_dir, callbacks=None, **overrides):
    return GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=make_args(output_dir, **overrides),
                        processing_class=tiny_tokenizer, callbacks=callbacks)


def count_rollouts(trainer):
    """The global step at each of the trainer's rollouts from now on (its collector's ``collect`` calls)."""
    steps = []
    collect = trainer.collector.collect

    def counted(*args, **kwargs):
        steps.append(trainer.state.global_step)
        return collect(*args, **kwargs)

    trainer.collector.collect = counted
    return steps


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir, tiny_tokenizer):
    out = tmp_path_factory.mktemp("run-a")
    trainer = build(tiny_model_dir, tiny_tokenizer, out)
    log = record(trainer)
    trainer.train()
    assert trainer.state.global_step == 3
    # generation every steps_per_generation=2 steps: before step 1 and before step 3
    assert [entry["step"] for entry in log] == [0, 2]
    return out, log, weights(trainer.model)


# k=2: the checkpoint falls on a generation boundary; k=1: mid-way (the step-2 batch comes from the buffered
# generation of step 1, which the checkpoint must carry).
@pytest.mark.parametrize("k", [2, 1])
def test_resume_matches_uninterrupted(k, tmp_path, tiny_model_dir, tiny_tokenizer, uninterrupted):
    _, log_a, weights_a = uninterrupted
    out = tmp_path / "run-b"
    first = build(tiny_model_dir, tiny_tokenizer, out, callbacks=[StopAt(k)])
    first.train()
    assert first.state.global_step == k
    checkpoint = out / f"checkpoint-{k}"
    assert (checkpoint / "rng_state.pth").is_file() and (checkpoint / "optimizer.pt").is_file()
    first.collector.close()
    del first

    resumed = build(tiny_model_dir, tiny_tokenizer, out)
    log_b = record(resumed)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 3
    # the resumed run generates only where the uninterrupted one did: before step 3
    assert [entry["step"] for entry in log_b] == [2]
    a, b = log_a[1], log_b[0]
    assert b["tasks"] == a["tasks"], "the task sampler position was not restored"
    assert b["completions"] == a["completions"], "the sampling RNG was not restored"
    assert b["rewards"] == a["rewards"]
    torch.testing.assert_close(b["advantages"], a["advantages"])
    final = weights(resumed.model)
    assert final.keys() == weights_a.keys()
    for name in final:
        torch.testing.assert_close(final[name], weights_a[name], rtol=1e-4, atol=1e-5, msg=name)
    # the steps changed the weights (else the comparison above proves nothing)
    initial = weights(GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=make_args(tmp_path / "init"),
                                   processing_class=tiny_tokenizer).model)
    assert any(not torch.allclose(initial[n], final[n]) for n in final)
    assert np.isfinite(resumed.state.log_history[-1]["train_loss"])


# Two whole iterations (4 steps, rollouts before steps 1 and 3), a checkpoint every step. A constant learning rate:
# with the default linear decay an optimizer step at max_steps has lr 0 and could not show in the weights.
WHOLE = dict(max_steps=4, lr_scheduler_type="constant")


@pytest.fixture(scope="module")
def whole_iterations(tmp_path_factory, tiny_model_dir, tiny_tokenizer):
    out = tmp_path_factory.mktemp("run-whole")
    trainer = build(tiny_model_dir, tiny_tokenizer, out, **WHOLE)
    steps = count_rollouts(trainer)
    trainer.train()
    assert steps == [0, 2] and trainer.state.global_step == 4
    trainer.collector.close()
    return out


# A run resumed from its checkpoint at max_steps (it finished, or was cut right after its last checkpoint) has
# nothing left to train: no rollout (minutes with a real model), no optimizer step, no step logged, no checkpoint.
# "whole": the checkpoint ends an iteration (nothing buffered: a step would roll out); "mid": max_steps=3 ends
# inside an iteration (its second half buffered: a step would train on it again).
@pytest.mark.parametrize("case", ["whole", "mid"])
def test_resume_at_max_steps_trains_nothing(case, tmp_path, tiny_model_dir, tiny_tokenizer, whole_iterations,
                                            uninterrupted):
    folder, overrides = (whole_iterations, WHOLE) if case == "whole" else (uninterrupted[0], {})
    max_steps = overrides.get("max_steps", 3)
    checkpoint = folder / f"checkpoint-{max_steps}"
    saved_log = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    resumed = build(tiny_model_dir, tiny_tokenizer, tmp_path / "resumed", **overrides)
    steps = count_rollouts(resumed)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert steps == []
    assert resumed.state.global_step == max_steps
    # the series is the checkpoint's; only Trainer's end-of-train summary follows (no step's metrics)
    log = resumed.state.log_history
    assert log[:-1] == saved_log and "train_runtime" in log[-1] and log[-1]["step"] == max_steps
    assert not {"loss", "episode/success_rate", "rollout/rows"} & set(log[-1])
    assert not list((tmp_path / "resumed").glob("checkpoint-*"))
    saved = dict(AutoModelForCausalLM.from_pretrained(checkpoint).named_parameters())
    for name, value in resumed.model.named_parameters():
        assert torch.equal(value, saved[name]), name


# Resumed mid-run, the run rolls out exactly the iterations left: k=2 ends the first iteration (the second one's
# rollout is due at step 2), k=1 and k=3 fall inside an iteration (its buffered batch is trained on, no rollout).
@pytest.mark.parametrize("k, rollouts", [(2, [2]), (1, [2]), (3, [])])
def test_resume_mid_run_rolls_out_the_iterations_left(k, rollouts, tmp_path, tiny_model_dir, tiny_tokenizer,
                                                      whole_iterations):
    resumed = build(tiny_model_dir, tiny_tokenizer, tmp_path / "resumed", **WHOLE)
    steps = count_rollouts(resumed)
    resumed.train(resume_from_checkpoint=str(whole_iterations / f"checkpoint-{k}"))
    assert steps == rollouts
    assert resumed.state.global_step == 4
    trained = [e["step"] for e in resumed.state.log_history if "loss" in e]
    assert trained == list(range(1, 5)), "each step trained and logged once"


def test_hub_token_never_written_or_logged(tmp_path, tiny_model_dir, tiny_tokenizer, capsys, caplog):
    import pickle

    secret = "hf_DoNotLeakThisToken123"
    args = make_args(tmp_path / "out", max_steps=1, hub_token=secret)
    assert secret not in str(args) and secret not in repr(args.to_dict())
    assert args.hub_token == secret  # the live config keeps it for push_to_hub
    # copies keep it too (a copied config must still be able to push); only what is saved is scrubbed
    assert copy.copy(args).hub_token == copy.deepcopy(args).hub_token == secret
    assert pickle.loads(pickle.dumps(args)).hub_token == secret
    with scrubbed_tokens():
        assert secret.encode() not in pickle.dumps(args) and pickle.loads(pickle.dumps(args)).hub_token is None
    assert copy.deepcopy(args).hub_token == secret
    trainer = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=args, processing_class=tiny_tokenizer)
    trainer.train()
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert any(p.name == "training_args.bin" for p in files) and any(p.name == "README.md" for p in files)
    for path in files:
        assert secret.encode() not in path.read_bytes(), path
    saved = torch.load(next(p for p in files if p.name == "training_args.bin"), weights_only=False)
    assert saved.hub_token is None and saved.max_turns == args.max_turns
    assert trainer.args.hub_token == secret  # saving did not touch the live config
    out = capsys.readouterr()
    assert secret not in out.out + out.err + caplog.text
    assert secret not in repr(trainer.state.log_history)


def test_resume_refuses_another_world_size(tmp_path, tiny_model_dir, tiny_tokenizer):
    from gigpo_trl.checkpoint import ROLLOUT_STATE_NAME

    trainer = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=make_args(tmp_path / "run"),
                           processing_class=tiny_tokenizer)
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    for rank in (0, 1):
        torch.save({"step": 3, "buffered_inputs": None}, folder / ROLLOUT_STATE_NAME.format(rank=rank))
    with pytest.raises(ValueError, match=rf"^checkpoint {folder} was saved by 2 processes but this run has 1; "
                                         r"resume with 2 processes \(its rollout buffers are per process\)$"):
        trainer._load_optimizer_and_scheduler(str(folder))
