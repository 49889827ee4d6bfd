"""The critic's forwards (gigpo_trl.critic.model): packed and shared as the policy's are (shared prompt prefixes,
trajectory chains), with the values and gradients of the plain forward of each row whole, and the padded tokens counted
by hand."""

from __future__ import annotations

import pytest
import torch

from conftest import trl_layout

from gigpo_trl.critic import Critic

T = [5, 6, 7, 8]  # system prompt and task: every row's first tokens
# Two conversation trajectories of two turns each: turn 2's prompt is turn 1's prompt + completion + an observation.
CHAINED = ([T + [10], T + [10, 20, 21, 11], T + [12], T + [12, 23, 24, 13]], [[20, 21], [22], [23, 24], [25, 26]])
# Window prompts: the rows share the task, no row extends another.
WINDOW = ([T + [10, 11], T + [12], T + [13, 14, 15], T + [16]], [[20, 21], [22], [23], [25, 26]])


def batch_of(prompts, completions, width=3):
    ids, mask = trl_layout(prompts, completions, 0, width)
    p = ids.size(1) - width
    return {"prompt_ids": ids[:, :p], "prompt_mask": mask[:, :p], "completion_ids": ids[:, p:],
            "completion_mask": mask[:, p:]}


@pytest.fixture(scope="module")
def critic(tiny_tokenizer):
    from tiny_models import build_tiny_model

    policy = build_tiny_model(tiny_tokenizer)
    torch.manual_seed(1)
    return policy, Critic(policy, None, "cpu")  # a copy of the policy's decoder, fp32


def padded_tokens(critic, run):
    """Run ``run()`` and return the ``input_ids.numel()`` of every forward of the critic's decoder."""
    seen = []
    hook = critic.model.embed_tokens.register_forward_pre_hook(lambda m, args: seen.append(args[0].numel()))
    try:
        out = run()
    finally:
        hook.remove()
    return out, seen


@pytest.mark.parametrize("level", ["token", "turn"])
@pytest.mark.parametrize("rows, kind", [(CHAINED, "chains"), (WINDOW, "prefix")])
def test_shared_values_equal_the_plain_forwards(critic, level, rows, kind):
    policy, c = critic
    batch = batch_of(*rows)
    plain = c.values(policy, batch, level, [0, 1, 2, 3], None, sharing=False)
    forwards = c.forwards(batch, level, [0, 1, 2, 3], None, sharing=True)
    # token values: the chained forward, which shares prefixes where no row extends another (as the policy's);
    # turn values without chains: a shared-prefix forward of the prompts alone
    expected_kind = "chains" if level == "token" else kind
    assert [(f[0], f[1]) for f in forwards] == [([0, 1, 2, 3], expected_kind)]
    shared = c.values(policy, batch, level, [0, 1, 2, 3], None, sharing=True)
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-6)
    if level == "token":  # a value before every completion token, 0 past it
        assert (shared != 0).sum(1).tolist() == [len(x) for x in rows[1]]
    # rows in another order, in forwards of at most 12 padded tokens: the same value per row
    budget = c.values(policy, batch, level, [3, 1, 0, 2], 12, sharing=True)
    torch.testing.assert_close(budget, plain[[3, 1, 0, 2]], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows, level, plain, shared", [
    # Chains. Plain: 4 rows × (8 prompt + 2 completion) = 40 for token values, 4 × 8 = 32 for turn values (prompts
    # alone). Shared: the two trajectories' last rows (9 and 10 tokens) as two units that share T in one prefix pass
    # (1 × 4), the rest in the suffix pass, 2 × (1 prompt column + 5 completion columns) = 12, for token and turn
    # values alike (a turn's value is read from its trajectory's forward).
    (CHAINED, "token", 40, [4, 12]), (CHAINED, "turn", 32, [4, 12]),
    # Window. Plain: 4 × (7 + 2) = 36, or 4 × 7 = 28 for the prompts alone. Shared: T once (1 × 4), then each row's
    # prompt tail (at most 3 columns) and completion: 4 × (3 + 2) = 20, or 4 × 3 = 12 for the prompts alone.
    (WINDOW, "token", 36, [4, 20]), (WINDOW, "turn", 28, [4, 12]),
])
def test_shared_forwards_compute_each_shared_token_once(critic, rows, level, plain, shared):
    policy, c = critic
    batch = batch_of(*rows)
    assert padded_tokens(c, lambda: c.values(policy, batch, level, [0, 1, 2, 3], None, sharing=False))[1] == [plain]
    assert padded_tokens(c, lambda: c.values(policy, batch, level, [0, 1, 2, 3], None, sharing=True))[1] == shared


@pytest.mark.parametrize("rows, level, plain, shared", [
    # real tokens. Chains: rows of 7 + 9 + 7 + 10 = 33; shared, T once and each trajectory's last row's rest: 4 + 5 + 6
    # = 15, for turn values too (read from the chained forward). Window: 8 + 6 + 8 + 7 = 29, T counted once: 29 - 12
    # = 17; the prompts alone 6 + 5 + 7 + 5 = 23, shared 11.
    (CHAINED, "token", 33, 15), (CHAINED, "turn", 26, 15), (WINDOW, "token", 29, 17), (WINDOW, "turn", 23, 11),
])
def test_the_critic_counts_the_tokens_its_forwards_computed(critic, rows, level, plain, shared):
    policy, c = critic
    batch = batch_of(*rows)
    for sharing, expected in ((False, plain), (True, shared)):
        c.forwarded_tokens = 0
        c.values(policy, batch, level, [0, 1, 2, 3], None, sharing=sharing)
        assert c.forwarded_tokens == expected


def test_shared_value_gradients_equal_the_plain_forwards(critic):
    policy, c = critic
    weights = torch.randn(4, 3, generator=torch.Generator().manual_seed(3))
    grads = {}
    for sharing in (False, True):
        batch = batch_of(*CHAINED)
        for p in c.parameters(policy):
            p.grad = None
        for forward in c.forwards(batch, "token", [0, 1, 2, 3], 24, sharing):
            (c.pack_values(policy, batch, "token", forward) * weights[forward[0]]).sum().backward()
        grads[sharing] = [p.grad.clone() for p in c.parameters(policy)]
    for plain, shared in zip(grads[False], grads[True]):
        torch.testing.assert_close(shared, plain, rtol=1e-4, atol=1e-6)
    assert any(float(g.abs().sum()) > 0 for g in grads[True][:-2])  # the decoder itself gets gradient, not just the head
