"""Memory of one GiGPO optimizer step against episode length, with and without `max_tokens_per_microbatch`.

    python benchmarks/bench_memory.py                      # 5/10/20/40 turns x budget off/on
    python benchmarks/bench_memory.py --turns 5 40 --budget 4096
    python benchmarks/bench_memory.py --default-model      # SmolLM2-135M, ~1,000-token rows, checkpointing on/off

Setup: a small random Qwen2 (hidden 64, 2 layers, the tests' offline tokenizer), CPU, one thread; one task group
pair = 8 trajectories per optimizer step (2 tasks x 4 rollouts), FixedLengthEnv episodes of exactly T turns (one
row per turn: 8·T rows), history 2. Generation is replaced by a fixed policy (three completions of 12-25 tokens,
chosen by position), so every setting trains on the same kind of rows and only the training forward/backward is
measured. `steps_per_generation=1`, `gradient_accumulation_steps=1`, `beta=0`: all 8·T rows are ONE TRL
micro-batch, as `per_device_train_batch_size` counts trajectories, not rows.

Each setting runs twice, each time in a fresh subprocess. Printed per setting:
- peak MiB: the process's peak RSS (`ru_maxrss`) during `trainer.train()` (2 optimizer steps) minus its RSS just
  before it, with glibc told to serve every allocation >= 64 KiB by mmap (`MALLOC_MMAP_THRESHOLD_=65536`), so a
  freed tensor goes back to the OS and RSS follows the live tensors; "malloc MiB" is the same figure with the default
  allocator, whose heap keeps freed blocks, so that its high-water mark creeps up with the number of forwards;
- max fwd tokens: the largest `input_ids.numel()` (rows x padded width) of any training forward (hooked);
- fwds: training forwards per step;
- s/step: wall seconds of an optimizer step in the second run (default allocator, 3 steps: the faster of steps 2
  and 3; step 1 pays one-time set-up); tok/s: trained tokens (real prompt + completion tokens of the step's rows)
  per second of that step.
Then the ratios the issue asks for: peak(40 turns)/peak(5 turns) with the budget (target <= 1.15) and the seconds
per trained token with the budget over without it at each length (target <= 1.10).

`--default-model`: the default model (SmolLM2-135M-Instruct, fp32, LoRA r=16 on q_proj/v_proj as in the example
job) on WebShop-length rows: every prompt is a fixed product-listing page (no history) sized so that prompt + the one
29-token completion = `--row-tokens` (1,000) padded tokens, and a budget of B tokens packs B // 1,000 rows into each
forward/backward. One optimizer step on that many rows (at least 2; `--rows` sets it), one TRL micro-batch, per
setting, each setting in a fresh subprocess with the default allocator (what `/usr/bin/time -v` reports): gradient
checkpointing on (`use_reentrant=False`) at the budgets `--gc-budgets`, off at `--no-gc-budgets`. Printed per
setting: peak RSS of the process (`ru_maxrss`, MiB), its growth during `trainer.train()` over the RSS before it,
rows per forward, seconds of the step; then the growth per padded token between the smallest and largest budget of
each mode (the slope that docs/memory.md's table extrapolates). Without checkpointing keep the budgets small:
~2.4 MiB per token (2 x 1,000 tokens ~6 GiB).
"""

from __future__ import annotations

import argparse
import json
import os
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
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

TEXTS = [
    "<think>wait</think><action>wait</action>",
    "<think>I should wait here for one more turn.</think><action>wait</action>",
    "<think>Going right now, then I will wait until the end.</think><action>wait</action>",
]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(turns: int, budget: int | None, steps: int) -> dict:
    import datasets
    import torch
    from conftest import CORPUS
    from toy_env import FixedLengthEnv
    from transformers import TrainerCallback

    from gigpo_trl import GiGPOConfig, GiGPOTrainer
    from gigpo_trl.observers import RolloutObserver
    from tiny_models import build_tiny_model, build_tiny_tokenizer

    class TextRewardEnv(FixedLengthEnv):  # exactly `task` turns; rewards vary with the completion: advantages != 0
        invalid_action = None

        def step(self, action):
            obs, reward, done, info = super().step(action)
            return obs, reward + (len(action) % 3) / 2, done, info

    tokenizer = build_tiny_tokenizer(CORPUS, vocab_size=300)
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2)
    tasks = datasets.Dataset.from_dict({"task": [turns] * 4, "seed": [0, 1, 2, 3]})
    with tempfile.TemporaryDirectory() as out:
        args = GiGPOConfig(
            output_dir=out, num_generations=4, per_device_train_batch_size=8, steps_per_generation=1,
            gradient_accumulation_steps=1, max_steps=steps, max_turns=turns, history_length=2, max_completion_length=32,
            beta=0.0, bf16=False, gradient_checkpointing=False, use_cpu=True, learning_rate=1e-3, report_to="none",
            save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0, max_tokens_per_microbatch=budget,
        )
        trainer = GiGPOTrainer(model, env=TextRewardEnv, args=args, train_dataset=tasks, processing_class=tokenizer)
        encoded = [tokenizer.encode(t) for t in TEXTS]
        trainer.collector.policy.generate_fn = lambda ids: ([encoded[i % 3] for i in range(len(ids))], None)
        tokens, rows, sizes, marks = [], [], [], []

        class Counting(RolloutObserver):  # every batch the collector returns: its tokens and rows
            def on_rollout(self, batch, context):
                tokens.append(sum(len(r.prompt_ids) + len(r.completion_ids) for r in batch.rows))
                rows.append(len(batch.rows))

        trainer.add_rollout_observer(Counting())
        trainer.model.register_forward_pre_hook(
            lambda m, a, kw: sizes.append(kw["input_ids"].numel()) if torch.is_grad_enabled() else None,
            with_kwargs=True)

        class Clock(TrainerCallback):
            def on_step_begin(self, *a, **k):
                marks.append(("begin", time.perf_counter(), len(sizes)))

            def on_step_end(self, *a, **k):
                marks.append(("end", time.perf_counter(), len(sizes)))

        trainer.add_callback(Clock())
        before = _rss_bytes()
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        trainer.train()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    begins, ends = marks[0::2], marks[1::2]
    timed = min(range(1, len(ends)), key=lambda i: ends[i][1] - begins[i][1])  # the fastest step after the first
    (_, t0, n0), (_, t1, n1) = begins[timed], ends[timed]
    if peak <= peak_before:  # the high-water mark predates train(): the delta would understate the step
        raise RuntimeError("peak RSS was reached before train(); the measurement is not valid")
    return {
        "turns": turns, "budget": budget, "rows": rows[-1], "peak_mib": (peak - before) / 2**20,
        "max_fwd_tokens": max(sizes), "fwds": n1 - n0, "seconds": t1 - t0, "tokens": tokens[-1],
        "tok_s": tokens[-1] / (t1 - t0),
    }


ROW_TOKENS = 1000
COMPLETION = "<think>The first result matches the goal and the price.</think><action>click[b0001]</action>"


def child_default_model(budget: int, checkpointing: bool, rows: int, row_tokens: int) -> dict:
    """One optimizer step of the default model on `rows` rows of `row_tokens` padded tokens each (see --default-model)."""
    import datasets
    import torch
    from peft import LoraConfig
    from toy_env import FixedLengthEnv
    from transformers import AutoTokenizer

    from gigpo_trl import GiGPOConfig, GiGPOTrainer
    from gigpo_trl.models import default_model_path

    class PageEnv(FixedLengthEnv):  # every observation is the same long page: all prompts have one length
        invalid_action = None
        page = ""

        def reset(self, task, seed=None):
            super().reset(task, seed)
            return self.page, {"instruction": "buy a comfortable item under $50", "admissible_actions": None}

        def step(self, action):
            _, reward, done, info = super().step(action)
            return self.page, reward + len(action) % 2, done, info

    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    completion = tokenizer.encode(COMPLETION, add_special_tokens=False)
    turns = rows // 2  # one task group of 2 trajectories, `turns` rows each
    tasks = datasets.Dataset.from_dict({"task": [turns] * 2, "seed": [0, 1]})
    with tempfile.TemporaryDirectory() as out:
        args = GiGPOConfig(
            output_dir=out, num_generations=2, per_device_train_batch_size=2, steps_per_generation=1,
            gradient_accumulation_steps=1, max_steps=1, max_turns=turns, history_length=0,
            max_completion_length=len(completion), beta=0.0, bf16=False, use_cpu=True, learning_rate=1e-4,
            gradient_checkpointing=checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False} if checkpointing else None,
            report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
            max_tokens_per_microbatch=budget, model_init_kwargs={"dtype": torch.float32},
        )
        lora = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        trainer = GiGPOTrainer(path, env=PageEnv, args=args, train_dataset=tasks, processing_class=tokenizer,
                               peft_config=lora)
        # Size the page so that prompt + completion = row_tokens (one product line is ~20 tokens; then pad words).
        line = "[B{:04d}] Soft cotton crew-neck t-shirt, size {}, colour {}, $1{}.99\n"
        lines = [line.format(i, "SML"[i % 3], ("red", "blue", "grey")[i % 3], i % 10) for i in range(200)]
        target = row_tokens - len(completion)

        def prompt_length(n: int, extra: int) -> int:
            PageEnv.page = "Results:\n" + "".join(lines[:n]) + " page" * extra
            return len(trainer.collector.check_task({"task": turns, "seed": 0}))

        n = next(n for n in range(len(lines) + 1) if n == len(lines) or prompt_length(n + 1, 0) > target)
        extra = next(e for e in range(200) if prompt_length(n, e + 1) > target)
        length = prompt_length(n, extra)
        prompt_tokens = length
        trainer.collector.policy.generate_fn = lambda ids: ([completion for _ in ids], None)
        sizes = []
        trainer.model.register_forward_pre_hook(
            lambda m, a, kw: sizes.append(tuple(kw["input_ids"].shape)) if torch.is_grad_enabled() else None,
            with_kwargs=True)
        before = _rss_bytes()
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "budget": budget, "checkpointing": checkpointing, "rows": rows, "prompt_tokens": prompt_tokens,
        "completion_tokens": len(completion), "forwards": sizes, "peak_mib": peak / 2**20,
        "rss_before_mib": before / 2**20, "growth_mib": (peak - before) / 2**20 if peak > peak_before else None,
        "seconds": seconds,
    }


def run_default_model(cli) -> None:
    print(f"default model, rows of {cli.row_tokens} padded tokens, one optimizer step per setting", flush=True)
    print(f"{'checkpointing':>13} {'budget':>7} {'rows':>5} {'rows/fwd':>8} {'fwds':>5} {'peak RSS MiB':>13} "
          f"{'growth MiB':>11} {'s/step':>7}", flush=True)
    results, settings = {}, {}
    for checkpointing, budgets in ((True, cli.gc_budgets), (False, cli.no_gc_budgets)):
        for budget in budgets:
            rows = cli.rows or max(2, 2 * (budget // cli.row_tokens // 2))  # enough rows to fill one forward
            cmd = [sys.executable, __file__, "--child-default", str(budget), str(int(checkpointing)), str(rows),
                   str(cli.row_tokens)]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode or line is None:
                sys.exit(f"setting checkpointing={checkpointing} budget={budget} failed:\n{proc.stderr[-3000:]}")
            r = json.loads(line[len("RESULT "):])
            results[checkpointing, budget] = r
            key = f"checkpointing_{'on' if checkpointing else 'off'}_budget_{budget}_rows_of_{cli.row_tokens}"
            settings[key] = {"checkpointing": checkpointing, "budget": budget, "row_tokens": cli.row_tokens,
                             "peak_mib": round(r["peak_mib"]), "growth_mib": r["growth_mib"] and round(r["growth_mib"])}
            widths = {tuple(f) for f in r["forwards"]}
            growth = f"{r['growth_mib']:.0f}" if r["growth_mib"] is not None else "n/a"
            print(f"{'on' if checkpointing else 'off':>13} {budget:>7} {r['rows']:>5} {max(f[0] for f in widths):>8} "
                  f"{len(r['forwards']):>5} {r['peak_mib']:>13.0f} {growth:>11} {r['seconds']:>7.1f}"
                  f"   (forward shapes {sorted(widths)}; prompt {r['prompt_tokens']} + completion "
                  f"{r['completion_tokens']} tokens)", flush=True)
    for checkpointing in (True, False):
        got = sorted((b, r) for (c, b), r in results.items() if c == checkpointing)
        if len(got) >= 2:
            (b0, r0), (b1, r1) = got[0], got[-1]
            tokens0 = max(f[0] * f[1] for f in r0["forwards"])
            tokens1 = max(f[0] * f[1] for f in r1["forwards"])
            if tokens1 > tokens0:
                slope = (r1["peak_mib"] - r0["peak_mib"]) * 2**20 / (tokens1 - tokens0)
                print(f"checkpointing {'on' if checkpointing else 'off'}: peak RSS grows {slope / 1024:.0f} KiB per "
                      f"padded token of the largest forward ({tokens0:,} -> {tokens1:,} tokens)", flush=True)
    write_result("bench_memory", {"model": "SmolLM2-135M-Instruct, fp32, LoRA r=16 on q/v", "settings": settings},
                 recorded=cli.record, merge=True)


def _run(turns: int, budget: int | None, steps: int, env: dict) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", str(turns), str(budget or "none"), str(steps)],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env})
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        sys.exit(f"setting turns={turns} budget={budget} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[5, 10, 20, 40])
    parser.add_argument("--budget", type=int, default=8192, help="max_tokens_per_microbatch of the 'on' runs")
    parser.add_argument("--child", nargs=3, metavar=("TURNS", "BUDGET", "STEPS"), help=argparse.SUPPRESS)
    parser.add_argument("--default-model", action="store_true",
                        help="the default model on ~1,000-token rows, gradient checkpointing on and off")
    parser.add_argument("--gc-budgets", type=int, nargs="*", default=[1024, 2048],
                        help="budgets run with gradient checkpointing (--default-model)")
    parser.add_argument("--no-gc-budgets", type=int, nargs="*", default=[1024],
                        help="budgets run without gradient checkpointing (--default-model; ~2.4 MiB per token: "
                             "2,048 needs ~6 GiB)")
    parser.add_argument("--rows", type=int, default=None,
                        help="rows in the optimizer step (--default-model; even). Default: budget // row tokens, >= 2")
    parser.add_argument("--row-tokens", type=int, default=ROW_TOKENS, help="padded tokens per row (--default-model)")
    parser.add_argument("--child-default", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--record", action="store_true", help="merge the figures into "
                        "benchmarks/results/bench_memory.json (the recorded figures) instead of outputs/bench/results/")
    cli = parser.parse_args()
    if cli.child_default:
        budget, checkpointing, rows, row_tokens = (int(x) for x in cli.child_default)
        print("RESULT " + json.dumps(child_default_model(budget, bool(checkpointing), rows, row_tokens)), flush=True)
        return
    if cli.default_model:
        run_default_model(cli)
        return
    if cli.child:
        turns, budget = int(cli.child[0]), None if cli.child[1] == "none" else int(cli.child[1])
        print("RESULT " + json.dumps(child(turns, budget, int(cli.child[2]))), flush=True)
        return
    results = {}
    print(f"{'turns':>5} {'budget':>7} {'rows':>5} {'peak MiB':>9} {'malloc MiB':>11} {'max fwd tokens':>15} "
          f"{'fwds':>5} {'s/step':>7} {'tok/s':>8}", flush=True)
    for turns in cli.turns:
        for budget in (None, cli.budget):
            r = _run(turns, budget, 2, {"MALLOC_MMAP_THRESHOLD_": "65536"})
            timing = _run(turns, budget, 3, {})
            r.update(malloc_mib=timing["peak_mib"], seconds=timing["seconds"], tok_s=timing["tok_s"])
            results[turns, budget] = r
            print(f"{turns:>5} {str(budget or 'off'):>7} {r['rows']:>5} {r['peak_mib']:>9.1f} {r['malloc_mib']:>11.1f} "
                  f"{r['max_fwd_tokens']:>15,} {r['fwds']:>5} {r['seconds']:>7.2f} {r['tok_s']:>8.0f}", flush=True)
    lo, hi = min(cli.turns), max(cli.turns)
    on_lo, on_hi = results[lo, cli.budget]["peak_mib"], results[hi, cli.budget]["peak_mib"]
    off_lo, off_hi = results[lo, None]["peak_mib"], results[hi, None]["peak_mib"]
    print(f"peak memory {hi} vs {lo} turns: budget on {on_hi / on_lo:.2f}x (target <= 1.15), "
          f"budget off {off_hi / off_lo:.2f}x")
    slow = [results[t, None]["tok_s"] / results[t, cli.budget]["tok_s"] for t in cli.turns]
    print("seconds per trained token, budget on / off: " + ", ".join(f"{t} turns {s:.2f}" for t, s in
                                                                     zip(cli.turns, slow)) + " (target <= 1.10)")
    from results_io import provenance

    write_result("bench_memory", {"turns": {
        "budget": cli.budget, f"peak_ratio_{hi}_vs_{lo}_turns": {"budget_on": round(on_hi / on_lo, 2),
                                                               "budget_off": round(off_hi / off_lo, 2)},
        "peak_ratio_target_max": 1.15, "provenance": provenance()}}, recorded=cli.record, merge=True)


if __name__ == "__main__":
    main()
