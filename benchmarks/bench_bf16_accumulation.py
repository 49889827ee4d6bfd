"""bf16 gradient accumulation over token-budget sub-batches: does summing 16 sub-batch gradients
in a bf16 ``.grad`` lose more than the bf16 forward/backward itself already does?

A bf16 tiny Qwen2 and a policy-gradient-shaped loss (Σ advantage × token log-prob / token count) over 16 rows:
the gradient of one backward over all rows and the sum of 16 backwards of one row each (what the budget does when
each sub-batch holds one row), both in bf16, against the fp32 gradient of the same weights.

    python benchmarks/bench_bf16_accumulation.py [--rows 16] [--hidden 64] [--length 96]

Prints the relative error ‖g − g_fp32‖ / ‖g_fp32‖ of each bf16 gradient, and the same for fp32 accumulation of
the 16 bf16 sub-batch gradients (the alternative: an fp32 buffer).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--length", type=int, default=96)
    return parser


if __name__ == "__main__":
    build_parser().parse_args()  # --help and a bad flag answer before the heavy imports

import torch
from results_io import is_default_run, write_result

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def loss_of(model, ids, advantages, n_tokens):
    logits = model(input_ids=ids).logits[:, :-1].float()
    logps = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return -(advantages[:, None] * logps).sum() / n_tokens


def grads(model):
    return torch.cat([p.grad.float().flatten() for p in model.parameters()])


def measure(rows: int, hidden: int, length: int, seed: int = 0) -> dict:
    from conftest import CORPUS

    from tiny_models import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(CORPUS, vocab_size=300)
    fp32 = build_tiny_model(tokenizer, hidden_size=hidden, seed=seed)
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    fp32.load_state_dict({k: v.float() for k, v in bf16.state_dict().items()})  # the same (bf16-exact) weights
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, len(tokenizer), (rows, length), generator=gen)
    advantages = torch.randn(rows, generator=gen)
    n_tokens = rows * (length - 1)
    loss_of(fp32, ids, advantages, n_tokens).backward()
    reference = grads(fp32)
    loss_of(bf16, ids, advantages, n_tokens).backward()
    one = grads(bf16)
    buffer = torch.zeros_like(reference)
    for i in range(rows):  # each sub-batch's bf16 gradient on its own, summed in fp32
        bf16.zero_grad(set_to_none=True)
        loss_of(bf16, ids[i : i + 1], advantages[i : i + 1], n_tokens).backward()
        buffer += grads(bf16)
    bf16.zero_grad(set_to_none=True)
    for i in range(rows):  # accumulated in the bf16 .grad, as Trainer/DDP do: one rounding per sub-batch
        loss_of(bf16, ids[i : i + 1], advantages[i : i + 1], n_tokens).backward()
    split_bf16 = grads(bf16)

    def rel(g):
        return float((g - reference).norm() / reference.norm())

    return {"one_backward": rel(one), "split_bf16_grad": rel(split_bf16), "split_fp32_buffer": rel(buffer)}


def main():
    cli = build_parser().parse_args()
    torch.set_num_threads(1)
    figures = {}
    for seed in (0, 1, 2):
        r = measure(cli.rows, cli.hidden, cli.length, seed)
        figures[f"rel_error_vs_fp32_seed{seed}"] = {"one_bf16_backward": float(f"{r['one_backward']:.2e}"),
                                                   "summed_in_bf16": float(f"{r['split_bf16_grad']:.2e}"),
                                                   "summed_in_fp32": float(f"{r['split_fp32_buffer']:.2e}")}
        print(f"seed {seed}: rel. error vs fp32 gradient: 1 bf16 backward {r['one_backward']:.2e}; "
              f"{cli.rows} sub-batches summed in bf16 .grad {r['split_bf16_grad']:.2e}; "
              f"summed in an fp32 buffer {r['split_fp32_buffer']:.2e}", flush=True)
    write_result("bench_bf16_accumulation", figures, recorded=is_default_run(build_parser(), cli))


if __name__ == "__main__":
    main()
