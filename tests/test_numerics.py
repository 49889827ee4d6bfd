"""Numbers that hold in bf16 (issue 20): LoRA weight sync out of place, positions from the attention mask, the
budget-off loss scale, filler rows, and the DeepSpeed step guard. CPU only, no vLLM."""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import pytest
import torch
from toy_env import NoisyCorridorEnv
from test_trainer import capture_rollouts, make_args

from gigpo_trl import GiGPOTrainer
from gigpo_trl.numerics import DeepSpeedStepGuard, install_mask_positions, positions_from_mask


# ---------------------------------------------------------------------------------------------- LoRA sync
def _lora_bf16_model(tokenizer):
    from peft import LoraConfig, get_peft_model

    from gigpo_trl.models import build_tiny_model

    model = build_tiny_model(tokenizer, hidden_size=64).to(torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                             target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained adapter: PEFT starts B at 0, whose merge would change nothing
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def _vllm_generation(model):
    """TRL's VLLMGeneration holding ``model``, without starting vLLM (the attributes its weight walk reads)."""
    from trl.distributed import DistributedBackend
    from trl.generation.vllm_generation import VLLMGeneration

    vg = VLLMGeneration.__new__(VLLMGeneration)
    vg.model = model
    vg._dist = DistributedBackend(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=None)))
    return vg


def _ordered(x):
    """bf16 bit patterns as integers ordered like the values: a difference of 1 is one ulp."""
    i = x.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(i < 0, -32768 - i, i)


def test_lora_sync_never_writes_base_weights_and_sends_the_fp32_merge(tiny_tokenizer):
    from gigpo_trl.vllm_glue import install_out_of_place_lora_sync

    model = _lora_bf16_model(tiny_tokenizer)
    vg = _vllm_generation(model)
    initial = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    # TRL's own walk, once, on a copy: the in-place merge/unmerge moves base weights (what this replaces)
    trl_copy = copy.deepcopy(model)
    list(_vllm_generation(trl_copy)._iter_named_params())
    moved = sum(int((p != initial[n]).sum()) for n, p in trl_copy.named_parameters() if n in initial)
    assert moved > 0
    assert install_out_of_place_lora_sync(vg)
    gen = torch.Generator().manual_seed(1)
    for k in range(300):
        sent = {name: t.clone() for name, t in vg._iter_named_params()}
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
    trainer = GiGPOTrainer(model, env=NoisyCorridorEnv, args=args, processing_class=tiny_tokenizer)
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
    # Other shifts, and PyTorch's CPU sdpa kernel at any shift, still round differently (~2e-3 to 4e-3 in bf16:
    # benchmarks/bench_positions.py); the on-policy ratio is exactly 1 whatever the kernel (next test).
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
    # TRL's forward: the log-probs move with the padding (figure quoted in the closing note)
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
    # ratios off 1 (here max |log ratio| 4e-5, 0.8 % of tokens clipped at clip range 0; figures in the closing note)
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
