"""Numbers that hold in bf16: LoRA weight sync out of place, positions from the attention mask, the
budget-off loss scale, filler rows, and the DeepSpeed step guard. CPU only, no vLLM."""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import pytest
import torch
from conftest import capture_rollouts, tiny_lora_model
from conftest import tiny_train_config as make_args
from toy_env import NoisyLineWalkEnv

from gigpo_trl import GiGPOTrainer, trl_compat
from gigpo_trl.grad_accumulation import DeepSpeedStepGuard
from gigpo_trl.positions import install_mask_positions, positions_from_mask


# ---------------------------------------------------------------------------------------------- LoRA sync
def _ordered(x):
    """bf16 bit patterns as integers ordered like the values: a difference of 1 is one ulp."""
    i = x.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(i < 0, -32768 - i, i)


def test_lora_sync_never_writes_base_weights_and_sends_the_fp32_merge(tiny_tokenizer):
    from gigpo_trl.vllm_glue import install_out_of_place_lora_sync

    model = tiny_lora_model(tiny_tokenizer)
    vg = trl_compat.bare_vllm_generation(model)
    initial = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    # TRL's own walk, once, on a copy: the in-place merge/unmerge moves base weights (what this replaces)
    trl_copy = copy.deepcopy(model)
    list(trl_compat.iter_named_params(trl_compat.bare_vllm_generation(trl_copy)))
    moved = sum(int((p != initial[n]).sum()) for n, p in trl_copy.named_parameters() if n in initial)
    assert moved > 0
    assert install_out_of_place_lora_sync(vg)
    gen = torch.Generator().manual_seed(1)
    for k in range(300):
        sent = {name: t.clone() for name, t in trl_compat.iter_named_params(vg)}
        if k in (0, 150, 299):
            # the reference: PEFT's merge on an fp32 copy, cast to bf16 once
            reference = {n: p.detach().to(torch.bfloat16)
                         for n, p in copy.deepcopy(model).float().merge_and_unload().named_parameters()}
            assert sent.keys() == reference.keys()
            assert "model.layers.0.self_attn.q_proj.weight" in sent and not any("lora" in n for n in sent)
            for name in sent:
                assert sent[name].dtype == torch.bfloat16
                assert int((_ordered(sent[name]) - _ordered(reference[name])).abs().max()) <= 1, name
            q = "model.layers.0.self_attn.q_proj.weight"
            assert not torch.equal(sent[q], initial["base_model.model." + q.replace(".weight", ".base_layer.weight")])
        with torch.no_grad():  # an optimizer step on the adapter between syncs
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) * 1e-3)
    for name, p in model.named_parameters():
        if name in initial:
            assert torch.equal(p, initial[name]), name  # bit for bit


# ---------------------------------------------------------------------------------------------- positions
def test_positions_from_mask_hand_computed():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2, 0], [0, 1, 2, 3, 0, 0]]


@pytest.fixture(scope="module")
def bf16_trainer(tmp_path_factory, tiny_tokenizer):
    """A trainer on a bf16 tiny model (hidden 64), budget on, with one rollout's rows; spg 2 vs GA 1, so the old
    log-probs come from the scoring pass, as off-policy micro-batches need."""
    from gigpo_trl.models import build_tiny_model

    tmp = tmp_path_factory.mktemp("bf16")
    model = build_tiny_model(tiny_tokenizer, hidden_size=64).to(torch.bfloat16)
    args = make_args(tmp, max_tokens_per_microbatch=400, steps_per_generation=2, gradient_accumulation_steps=1,
                     max_turns=4)
    trainer = GiGPOTrainer(model, env=NoisyLineWalkEnv, args=args, processing_class=tiny_tokenizer)
    texts = ["<think>r</think><action>left</action>", "<think>going left now, slowly</think><action>left</action>",
             "<think>left</think><action>left</action> and some more words to make it long"]
    calls = []

    def policy(ids):  # fixed: episodes of 4 turns (growing prompts), completions of three lengths
        calls.append(1)
        return [tiny_tokenizer.encode(texts[(i + len(calls)) % 3]) for i in range(len(ids))], None

    trainer.collector.generate_fn = policy
    batches = capture_rollouts(trainer)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    trainer._generate_and_score_completions([{"task": 4, "seed": 1}] * 4 + [{"task": 6, "seed": 2}] * 4)
    return trainer, batches[0].rows


def _logps_at_widths(trainer, row_ids, n_prompt, pads):
    out = []
    for pad in pads:
        ids = torch.cat([torch.full((1, pad), trainer._tokenizer.pad_token_id), row_ids], 1)
        mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones_like(row_ids)], 1)
        with torch.no_grad():
            out.append(trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, row_ids.size(1) - n_prompt)[0])
    return out


@contextlib.contextmanager
def _trl_positions(trainer):
    """TRL's forward for the duration of the block: no position_ids (positions 0..L-1 of the padded row)."""
    backbone = trainer.model.base_model
    backbone._gigpo_mask_positions.remove()
    backbone._gigpo_mask_positions = None
    try:
        yield
    finally:
        assert install_mask_positions(trainer.model)


def test_same_row_in_batches_of_different_widths_gives_identical_logps(bf16_trainer):
    # What positions decide: with eager attention and shifts of whole 64-column blocks (the CPU bf16 GEMMs then sum
    # the same products in the same order), a row's log-probs are bit-identical; with TRL's positions they are not.
    # Other shifts, and PyTorch's CPU sdpa kernel at any shift, still round differently (figures: benchmarks/README.md,
    # "bf16 numerics"); the on-policy ratio is exactly 1 whatever the kernel (next test).
    trainer, rows = bf16_trainer
    assert next(trainer.model.parameters()).dtype == torch.bfloat16
    row = rows[-1]
    ids = torch.tensor([row.prompt_ids + row.completion_ids])
    pads = [0, 64, 128, 704]
    config = trainer.model.config
    config._attn_implementation, saved = "eager", config._attn_implementation
    try:
        after = _logps_at_widths(trainer, ids, len(row.prompt_ids), pads)
        with _trl_positions(trainer):
            before = _logps_at_widths(trainer, ids, len(row.prompt_ids), pads)
    finally:
        config._attn_implementation = saved
    assert [float((a - after[0]).abs().max()) for a in after[1:]] == [0.0] * (len(pads) - 1)
    assert torch.equal(before[0], after[0])  # no padding: the same positions either way
    # TRL's forward: the log-probs move with the padding
    assert max(float((b - before[0]).abs().max()) for b in before[1:]) > 1e-3


def _micro_step_loss(trainer, inputs, sign):
    """TRL's budgeted loss (no update) on ``inputs`` with clip range 0 (any ratio != 1 on a token whose advantage
    has the ratio's sign is clipped); returns TRL's clip-ratio metric and max |log π − log π_old| over the loss
    tokens of the training forwards (0 where π_old is the forward's own values)."""
    n = inputs["advantages"].size(0)  # the fixed policy's rollouts all score alike: advantages of both signs instead
    inputs = dict(inputs, advantages=sign * torch.linspace(-1.0, 1.0, n))
    seen = []
    plain, compute = trainer._get_per_token_logps_and_entropies, trainer._compute_loss

    def record_inputs(model, sub):
        seen.append([sub.get("old_per_token_logps"), sub["completion_mask"]])
        return compute(model, sub)

    def record_logps(*a, **k):
        out = plain(*a, **k)
        if torch.is_grad_enabled():
            seen[-1].append(out[0].detach())
        return out

    trainer._compute_loss, trainer._get_per_token_logps_and_entropies = record_inputs, record_logps
    trainer.epsilon_low = trainer.epsilon_high = 0.0
    trainer._metrics["train"].clear()
    try:
        loss = trainer.compute_loss(trainer.model, inputs)
        trainer.accelerator.backward(loss)
    finally:
        del trainer._compute_loss, trainer._get_per_token_logps_and_entropies
        trainer.epsilon_low = trainer.epsilon_high = 0.2
        trainer.model.zero_grad()
    assert len(seen) >= 3  # several sub-batches of different widths
    deviation = max(0.0 if old is None else float(((new - old) * mask).abs().max()) for old, mask, new in seen)
    return trainer._metrics["train"]["clip_ratio/region_mean"][-1], deviation


def test_on_policy_ratio_is_exactly_one_with_the_budget(bf16_trainer):
    """Through TRL's _prepare_inputs (rollout, scoring pass, shuffle, split): spg 2 vs GA 1, so micro-step 0 is
    on-policy and micro-step 1 follows an optimizer step; the scoring pass (old log-probs) runs for micro-step 1."""
    trainer, _ = bf16_trainer
    trainer._step, trainer._buffered_inputs = 0, None
    torch.manual_seed(0)  # TRL's shuffle of the generation batch: the same micro-batches on every run
    first = trainer._prepare_inputs([{"task": 4, "seed": 1}] * 4 + [{"task": 6, "seed": 2}] * 4)
    assert "old_per_token_logps" not in first  # on-policy: π_old is the training forward's own log-probs
    assert "old_per_token_logps" in trainer._buffered_inputs[0]  # the scoring pass's values, kept for later
    for sign in (1.0, -1.0):  # both signs: each token's ratio is checked against one side of the clip
        assert _micro_step_loss(trainer, first, sign) == (0.0, 0.0)
    trainer._step = 1
    second = trainer._prepare_inputs(None)
    assert second["old_per_token_logps"] is trainer._buffered_inputs[1]["old_per_token_logps"]  # off-policy: kept
    # Before: the stored scoring-pass values as π_old on the on-policy micro-step (TRL's positions, sdpa kernel):
    # ratios off 1, so some tokens are clipped at clip range 0
    stored = trainer._buffered_inputs[0]
    with _trl_positions(trainer):
        clipped, deviation = _micro_step_loss(trainer, stored, 1.0)
    assert clipped > 0 and deviation > 0
    # the same with positions from the mask: the forwards' shapes still differ, so kernels still round differently
    assert _micro_step_loss(trainer, stored, 1.0)[1] > 0


# ---------------------------------------------------------------------------------------------- DeepSpeed guard
def test_deepspeed_step_guard_names_both_counts_and_the_accelerate_version():
    import accelerate

    engine = SimpleNamespace(global_steps=5)
    guard = DeepSpeedStepGuard(lambda: engine)
    state = SimpleNamespace(global_step=5)  # a resumed run: both counts restored
    guard.on_train_begin(None, state, None)
    engine.global_steps, state.global_step = 6, 6
    guard.on_step_end(None, state, None)  # one optimizer step each: fine
    engine.global_steps, state.global_step = 8, 7  # the engine stepped twice in one Trainer step
    with pytest.raises(RuntimeError, match=rf"engine made 8 optimizer step\(s\) but Trainer counts "
                                           rf"state.global_step=7.*accelerate {accelerate.__version__}"):
        guard.on_step_end(None, state, None)
    plain = DeepSpeedStepGuard(lambda: torch.nn.Linear(1, 1))  # no DeepSpeed engine: never checks
    plain.on_train_begin(None, state, None)
    state.global_step = 100
    plain.on_step_end(None, state, None)


# ---------------------------------------------------------------------------------------------- filler, loss scale
def test_filler_rows_scored_at_one_token(bf16_trainer):
    trainer, rows = bf16_trainer
    real = rows[:5]
    shapes = []
    hook = trainer.model.register_forward_pre_hook(
        lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        batch = trainer._rows_to_batch(real, torch.zeros(5).numpy(), [8], "train")  # 5 rollout rows + 3 filler
        n_batch = len(shapes)
        alone = trainer._rows_to_batch(real, torch.zeros(5).numpy(), [5], "train")  # spg 2: 5 rows + 1 filler
    finally:
        hook.remove()
    assert batch["real_row_mask"].tolist() == [1] * 5 + [0] * 3
    width = batch["completion_ids"].size(1)
    assert shapes[n_batch - 1] == (3, 2)  # the three filler rows: one prompt + one completion token, one forward
    assert all(s[1] > width for s in shapes[: n_batch - 1])  # rollout rows at the full completion width
    assert shapes[-1] == (1, 2)
    old, old_alone = batch["old_per_token_logps"], alone["old_per_token_logps"]
    assert torch.equal(old[:5], old_alone[:5])  # rollout rows: the same forwards with or without filler
    assert bool((old[5:] == 0).all())  # masked columns: TRL's fused head gives 0 there, as for any masked token


def test_budget_off_entropy_bonus_keeps_trls_scaling(bf16_trainer):
    """10 rollout rows + 6 filler, row-mean loss (grpo), entropy bonus on, no budget: the loss is TRL's own loss on
    the 10 rows; the former B/R factor (16/10 on TRL's loss of all 16 rows) also scaled the entropy bonus."""
    from trl import GRPOTrainer

    trainer, rows = bf16_trainer
    ten = rows[:10]
    padded = trainer._rows_to_batch(ten, torch.linspace(-1, 1, 10).numpy(), [16], "train")
    assert padded["real_row_mask"].sum() == 10 and padded["completion_mask"].size(0) == 16
    alone = {k: (v[:10] if isinstance(v, torch.Tensor) and v.ndim else v) for k, v in padded.items()}
    saved = (trainer.args.max_tokens_per_microbatch, trainer.loss_type, trainer.entropy_coef)
    trainer.args.max_tokens_per_microbatch, trainer.loss_type = None, "grpo"
    try:
        with torch.no_grad():
            trl_compat.set_entropy_coef(trainer, 0.0)
            no_bonus = float(trainer.compute_loss(trainer.model, padded))
            trl_compat.set_entropy_coef(trainer, 0.5)
            ours = float(trainer.compute_loss(trainer.model, padded))
            trl_own = float(GRPOTrainer.compute_loss(trainer, trainer.model, alone))
            scaled_all = float(GRPOTrainer.compute_loss(trainer, trainer.model, padded)) * 16 / 10
    finally:
        trainer.args.max_tokens_per_microbatch, trainer.loss_type = saved[:2]
        trl_compat.set_entropy_coef(trainer, saved[2])
    assert abs(ours - no_bonus) > 0.1  # the bonus takes part
    assert ours == trl_own
    assert abs(scaled_all - ours) > 0.05  # what B/R on the whole loss gave: 0.6 x the bonus too much


# ---------------------------------------------------------------------------------------------- unwrap
def test_generation_unwrap_exit_runs_when_the_block_raises(bf16_trainer):
    """TRL's unwrap re-enables gradient checkpointing (and, under ZeRO-3, re-adds the parameter hooks) after its
    yield; here that runs although the block raised."""
    from trl.models import unwrap_model_for_generation

    from gigpo_trl.generation import unwrap_for_generation

    trainer, _ = bf16_trainer
    model = trainer.model
    model.gradient_checkpointing_enable()
    try:
        with pytest.raises(KeyError):
            with unwrap_model_for_generation(model, trainer.accelerator):
                assert not model.is_gradient_checkpointing
                raise KeyError("inside the collect")
        assert not model.is_gradient_checkpointing  # TRL's own: left off
        model.gradient_checkpointing_enable()
        with pytest.raises(KeyError):
            with unwrap_for_generation(model, trainer.accelerator):
                assert not model.is_gradient_checkpointing
                raise KeyError("inside the collect")
        assert model.is_gradient_checkpointing
    finally:
        model.gradient_checkpointing_disable()


# ---------------------------------------------------------------------------------------------- fp32 accumulation
def test_bf16_sub_batch_gradients_are_summed_in_fp32(bf16_trainer, monkeypatch):
    """One row per sub-batch (32 sub-batches) on the bf16 model, against the fp32 gradient of the same weights:
    summed in fp32 its relative error is below one unsplit bf16 backward's, and summed in the bf16 ``.grad`` it is
    more than 1.5 times the fp32 sum's (figures: benchmarks/README.md, "bf16 numerics")."""
    from gigpo_trl import grad_accumulation

    trainer, rows = bf16_trainer
    batch = trainer._rows_to_batch(rows, torch.linspace(-1, 1, len(rows)).numpy(), [len(rows)], "train")
    widest = int(batch["prompt_mask"].sum(1).max()) + batch["completion_ids"].size(1)

    def grad(budget):
        trainer.args.max_tokens_per_microbatch = budget
        trainer.model.zero_grad(set_to_none=True)
        try:
            trainer.accelerator.backward(trainer.compute_loss(trainer.model, batch))
        finally:
            trainer.args.max_tokens_per_microbatch = 400
        out = torch.cat([p.grad.float().flatten() for p in trainer.model.parameters()])
        trainer.model.zero_grad(set_to_none=True)
        return out

    trainer.model.float()  # the same (bf16-exact) weights in fp32: the reference
    try:
        reference = grad(None)
    finally:
        trainer.model.to(torch.bfloat16)
    one = grad(None)
    split_fp32 = grad(widest)
    monkeypatch.setattr(grad_accumulation.Fp32GradAccumulator, "for_model", classmethod(lambda cls, *a: None))
    split_bf16 = grad(widest)

    def rel(g):
        return float((g - reference).norm() / reference.norm())

    assert len(rows) >= 16
    assert rel(split_fp32) < rel(one)
    assert rel(split_bf16) > 1.5 * rel(split_fp32)


def test_budget_off_moe_aux_loss_keeps_trls_scaling(bf16_trainer, tmp_path, tiny_tokenizer):
    """The same for the MoE load-balancing loss (router_aux_loss_coef), which the budget refuses but the budget-off
    path must scale as TRL does: our loss on 10 rollout rows + 6 filler is TRL's loss on the 10 rows."""
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM
    from trl import GRPOTrainer

    _, rows = bf16_trainer
    torch.manual_seed(0)
    config = Qwen2MoeConfig(
        vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, router_aux_loss_coef=0.5, output_router_logits=True,
        pad_token_id=tiny_tokenizer.pad_token_id, eos_token_id=tiny_tokenizer.eos_token_id,
    )
    args = make_args(tmp_path, max_tokens_per_microbatch=None, loss_type="grpo")
    trainer = GiGPOTrainer(Qwen2MoeForCausalLM(config), env=NoisyLineWalkEnv, args=args,
                           processing_class=tiny_tokenizer)
    assert trainer.aux_loss_enabled
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    padded = trainer._rows_to_batch(rows[:10], torch.linspace(-1, 1, 10).numpy(), [16], "train")
    alone = {k: (v[:10] if isinstance(v, torch.Tensor) and v.ndim else v) for k, v in padded.items()}
    with torch.no_grad():
        ours = float(trainer.compute_loss(trainer.model, padded))
        trl_own = float(GRPOTrainer.compute_loss(trainer, trainer.model, alone))
        trainer.router_aux_loss_coef = 0.0
        without_aux = float(GRPOTrainer.compute_loss(trainer, trainer.model, alone))
    assert abs(trl_own - without_aux) > 0.1  # the aux loss takes part
    assert ours == pytest.approx(trl_own, rel=1e-6, abs=1e-7)
