"""TRL's own multi-turn GRPO (``GRPOTrainer(environment_factory=...)``) against ``GiGPOTrainer(env=...)`` on one TRL
tool environment, at a fixed number of tool calls per episode.

The environment (:class:`Ticker`, a TRL ``environment_factory`` class, given to both trainers unchanged) asks for
exactly ``--calls`` calls of its tool ``tick()``; ``get_reward()`` is 1 when the count is right. The policy's text
comes from a scripted player in both trainers (``_generate_single_turn`` replaced: a fixed ``<think>`` of
``--think`` words, then ``<tool_call>{"name": "tick", "arguments": {}}</tool_call>``, or ``done`` once the last
observation says ``tick N of N``), so both play whole episodes with the same completions and the same generate
calls, and the figures compare the training side: rollout bookkeeping, old/ref scoring and the loss
forward/backward. Model: the default SmolLM2-135M-Instruct (``gigpo_trl.models.default_model_path()``), its
tokenizer with TRL's Qwen2.5 chat template (TRL's tool parsing knows no SmolLM2 template), fp32, LoRA r16 on all
projections, gradient checkpointing, 2 tasks × 2 rollouts per iteration, beta 0, loss ``dapo``.

Each trainer runs in its own process (``--arm trl|ours|ours-unshared``); without ``--arm`` the script runs the three
arms one after the other and prints one table row per arm:

    python benchmarks/bench_vs_trl.py --calls 3 --iterations 2

Per arm: seconds per iteration (the mean over iterations after the first, which is a warm-up), peak RSS of the
process, loss tokens per iteration (TRL: completion tokens minus tool-result tokens, ``completion_mask ×
tool_mask``; ours: the rows' completion tokens) and forward tokens per iteration in the loss (``input_ids.numel()``
of every gradient-enabled forward, padding and both passes of a shared-prefix forward included) and in the no-grad
scoring forwards.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import write_result

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


class Ticker:
    """TRL ``environment_factory`` environment: call ``tick`` exactly ``calls`` times, then stop."""

    calls = 3

    def reset(self, **row) -> str:
        self.k = 0
        return f"Call the tool tick exactly {self.calls} times, one call per turn, then answer done."

    def tick(self) -> str:
        """Advance the counter by one.

        Returns:
            The counter after the call.
        """
        self.k += 1
        return f"tick {self.k} of {self.calls}"

    def get_reward(self) -> float:
        return 1.0 if self.k == self.calls else 0.0


def scripted_player(tokenizer, calls: int, think: int):
    """``_generate_single_turn`` replacement: one completion per prompt, from the prompt's last ``tick k of N``."""
    thought = "<think>" + " ".join(["counting"] * think) + "</think>"
    call = tokenizer.encode(thought + '<tool_call>\n{"name": "tick", "arguments": {}}\n</tool_call><|im_end|>',
                            add_special_tokens=False)
    done = tokenizer.encode(thought + "done<|im_end|>", add_special_tokens=False)

    def generate(prompt_ids, *args, **kwargs):
        out = []
        for ids in prompt_ids:
            seen = re.findall(r"tick (\d+) of (\d+)", tokenizer.decode(ids[-200:]))
            out.append(list(done if seen and int(seen[-1][0]) >= calls else call))
        return out, None

    return generate


# ------------------------------------------------------------------ set-up shared with benchmarks/trl_findings.py
def load(template: str = "qwen2.5"):
    """(model, tokenizer): the default SmolLM2-135M-Instruct in fp32; ``template`` "qwen2.5" puts TRL's Qwen2.5 chat
    template in place of the model's own (TRL's tool parsing knows no SmolLM2 template), "own" keeps it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from gigpo_trl.models import default_model_path

    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if template == "qwen2.5":
        tokenizer.chat_template = qwen2_5_chat_template
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tokenizer


def lora():
    """LoRA r16 on every projection."""
    from peft import LoraConfig

    return LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


def dataset(n: int):
    """``n`` Ticker tasks (one prompt each)."""
    import datasets

    prompt = [{"role": "user", "content": "Play the ticker game."}]
    return datasets.Dataset.from_list([{"prompt": prompt, "task": f"ticker {i}", "seed": i} for i in range(n)])


def common_args(max_steps: int) -> dict:
    """The config fields both trainers share: 2 tasks × 2 rollouts per iteration, beta 0, loss ``dapo``, fp32,
    gradient checkpointing."""
    return dict(per_device_train_batch_size=4, num_generations=2, steps_per_generation=1,
                gradient_accumulation_steps=1, max_steps=max_steps, learning_rate=1e-5, beta=0.0, loss_type="dapo",
                bf16=False, gradient_checkpointing=True, report_to="none", save_strategy="no", logging_steps=1,
                use_cpu=True, seed=0, disable_tqdm=True)


def run_arm(cli) -> dict:
    import torch
    from transformers import TrainerCallback

    Ticker.calls = cli.calls
    model, tokenizer = load()
    lora_config = lora()
    dataset_ = dataset(2 * (cli.iterations + 1))
    common = common_args(cli.iterations + 1)
    out = tempfile.mkdtemp()
    if cli.arm == "trl":
        from trl import GRPOConfig, GRPOTrainer

        args = GRPOConfig(output_dir=out, max_completion_length=cli.trl_max_completion,
                          max_tool_calling_iterations=cli.calls + 1, **common)
        trainer = GRPOTrainer(model, reward_funcs=[], args=args, train_dataset=dataset_, processing_class=tokenizer,
                              peft_config=lora_config, environment_factory=Ticker)
    else:
        from gigpo_trl import GiGPOConfig, GiGPOTrainer

        budget = {} if cli.budget is None else {"max_tokens_per_microbatch": cli.budget}
        args = GiGPOConfig(output_dir=out, max_completion_length=cli.completion, max_turns=cli.calls + 1,
                           share_prompt_prefix=cli.arm == "ours", **budget, **common)
        trainer = GiGPOTrainer(model, env=Ticker, args=args, train_dataset=dataset_, processing_class=tokenizer,
                               peft_config=lora_config)
    trainer._generate_single_turn = scripted_player(tokenizer, cli.calls, cli.think)
    counts = {"loss_tokens": 0, "forward_tokens": 0, "scoring_tokens": 0}

    def count(module, args_, kwargs):
        ids = kwargs.get("input_ids", args_[0] if args_ else None)
        if ids is not None:
            counts["forward_tokens" if torch.is_grad_enabled() else "scoring_tokens"] += ids.numel()

    trainer.model.register_forward_pre_hook(count, with_kwargs=True)
    compute = trainer._compute_loss

    def compute_loss(model_, inputs):
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        counts["loss_tokens"] += int(mask.sum())
        return compute(model_, inputs)

    trainer._compute_loss = compute_loss
    marks, per_iteration = [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            marks.append(time.perf_counter())
            counts.update(loss_tokens=0, forward_tokens=0, scoring_tokens=0)

        def on_step_end(self, *a, **k):
            per_iteration.append({"seconds": time.perf_counter() - marks[-1], **counts})

    trainer.add_callback(Clock())
    trainer.train()
    rewards = [e.get("reward", e.get("episode/return_mean")) for e in trainer.state.log_history if "loss" in e]
    timed = per_iteration[1:] or per_iteration
    mean = {k: sum(x[k] for x in timed) / len(timed) for k in timed[0]}
    return {"arm": cli.arm, "calls": cli.calls, **mean, "peak_rss_gb": resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2, "rewards": rewards, "iterations": len(timed)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=2, help="timed iterations (after one warm-up)")
    parser.add_argument("--think", type=int, default=12, help="words in each scripted <think>")
    parser.add_argument("--completion", type=int, default=96, help="our max_completion_length (per turn)")
    parser.add_argument("--trl_max_completion", type=int, default=4096, help="TRL's (covers the whole episode)")
    parser.add_argument("--budget", type=int, default=None,
                        help="ours: max_tokens_per_microbatch (default: GiGPOConfig's, 16,384 padded tokens)")
    parser.add_argument("--arm", choices=["trl", "ours", "ours-unshared"])
    parser.add_argument("--arms", default="trl,ours-unshared,ours")
    parser.add_argument("--record", action="store_true",
                        help="merge the figures into benchmarks/results/bench_vs_trl.json (the recorded figures) "
                             "instead of outputs/bench/results/")
    return parser


def main() -> None:
    cli = build_parser().parse_args()
    if cli.arm:
        print("RESULT " + json.dumps(run_arm(cli)), flush=True)
        return
    print(f"calls {cli.calls}, iterations {cli.iterations} (+1 warm-up), load {os.getloadavg()}")
    print(f"{'arm':>14} {'s/iter':>8} {'peak GB':>8} {'loss tok':>9} {'fwd tok':>9} {'score tok':>9}  rewards")
    figures: dict = {}
    for arm in cli.arms.split(","):
        cmd = [sys.executable, __file__, "--arm", arm, "--calls", str(cli.calls), "--iterations", str(cli.iterations),
               "--think", str(cli.think), "--completion", str(cli.completion),
               "--trl_max_completion", str(cli.trl_max_completion)] + (
                   [] if cli.budget is None else ["--budget", str(cli.budget)])
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
        found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not found:
            print(f"{arm:>14} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
            continue
        r = json.loads(found[-1][len("RESULT "):])
        print(f"{arm:>14} {r['seconds']:>8.1f} {r['peak_rss_gb']:>8.2f} {r['loss_tokens']:>9.0f} "
              f"{r['forward_tokens']:>9.0f} {r['scoring_tokens']:>9.0f}  {r['rewards']}", flush=True)
        label = arm.replace("-", "_") + ("" if cli.budget is None else f"_budget_{cli.budget}")
        figures |= {f"{label}_s": round(r["seconds"], 1), f"{label}_peak_gb": round(r["peak_rss_gb"], 2),
                    f"loss_forward_tokens_{label}": r["forward_tokens"], "loss_tokens": r["loss_tokens"]}
    if "trl_s" in figures and "ours_s" in figures:
        figures["ratio"] = round(figures["ours_s"] / figures["trl_s"], 2)
    if figures:
        write_result("bench_vs_trl", {"calls": {str(cli.calls): figures}}, recorded=cli.record, merge=True)


if __name__ == "__main__":
    main()
