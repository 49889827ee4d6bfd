"""Contract tests of the private names of TRL, transformers, accelerate and argparse that GiGPO relies on.

One test per name in :mod:`gigpo_trl.trl_compat`'s table (signature, return shape or behaviour). Each failure names
the private name and the installed TRL version, so an upgrade that breaks one says which and where to look. The
last test checks that no other module of the package touches a private attribute of those libraries.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import inspect
import math
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import transformers
import trl
from accelerate.state import GradientState
from toy_env import NoisyLineWalkEnv
from conftest import bare_vllm_generation, set_entropy_coef, tiny_train_config as make_args
from transformers import Trainer
from trl import GRPOTrainer

from gigpo_trl import GiGPOTrainer, trl_compat
from gigpo_trl.config import BUDGET_LOSS_TYPES
from gigpo_trl.forward.packing import take_rows
from gigpo_trl.forward.importance import importance_ratio

PACKAGE = Path(__file__).resolve().parents[1] / "gigpo_trl"


@contextlib.contextmanager
def contract(name: str):
    """Re-raise any failure inside as one naming the private ``name`` and the installed versions."""
    try:
        yield
    except Exception as exc:  # an AttributeError / TypeError is as much a broken contract as a wrong value
        pytest.fail(f"TRL {trl.__version__} (transformers {transformers.__version__}): the private name {name} no "
                    f"longer behaves as gigpo_trl.trl_compat relies on: {type(exc).__name__}: {exc}", pytrace=True)


def params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def source(fn) -> str:
    return inspect.getsource(fn)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, tiny_model_dir, tiny_tokenizer):
    args = make_args(tmp_path_factory.mktemp("compat"), steps_per_generation=2, max_tokens_per_microbatch=None)
    trainer = GiGPOTrainer(tiny_model_dir, env=NoisyLineWalkEnv, args=args, processing_class=tiny_tokenizer)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train; these tests call TRL directly
    return trainer


# ---------------------------------------------------------------------------------------------- hooks
def test_generate_and_score_hook():
    with contract("GRPOTrainer._generate_and_score_completions"):
        assert params(GRPOTrainer._generate_and_score_completions) == ["self", "inputs"]
        assert "self._generate_and_score_completions(generation_batch)" in source(GRPOTrainer._prepare_inputs)
        assert params(GiGPOTrainer._generate_and_score_completions) == ["self", "inputs"]


def test_signature_columns_hook(trainer):
    with contract("GRPOTrainer._set_signature_columns_if_needed / _signature_columns"):
        assert "self._set_signature_columns_if_needed()" in source(Trainer._remove_unused_columns)
        assert "self._signature_columns" in source(Trainer._remove_unused_columns)
        trainer._signature_columns = None
        trainer._set_signature_columns_if_needed()
        assert trainer._signature_columns == ["task", "seed", "task_type", "env", "prompt"]


@pytest.mark.parametrize("hook", ["_save_checkpoint", "_save", "_push_from_checkpoint",
                                  "_load_optimizer_and_scheduler", "_init_training_state"])
def test_checkpoint_hooks(hook):
    assert hook in trl_compat.OVERRIDDEN_HOOKS
    with contract(f"Trainer.{hook}"):
        callers = [name for name, fn in inspect.getmembers(Trainer, inspect.isfunction)
                   if f"self.{hook}(" in source(fn) and name != hook]
        assert callers, f"no method of transformers.Trainer calls self.{hook}(...) any more"
        assert params(getattr(GRPOTrainer, hook)) == params(getattr(GiGPOTrainer, hook))
    if hook == "_init_training_state":  # its epochs trained bound the epoch loop: all of them, no step is run
        with contract("Trainer._inner_training_loop's epoch loop from _init_training_state's epochs"):
            loop = source(Trainer._inner_training_loop)
            assert "epochs_trained, steps_trained_in_current_epoch = self._init_training_state(" in loop
            assert "for epoch in range(epochs_trained, num_train_epochs):" in loop
    if hook == "_save":  # the token scrub relies on _save being where the config file is written
        with contract("Trainer._save writes training_args.bin"):
            assert "TRAINING_ARGS_NAME" in source(Trainer._save)


def test_get_output_dir(trainer):
    with contract("Trainer._get_output_dir"):
        assert trl_compat.output_dir(trainer, None) == trainer.args.output_dir


def test_rollout_position(trainer):
    """``_prepare_inputs`` generates when ``_step % generate_every == 0`` (or nothing is buffered), buffers
    ``steps_per_generation`` slices in ``_buffered_inputs`` and otherwise trains on
    ``_buffered_inputs[_step % spg]``."""
    calls = []

    def fake_generate(inputs):
        calls.append(len(inputs))
        return {"advantages": torch.arange(4.0), "num_items_in_batch": torch.tensor(8)}

    saved = trl_compat.rollout_position(trainer)
    trainer._generate_and_score_completions = fake_generate
    trainer.model.train()
    with contract("GRPOTrainer._step / _buffered_inputs"):
        try:
            trl_compat.set_rollout_position(trainer, 0, None)
            first = GRPOTrainer._prepare_inputs(trainer, [{"task": 1}] * 4)
            step, buffered = trl_compat.rollout_position(trainer)
            assert calls == [4] and step == 0 and len(buffered) == 2
            assert first is buffered[0] and sorted(first["advantages"].tolist() + buffered[1]["advantages"].tolist()) \
                == [0.0, 1.0, 2.0, 3.0]
            trl_compat.set_rollout_position(trainer, 1, buffered)
            assert GRPOTrainer._prepare_inputs(trainer, [{"task": 1}] * 4) is buffered[1] and calls == [4]
            trl_compat.set_rollout_position(trainer, 3, None)  # a resume without a saved buffer: regenerate
            GRPOTrainer._prepare_inputs(trainer, [{"task": 1}] * 4)
            assert calls == [4, 4]
        finally:
            del trainer._generate_and_score_completions
            trl_compat.set_rollout_position(trainer, *saved)


def test_buffered_micro_batch(trainer):
    """``trl_compat.buffered_micro_batch`` (the trainer's ``_prepare_inputs`` in training at spg > 1) mirrors TRL's
    own ``_prepare_inputs``: over two generation cycles, with ``num_iterations`` 1 and 2, and on a resume without a
    buffer, it generates on the same micro-steps and returns the same micro-batch as TRL's with its row shuffle
    left out (the split given: TRL's ``split_tensor_dict``), and leaves ``_step`` to ``training_step``."""
    from trl.trainer import grpo_trainer
    from trl.trainer.grpo_trainer import split_tensor_dict as split

    calls = []

    def fake_generate(inputs):
        calls.append(len(inputs))
        return {"advantages": torch.arange(4.0) + 10 * len(calls), "num_items_in_batch": torch.tensor(8)}

    spg = trainer.args.steps_per_generation
    saved, saved_iterations = trl_compat.rollout_position(trainer), trainer.num_iterations
    trainer._generate_and_score_completions = fake_generate
    trainer.model.train()
    with contract("GRPOTrainer._prepare_inputs generate / buffer rule, _step advanced by training_step"), \
            mock.patch.object(grpo_trainer, "shuffle_sequence_dict", lambda d: d):
        try:
            assert "self._step += 1" in source(GRPOTrainer.training_step)
            for iterations in (1, 2):
                trainer.num_iterations = iterations
                steps = list(range(2 * spg * iterations)) + [3]  # the last: a resume without a buffer
                traces = {}
                for ours in (False, True):
                    calls.clear()
                    trace, buffered = [], None
                    for k, step in enumerate(steps):
                        trl_compat.set_rollout_position(trainer, step, None if k == len(steps) - 1 else buffered)
                        tasks = [{"task": 1}] * 4
                        if ours:
                            out = trl_compat.buffered_micro_batch(trainer, tasks, lambda b: split(
                                trainer._generate_and_score_completions(b), spg))
                        else:
                            out = GRPOTrainer._prepare_inputs(trainer, tasks)
                        buffered = trl_compat.rollout_position(trainer)[1]
                        assert trl_compat.rollout_position(trainer)[0] == step
                        trace.append((out["advantages"].tolist(), len(calls)))
                    traces[ours] = trace
                assert traces[True] == traces[False]
                assert traces[True][-1][1] == 3 and traces[True][spg * iterations][1] == 2  # two cycles, then a resume
            trl_compat.set_rollout_position(trainer, 0, None)
            with pytest.raises(ValueError, match="returned 1 micro-batches, expected steps_per_generation=2"):
                trl_compat.buffered_micro_batch(trainer, [{"task": 1}], lambda b: [{}])
        finally:
            del trainer._generate_and_score_completions
            trainer.num_iterations = saved_iterations
            trl_compat.set_rollout_position(trainer, *saved)


def test_model_card_class_attributes():
    from trl.trainer.base_trainer import _BaseTrainer

    with contract("_BaseTrainer._tag_names / _name / _paper"):
        card = source(_BaseTrainer.create_model_card)
        assert "self._tag_names" in card and "self._name" in card
        assert all(f'self._paper.get("{key}")' in card for key in ("citation", "title", "id"))
        assert set(GiGPOTrainer._paper) == {"title", "id", "citation"} and GiGPOTrainer._paper["id"] == "2505.10978"


# ---------------------------------------------------------------------------------------------- calls
def test_generate_single_turn(trainer, tiny_tokenizer):
    with contract("GRPOTrainer._generate_single_turn"):
        assert params(GRPOTrainer._generate_single_turn)[:5] == [
            "self", "prompt_ids", "images", "multimodal_fields", "num_generations"]
        prompts = [tiny_tokenizer("move right")["input_ids"], tiny_tokenizer("go left now")["input_ids"]]
        torch.manual_seed(0)
        completion_ids, logprobs = trl_compat.generate_single_turn(trainer, prompts)
        assert len(completion_ids) == 2 and all(isinstance(t, int) for c in completion_ids for t in c)
        assert all(1 <= len(c) <= trainer.max_completion_length for c in completion_ids)
        assert logprobs is None  # transformers generation: no sampling log-probs (vLLM gives per-token floats)


def test_summon_full_params(trainer):
    with contract("GRPOTrainer._dist.summon_full_params"):
        with trl_compat.summon_full_params(trainer):  # no FSDP here: the parameters are the model's own
            assert next(trainer.model_wrapped.parameters()).shape == next(trainer.model.parameters()).shape


def test_tokenize_prompts(trainer, tiny_tokenizer):
    messages = [[{"role": "user", "content": "move right"}], [{"role": "user", "content": "go left"}]]
    with contract("GRPOTrainer._tokenize_prompts"):
        ids = trl_compat.tokenize_prompts(trainer, messages)
        expected = [tiny_tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in messages]
        expected = [e["input_ids"] if isinstance(e, dict) or hasattr(e, "keys") else e for e in expected]
        assert [list(map(int, i)) for i in ids] == [list(e) for e in expected]
    with contract("GRPOTrainer.chat_template / chat_template_kwargs / eos_token_ids"):
        chat = trl_compat.ChatTemplating(trainer)
        assert chat(messages) == ids
        assert chat.render(messages[0], True) == list(expected[0])
        # without the generation prompt: the user turn alone, ending "<|im_end|>\n"
        assert chat.render(messages[0], False) == list(expected[0])[:-len(tiny_tokenizer.encode("<|im_start|>assistant\n"))]
        assert chat.stop_ids == [tiny_tokenizer.eos_token_id]


def test_per_token_logps(trainer):
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 250, (3, 9), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0  # a left-padded row
    with contract("GRPOTrainer._get_per_token_logps_and_entropies"), torch.no_grad():
        out = trl_compat.per_token_logps(trainer, trainer.model, input_ids, attention_mask, 4, batch_size=2)
        assert out.shape == (3, 4)
        logits = trainer.model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -5:-1]
        logits = logits / trainer.temperature
        expected = torch.log_softmax(logits.float(), dim=-1).gather(-1, input_ids[:, -4:].unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_per_token_logps_hook():
    """``ForwardMixin._get_per_token_logps_and_entropies`` overrides TRL's forward over rows (shared prompt
    prefixes), which ``_compute_loss`` calls for the loss and ``_generate_and_score_completions`` for old/ref
    log-probs, with TRL's leading parameters and its ``(logps, entropies, aux_loss)`` return."""
    assert "_get_per_token_logps_and_entropies" in trl_compat.OVERRIDDEN_HOOKS
    with contract("GRPOTrainer._get_per_token_logps_and_entropies (hook)"):
        assert "self._get_per_token_logps_and_entropies(" in source(GRPOTrainer._compute_loss)
        assert "self._get_per_token_logps_and_entropies(" in source(GRPOTrainer._generate_and_score_completions)
        ours = params(GiGPOTrainer._get_per_token_logps_and_entropies)
        assert params(GRPOTrainer._get_per_token_logps_and_entropies)[:7] == ours[:7] == [
            "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy"]
        assert "return logps, entropies, aux_loss" in source(GRPOTrainer._get_per_token_logps_and_entropies)


def test_cache_under_checkpointing(tiny_tokenizer):
    """transformers drops ``past_key_values`` in a checkpointed layer unless the layer's
    ``_can_checkpoint_with_cache`` is true; ``cache_under_checkpointing`` sets it per layer and removes it after."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from tiny_models import build_tiny_model

    model = build_tiny_model(tiny_tokenizer)
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    with contract("GradientCheckpointingLayer._can_checkpoint_with_cache"):
        assert "self._can_checkpoint_with_cache" in source(GradientCheckpointingLayer.__call__)
        assert GradientCheckpointingLayer._can_checkpoint_with_cache is False and len(layers) == 2
        with trl_compat.cache_under_checkpointing(model):
            assert all(m._can_checkpoint_with_cache is True for m in layers)
        assert all("_can_checkpoint_with_cache" not in vars(m) for m in layers)


def test_decoder_layers_are_the_models_layers_through_peft(tiny_tokenizer):
    from peft import LoraConfig, get_peft_model

    from tiny_models import build_tiny_model

    model = build_tiny_model(tiny_tokenizer, num_layers=3)
    assert trl_compat.decoder_layers(model) == list(model.model.layers) and len(model.model.layers) == 3
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert trl_compat.decoder_layers(wrapped) == list(model.model.layers)
    assert trl_compat.decoder_layers(torch.nn.Linear(2, 2)) == []


def test_fused_lm_head_labelled_only(tiny_tokenizer, monkeypatch):
    """``fused_lm_head_labelled_only`` makes TRL's fused LM head project only the labelled positions on a CPU (4 of
    11 here, where it projects all 11 by default), with the same log-probs, loss and gradients (to 1e-6), and
    restores TRL's device test on exit."""
    from trl.trainer import utils as trl_utils

    from tiny_models import build_tiny_model

    with contract("trl.trainer.utils._use_triton in add_fused_lm_head"):
        assert "compact = _use_triton(" in source(trl_utils.add_fused_lm_head)
    model = build_tiny_model(tiny_tokenizer).float()
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    ids = torch.tensor([[5, 9, 17, 3, 40, 41, 2, 8, 30, 31, 32, 33]])
    labels = ids.clone()
    labels[:, :8] = -100
    projected, apply = [], trl_utils._ChunkedLogProbFunction.apply

    def spy(hidden, *args):
        projected.append(hidden.shape[0])
        return apply(hidden, *args)

    def run():
        model.zero_grad()
        out = model(input_ids=ids, labels=labels, fused_lm_head=True)
        out.loss.backward()
        return out.log_probs.detach(), out.loss.detach(), model.model.embed_tokens.weight.grad.clone()

    original = trl_utils._use_triton
    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", spy)
    default = run()
    with trl_compat.fused_lm_head_labelled_only():
        assert trl_utils._use_triton(torch.device("cpu")) is True
        labelled = run()
    assert trl_utils._use_triton is original
    assert projected == [11, 4]
    for a, b in zip(default, labelled):
        assert a.shape == b.shape and (a - b).abs().max() < 1e-6
    assert (default[0][0, :7] == 0).all() and (default[0][0, 7:] < 0).all()


# ---------------------------------------------------------------------------------------------- _compute_loss
def _loss_types_in_trl() -> set[str]:
    text = source(GRPOTrainer._compute_loss)
    text = text[text.index('mode = "train" if self.model.training else "eval"'):]  # the normaliser block
    names = set(re.findall(r'self\.loss_type == "(\w+)"', text))
    for group in re.findall(r"self\.loss_type in \[([^\]]*)\]", text):
        names |= set(re.findall(r'"(\w+)"', group))
    return names


def test_compute_loss_loss_types_known():
    with contract("GRPOTrainer._compute_loss (loss types)"):
        assert _loss_types_in_trl() == set(BUDGET_LOSS_TYPES), (
            "TRL's _compute_loss normalises these loss types; ForwardMixin._sub_batch_scale knows "
            f"{sorted(BUDGET_LOSS_TYPES)}")


@pytest.fixture(scope="module")
def fixed_batch(trainer):
    """6 rollout rows of completion lengths 1..5 (+ one of 3) and 2 zero-mask filler rows (``real_row_mask``), with
    fixed advantages, old log-probs and (through a patched scorer) fixed current log-probs: TRL's loss on it is a
    pure function of its normaliser."""
    gen = torch.Generator().manual_seed(1)
    n, real, width = 8, 6, 5
    lengths = [1, 2, 3, 4, 5, 3, 0, 0]
    completion_mask = torch.tensor([[1] * k + [0] * (width - k) for k in lengths])
    completion_ids = torch.randint(3, 250, (n, width), generator=gen)
    logps = -torch.rand(n, width, generator=gen)
    batch = {
        "prompt_ids": torch.randint(3, 250, (n, 4), generator=gen), "prompt_mask": torch.ones(n, 4, dtype=torch.long),
        "completion_ids": completion_ids, "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -0.5, 2.0, -1.5, 0.7, 0.3, 0.0, 0.0]),
        "old_per_token_logps": logps + 0.1 * torch.randn(n, width, generator=gen),
        "num_items_in_batch": completion_mask.sum(),
        "real_row_mask": torch.tensor([1] * real + [0] * (n - real)),
    }
    table = {tuple(r.tolist()): lp for r, lp in zip(completion_ids, logps)}

    def scorer(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        rows = [table[tuple(r.tolist())][:logits_to_keep] for r in input_ids[:, -logits_to_keep:]]
        out = torch.stack(rows)
        return out, torch.zeros_like(out), None

    return batch, scorer


def _trl_loss(trainer, scorer, inputs, loss_type=None, compute_loss=GRPOTrainer.compute_loss) -> float:
    """TRL's own ``compute_loss`` → ``_compute_loss`` (or ``compute_loss``, e.g. GiGPO's) on ``inputs`` with the
    fixed log-probs."""
    trainer._get_per_token_logps_and_entropies = scorer
    try:
        with torch.no_grad():
            return float(compute_loss(trainer, trainer.model, inputs))
    finally:
        del trainer._get_per_token_logps_and_entropies


@pytest.mark.parametrize("loss_type", BUDGET_LOSS_TYPES)
def test_sub_batch_scale_matches_compute_loss(trainer, fixed_batch, loss_type):
    """``_sub_batch_scale`` × TRL's loss of a sub-batch, summed over sub-batches of a batch with filler rows, equals
    TRL's loss of the rollout rows alone: the normalisers we mirror are TRL's. Without a budget (the module's trainer
    has none) GiGPO's loss on the batch with its filler rows is that same value (filler rows dropped), while TRL's
    own on it differs for the row-mean losses (its normaliser would count the filler rows)."""
    batch, scorer = fixed_batch
    trainer.model.train()
    real = {k: (v[:6] if isinstance(v, torch.Tensor) and v.ndim else v) for k, v in batch.items()}
    real["real_row_mask"] = torch.ones(6, dtype=torch.long)
    saved = trainer.loss_type, trainer.importance_sampling_level
    trainer.loss_type = loss_type
    trainer.importance_sampling_level = "sequence" if loss_type == "luspo" else "token"
    with contract(f"GRPOTrainer._compute_loss normaliser (loss_type={loss_type!r})"), contextlib.ExitStack() as undo:
        undo.callback(lambda: (setattr(trainer, "loss_type", saved[0]),
                               setattr(trainer, "importance_sampling_level", saved[1])))
        target = _trl_loss(trainer, scorer, real, loss_type)
        assert target != 0.0
        assert trainer.args.max_tokens_per_microbatch is None
        budget_off = _trl_loss(trainer, scorer, batch, compute_loss=GiGPOTrainer.compute_loss)
        assert budget_off == pytest.approx(target, rel=1e-5, abs=1e-7)
        if loss_type in ("grpo", "sapo", "luspo", "dr_grpo"):  # the filler rows would change TRL's row normaliser
            assert _trl_loss(trainer, scorer, batch) != pytest.approx(target, rel=1e-3)
        total = 0.0
        for rows in ([0, 3], [1, 2, 5], [4]):
            sub = take_rows(batch, rows, 4, 5)
            total += _trl_loss(trainer, scorer, sub, loss_type) * trainer._sub_batch_scale(sub, batch)
        assert total == pytest.approx(target, rel=1e-5, abs=1e-7)


def test_prepare_inputs_hook(trainer, fixed_batch):
    """``GiGPOTrainer._prepare_inputs`` overrides TRL's hook (called by ``Trainer.training_step`` once per
    micro-step) and drops ``old_per_token_logps`` on on-policy micro-steps, relying on ``_compute_loss`` then taking
    the training forward's own (detached) log-probs as π_old: the same loss as passing those log-probs."""
    assert "_prepare_inputs" in trl_compat.OVERRIDDEN_HOOKS
    batch, scorer = fixed_batch
    trainer.model.train()
    with contract("GRPOTrainer._prepare_inputs / _compute_loss without old_per_token_logps"):
        assert "self._prepare_inputs(inputs)" in source(Trainer.training_step)
        assert params(GRPOTrainer._prepare_inputs) == params(GiGPOTrainer._prepare_inputs) == [
            "self", "generation_batch"]
        own = scorer(None, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1), None, 5)[0]
        without = {k: v for k, v in batch.items() if k != "old_per_token_logps"}
        with_own = {**without, "old_per_token_logps": own}
        assert not torch.equal(own, batch["old_per_token_logps"])
        assert _trl_loss(trainer, scorer, without) == _trl_loss(trainer, scorer, with_own)
        assert _trl_loss(trainer, scorer, without) != _trl_loss(trainer, scorer, batch)


def test_entropy_bonus_flag(trainer):
    with contract("GRPOTrainer._entropy_bonus_enabled"):
        assert "self._entropy_bonus_enabled = self.entropy_coef != 0.0" in source(GRPOTrainer.__init__)
        assert "if self._entropy_bonus_enabled" in source(GRPOTrainer._compute_loss)
        saved = trainer.entropy_coef
        try:
            set_entropy_coef(trainer, 0.5)
            assert trainer._entropy_bonus_enabled is True and trainer.entropy_coef == 0.5
            set_entropy_coef(trainer, 0.0)
            assert trainer._entropy_bonus_enabled is False
        finally:
            set_entropy_coef(trainer, saved)


def test_forward_positions_from_mask(trainer):
    """``trl_compat.install_position_ids_pre_hook`` (installed by GiGPOTrainer on the policy's backbone) relies on
    TRL's scoring forward passing no ``position_ids`` and on the backbone's argument order: the backbone then
    receives ``cumsum(mask) - 1`` for a left-padded row."""
    from transformers import Qwen2Model

    seen = []
    backbone = trainer.model.base_model
    with contract("GRPOTrainer._get_per_token_logps_and_entropies (no position_ids) / backbone forward order"):
        # (image_position_ids, for vision models, is another argument)
        assert not re.search(r"(?<!image_)position_ids", source(GRPOTrainer._get_per_token_logps_and_entropies))
        assert params(Qwen2Model.forward)[1:4] == ["input_ids", "attention_mask", "position_ids"]
        assert backbone._gigpo_mask_positions is not None
        handle = backbone.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("position_ids")),
                                                    with_kwargs=True)  # runs after ours
        try:
            ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8, 9], [5, 6, 7, 8, 9, 10, 11, 12]])
            mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8])
            trainer.args.share_prompt_prefix = False  # TRL's own forward (the rows share a prefix token)
            with torch.no_grad():
                trl_compat.per_token_logps(trainer, trainer.model, ids, mask, 3)
        finally:
            trainer.args.share_prompt_prefix = True
            handle.remove()
        assert seen and seen[0].tolist() == [[0, 0, 0, 0, 1, 2, 3, 4], list(range(8))]


def test_compute_loss_gathers_per_row():
    """``ForwardMixin._ragged_gather`` NaN-pads per-row tensors before ``accelerator.gather`` because
    ``_compute_loss`` gathers per-row clip values and reduces them with nanmin / nanmax."""
    with contract("GRPOTrainer._compute_loss (gathered clip metrics)"):
        text = source(GRPOTrainer._compute_loss)
        assert "self.accelerator.gather(" in text
        assert "nanmin(" in text and "nanmax(" in text


# ---------------------------------------------------------------------------------------------- state
def test_metrics_and_logs(trainer):
    with contract("GRPOTrainer._metrics / _logs"):
        logged = trl_compat.metrics(trainer, "train")
        logged["contract/x"].append(2.0)
        logged["contract/x"].append(4.0)
        trainer.log({"loss": 1.0})
        assert trainer.state.log_history[-1]["contract/x"] == 3.0  # averaged and flushed by GRPOTrainer.log
        assert "contract/x" not in trl_compat.metrics(trainer, "train")
        logs = trl_compat.completion_logs(trainer)
        assert {"prompt", "completion", "rewards", "advantages"} <= set(logs)
        assert all(hasattr(logs[k], "extend") for k in ("prompt", "completion", "advantages"))
        logs["rewards"]["env"].extend([1.0])  # a new reward-function name gets its own buffer
        logs["rewards"]["env"].clear()


def test_tokenizer(trainer, tiny_tokenizer):
    with contract("GRPOTrainer._tokenizer"):
        assert trl_compat.tokenizer(trainer) is trainer.processing_class
        assert trl_compat.tokenizer(trainer).pad_token_id == tiny_tokenizer.pad_token_id


def test_last_loaded_step(trainer):
    """TRL's vLLM branch syncs when the step moved and never once the step is marked loaded (the weights version
    of gigpo_trl.generation.weight_sync then decides alone)."""
    events = []

    class FakeVLLM:
        def sync_weights(self):
            events.append("sync")

        def generate(self, prompts, images, num_generations, profiler):
            events.append("generate")
            return None, [[7] for _ in prompts], [[[-0.5]] for _ in prompts], None

    with contract("GRPOTrainer._last_loaded_step"), \
            mock.patch.multiple(trainer, create=True, use_vllm=True, vllm_generation=FakeVLLM()):
        trainer._last_loaded_step = trainer.state.global_step - 1
        assert trl_compat.generate_single_turn(trainer, [[1, 2]]) == ([[7]], [[-0.5]])
        assert events == ["sync", "generate"]  # the step moved: TRL syncs
        trainer._last_loaded_step = trainer.state.global_step - 1
        trl_compat.mark_weights_loaded(trainer)
        assert trainer._last_loaded_step == trainer.state.global_step
        trl_compat.generate_single_turn(trainer, [[1, 2]])
        assert events == ["sync", "generate", "generate"]  # marked: no sync of TRL's own


def test_iter_named_params():
    from trl.generation.vllm_generation import VLLMGeneration

    with contract("VLLMGeneration._iter_named_params"):
        assert params(VLLMGeneration._iter_named_params) == ["self"]
        assert "self._iter_named_params()" in source(VLLMGeneration.sync_weights)


def test_vllm_weight_walk(tiny_tokenizer):
    """The pieces of ``VLLMGeneration._iter_named_params`` that ``vllm_glue``'s out-of-place LoRA walk re-uses
    (``_dist.gather_params`` / ``is_fsdp``, ``_fix_param_name_to_vllm``) and the instance attribute that replaces the
    walk: on a tiny LoRA model our walk yields TRL's names in TRL's order."""
    import copy

    from peft import LoraConfig, get_peft_model

    from tiny_models import build_tiny_model
    from gigpo_trl.generation.vllm_engine import install_out_of_place_lora_sync

    generation = bare_vllm_generation
    model = get_peft_model(build_tiny_model(tiny_tokenizer, hidden_size=32),
                           LoraConfig(r=2, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    with contract("VLLMGeneration._dist / _fix_param_name_to_vllm / _iter_named_params"):
        trl_names = [name for name, _ in trl_compat.iter_named_params(generation(copy.deepcopy(model)))]
        vg = generation(model)
        assert trl_compat.vllm_uses_fsdp(vg) is False
        with trl_compat.vllm_gather_params(vg, list(model.parameters())):
            pass
        assert trl_compat.vllm_param_name(vg, "a._checkpoint_wrapped_module.b.modules_to_save.default.weight",
                                          ["modules_to_save.default."]) == "a.b.weight"
        assert install_out_of_place_lora_sync(vg)
        assert [name for name, _ in trl_compat.iter_named_params(vg)] == trl_names
        assert "model.layers.0.self_attn.q_proj.weight" in trl_names


def test_vllm_client_post():
    """``VLLMClient._post(url, **kwargs)``: ``session.post`` with those arguments, the answer's JSON, an exception
    naming the status otherwise (what ``server_weights`` reads in its error)."""
    from trl.generation.vllm_client import VLLMClient

    client = object.__new__(VLLMClient)
    answers = {"http://s/ok": (200, b'{"results": [null]}'), "http://s/bad": (500, b"boom")}
    sent = []

    def post(url, **kwargs):
        sent.append((url, kwargs))
        response = SimpleNamespace(status_code=answers[url][0], text=answers[url][1].decode())
        response.json = lambda: __import__("json").loads(answers[url][1])
        return response

    client.session = SimpleNamespace(post=post)
    with contract("VLLMClient._post"):
        assert params(VLLMClient._post)[:2] == ["self", "url"]
        assert trl_compat.vllm_post(client, "http://s/ok", json={"method": "m"}) == {"results": [None]}
        assert sent == [("http://s/ok", {"json": {"method": "m"}})]
        with pytest.raises(Exception, match="Request failed: 500, boom"):
            trl_compat.vllm_post(client, "http://s/bad", json={})


def test_vllm_client_session():
    """Every HTTP request of ``VLLMClient`` after its ``__init__`` goes through ``self.session.get`` / ``.post``
    (so the session :mod:`gigpo_trl.generation.server_http` installs sees them all); only ``check_server`` (called
    from ``__init__``) sends on its own."""
    from trl.generation.vllm_client import VLLMClient

    with contract("VLLMClient.session"):
        for name, fn in inspect.getmembers(VLLMClient, inspect.isfunction):
            body = textwrap.dedent(source(fn))
            direct = re.findall(r"\brequests\.(get|post|put|request)\(", body)
            assert not direct or name == "check_server", f"VLLMClient.{name} sends without self.session: {direct}"
        assert "self.session.post(url, **kwargs)" in source(VLLMClient._post)
        assert "self.session.get(url, **kwargs)" in source(VLLMClient._get)
        assert "self.check_server(" in source(VLLMClient.__init__)
        client = object.__new__(VLLMClient)
        client.session = "old"
        assert trl_compat.vllm_client_session(client) == "old"
        trl_compat.set_vllm_client_session(client, "new")
        assert client.session == "new"


def test_config_name_or_path(trainer, tiny_model_dir):
    model = trainer.accelerator.unwrap_model(trainer.model)
    with contract("PretrainedConfig._name_or_path"):
        assert trl_compat.config_name_or_path(model.config) == tiny_model_dir == model.name_or_path
        trl_compat.set_config_name_or_path(model.config, "org/name")
        try:
            assert model.config.name_or_path == "org/name"
        finally:
            trl_compat.set_config_name_or_path(model.config, tiny_model_dir)


def test_set_sync_gradients():
    state = GradientState()
    before = state.sync_gradients
    with contract("GradientState._set_sync_gradients"):
        try:
            trl_compat.set_sync_gradients(SimpleNamespace(gradient_state=state), False)
            assert state.sync_gradients is False
            trl_compat.set_sync_gradients(SimpleNamespace(gradient_state=state), True)
            assert state.sync_gradients is True
        finally:
            state._set_sync_gradients(before)


def test_argparse_privates():
    parser = argparse.ArgumentParser(prog="x")
    a = parser.add_argument("--alpha", type=int, default=3, help="alpha help")
    b = parser.add_argument("--beta", type=int, default=4, help="beta help")
    with contract("argparse ArgumentParser._optionals._group_actions / _option_string_actions / _group_actions"):
        assert trl_compat.parser_optional_actions(parser)[1:] == [a, b]  # [0] is --help
        trl_compat.parser_optional_actions(parser)[:] = [x for x in trl_compat.parser_optional_actions(parser)
                                                          if x.dest == "help"]
        group = parser.add_argument_group("moved")
        trl_compat.add_actions_to_group(group, [a, b])
        text = parser.format_help()
        assert text.index("moved:") < text.index("  --alpha ALPHA  alpha help") and "beta help" in text
        trl_compat.unregister_option_strings(parser, b)
        assert parser.parse_args([]).beta == 4  # the default still fills the field
        with pytest.raises(SystemExit):
            parser.parse_args(["--beta", "5"])


# ---------------------------------------------------------------------------------------------- vLLM maths
def _trl_importance_block() -> str:
    text = source(GRPOTrainer._generate_and_score_completions)
    start = text.index("if self.use_vllm and self.vllm_importance_sampling_correction:")
    end = text.index("# Compute the per-token log probabilities for the reference model", start)
    return textwrap.dedent(text[start:end].split("\n", 1)[1])  # the body of the if


@pytest.mark.parametrize("mode, lo, hi", [
    ("token_truncate", 0.8, 1.05), ("token_mask", 0.8, 1.2), ("sequence_truncate", 0.7, 3.0),
    ("sequence_mask", 0.7, 3.0), ("sequence_mask", None, 3.0), ("token_mask", None, None),
])
def test_importance_ratio_matches_trl(mode, lo, hi):
    """Our :func:`gigpo_trl.forward.importance.importance_ratio` against TRL's own lines (cut out of
    ``_generate_and_score_completions`` and run) on the same log-probs, NaNs and mask included."""
    gen = torch.Generator().manual_seed(2)
    old = -torch.rand(4, 6, generator=gen) * 2
    sampling = old + 0.4 * torch.randn(4, 6, generator=gen)
    sampling[0, 2] = math.nan
    sampling[3] = math.nan
    mask = (torch.rand(4, 6, generator=gen) > 0.3).long()
    host = SimpleNamespace(vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=lo,
                           vllm_importance_sampling_clip_max=hi)
    with contract("GRPOTrainer._generate_and_score_completions (vLLM importance sampling block)"):
        scope = {"self": host, "completion_mask": mask, "tool_mask": None, "old_per_token_logps": old,
                 "sampling_per_token_logps": sampling, "torch": torch, "math": math}
        exec(compile(_trl_importance_block(), "<trl importance sampling>", "exec"), scope)
        ours = importance_ratio(old, sampling, mask, mode, lo, hi)
        torch.testing.assert_close(ours, scope["vllm_importance_sampling_ratio"], atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------- the boundary
def _library_private_names() -> set[str]:
    """Private attribute names of the classes whose internals trl_compat wraps (instances included)."""
    from accelerate import Accelerator
    from transformers import PretrainedConfig, PreTrainedModel
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration
    from trl.trainer.base_trainer import _BaseTrainer

    names: set[str] = set()
    for cls in (GRPOTrainer, Trainer, _BaseTrainer, Accelerator, GradientState, PretrainedConfig, PreTrainedModel,
                VLLMGeneration, VLLMClient, argparse.ArgumentParser, argparse._ArgumentGroup):
        names |= {n for n in dir(cls) if n.startswith("_") and not n.startswith("__")}
        names |= {n for n in re.findall(r"self\.(_[a-z]\w*)", inspect.getsource(cls))}  # instance attributes
    return names


LIBRARIES = ("trl", "transformers", "accelerate")


def test_no_private_library_attribute_outside_compat():
    """Only trl_compat.py reads, calls or patches a private attribute of TRL / transformers / accelerate / argparse;
    the others may define the hooks in ``OVERRIDDEN_HOOKS`` and call ``super().<hook>`` inside them. Every module of
    the package is scanned, subpackages included (``gigpo_trl/envs/``). TextWorld's private names are checked by
    ``test_no_textworld_private_outside_compat``."""
    private = _library_private_names() - set(trl_compat.OVERRIDDEN_HOOKS) - {"_tag_names", "_name", "_paper"}
    offenders = []  # the package's own private names must not reuse a library's either: that would hide an access
    scanned = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE) == Path("trl_compat.py"):
            continue
        scanned.append(path.relative_to(PACKAGE).as_posix())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                offenders.append(f"{scanned[-1]}:{node.lineno} .{node.attr}")
            # `from trl.x._y import z` / `from transformers.x import _z`: a private import is an access too
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARIES:
                names = node.module.split(".") + [a.name for a in node.names]
                if any(n.startswith("_") and not n.startswith("__") for n in names):
                    offenders.append(f"{scanned[-1]}:{node.lineno} from {node.module} import "
                                     f"{', '.join(a.name for a in node.names)}")
    assert {"job/arguments.py", "envs/base.py", "envs/webshop/env.py", "envs/alfworld/engine.py"} <= set(scanned)
    assert not offenders, f"private library attributes outside gigpo_trl/trl_compat.py: {offenders}"


TEXTGEN_PRIVATES = ("_PARSER", "_Converter", "_parse_and_convert")


def test_textworld_textgen_privates():
    """envs/alfworld/engine.py memoises TextWorld's grammar parse through trl_compat: the parse is a pure function of
    the string, and ``_Converter().walk`` of one tree gives what ``_parse_and_convert`` gives, as new objects each call."""
    textgen = pytest.importorskip("textworld.envs.pddl.textgen")
    text = "You see a #obj#, and {o.name} here."
    with contract("textworld textgen._PARSER.parse / textgen._Converter / textgen._parse_and_convert"):
        parse = trl_compat.textgen_parse(textgen)
        converter = trl_compat.textgen_converter(textgen)
        tree = parse(text, rule_name="symbols")
        first, second = converter().walk(tree), converter().walk(tree)
        reference = trl_compat.textgen_parse_and_convert(textgen)(text, rule_name="symbols")
        assert repr(first) == repr(second) == repr(reference)
        assert [type(x).__name__ for x in first] == ["TerminalSymbol", "NonterminalSymbol", "TerminalSymbol",
                                                     "ConditionalSymbol", "TerminalSymbol"]
        assert all(a is not b for a, b in zip(first, second))  # fresh symbols: derivations may mutate them
        original = trl_compat.textgen_parse_and_convert(textgen)
        try:
            trl_compat.set_textgen_parse_and_convert(textgen, "sentinel")
            assert textgen._parse_and_convert == "sentinel"
        finally:
            trl_compat.set_textgen_parse_and_convert(textgen, original)


def test_no_textworld_private_outside_compat():
    """No module but trl_compat.py names a private attribute of TextWorld's text generation."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE) == Path("trl_compat.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in TEXTGEN_PRIVATES:
                offenders.append(f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno} .{node.attr}")
    assert not offenders, f"TextWorld private names outside gigpo_trl/trl_compat.py: {offenders}"
