"""What we learned about TRL 1.16's multi-turn path, measured: three findings, each demonstrated and printed.

Uses the :class:`Ticker` environment (call ``tick()`` exactly ``--calls`` times; ``get_reward()`` 1 when the count is
right) and the scripted player of ``benchmarks/bench_vs_trl.py`` (fixed completions, so the figures do not depend
on sampling), the default SmolLM2-135M-Instruct (``gigpo_trl.models.default_model_path()``), fp32, LoRA r16,
gradient checkpointing, one iteration of 2 tasks × 2 rollouts, beta 0, loss ``dapo``:

1. ``GRPOTrainer(environment_factory=Ticker)`` refuses SmolLM2-135M-Instruct's own chat template (the exception TRL
   raises is printed, and the template's rendering of a tool-calling conversation, which drops the call);
   ``GiGPOTrainer(env=Ticker)`` trains one iteration with the same tokenizer and template (its first row's prompt is
   printed and checked against ``tokenizer.apply_chat_template``). TRL's next gate, ``add_response_schema`` (a
   response parser for a fixed list of known templates), is called on the same tokenizer too.
2. TRL's ``max_completion_length`` covers the whole multi-turn episode: set just above one tool call's tokens, each
   episode ends after its first call (the call is executed, its result dropped), reward 0; the warnings and log
   records emitted during ``train()`` and the logged ``completions/clipped_ratio`` are printed. A second limit that
   falls inside the second turn's generation is run for contrast.
3. TRL's logged ``num_tokens`` counts prompt + model-generated tokens, not the tool-result tokens inside the
   completion: compared with counts of the same batch's masks.

Findings 2 and 3 use TRL's Qwen2.5 chat template on the SmolLM2 tokenizer (as bench_vs_trl does), the only way TRL
runs tools with this model. Run (a few minutes on 2 CPU cores)::

    nice -n 19 python benchmarks/trl_findings.py
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import tempfile
import time
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_vs_trl import Ticker, common_args, dataset, load, lora, scripted_player  # noqa: E402

# one iteration: 2 tasks × 2 rollouts, as bench_vs_trl.py
COMMON = common_args(max_steps=1)


# ------------------------------------------------------------------------------------------------ shared set-up
def trl_trainer(model, tokenizer, max_completion_length: int, calls: int):
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=tempfile.mkdtemp(), max_completion_length=max_completion_length,
                      max_tool_calling_iterations=calls + 1, **COMMON)
    return GRPOTrainer(model, reward_funcs=[], args=args, train_dataset=dataset(2), processing_class=tokenizer,
                       peft_config=lora(), environment_factory=Ticker)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def captured():
    """Collect every warning (``warnings``, all categories, each occurrence) and every log record at WARNING or
    above (root logger, which TRL's accelerate loggers propagate to, plus transformers' non-propagating root)."""
    handler = _Records()
    loggers = [logging.getLogger(), logging.getLogger("transformers")]
    for lg in loggers:
        lg.addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = {"warnings": caught, "records": handler.records}
        try:
            yield out
        finally:
            for lg in loggers:
                lg.removeHandler(handler)


def print_captured(what: dict) -> None:
    seen = set()  # a record reaching both handlers' loggers is one record
    records = [r for r in what["records"] if not (id(r) in seen or seen.add(id(r)))]
    print(f"  warnings.warn during train(): {len(what['warnings'])}; log records >= WARNING: {len(records)}")
    for w in what["warnings"]:
        print(f"    warning {w.category.__name__}: {str(w.message)[:160]!r}")
    for r in records:
        print(f"    log {r.levelname} {r.name}: {r.getMessage()[:160]!r}")
    about = [m for m in [str(w.message) for w in what["warnings"]] + [r.getMessage() for r in records]
             if re.search(r"trunc|clip|length|exceed|overlong|max_completion", m, re.IGNORECASE)]
    print(f"  of which about length / truncation / clipping: {len(about)}")


def run_trl(trainer, tokenizer, calls: int, think: int) -> dict:
    """One TRL iteration with the scripted player; the batch TRL trains on, each episode's executed tool calls
    (the env's counter) and rewards, the warnings/log records of ``train()`` and TRL's logged metrics."""
    trainer._generate_single_turn = scripted_player(tokenizer, calls, think)
    seen = {}
    score, rewards = trainer._generate_and_score_completions, trainer._calculate_rewards

    def scoring(inputs):
        out = score(inputs)
        seen["batch"] = {k: v.detach().cpu() if hasattr(v, "detach") else v for k, v in out.items()}
        seen["executed"] = [env.k for env in trainer.environments]
        return out

    def rewarding(*a, **k):
        out = rewards(*a, **k)
        seen["rewards"] = out.detach().cpu()[:, 0].tolist()  # the one reward function: Ticker.get_reward
        return out

    trainer._generate_and_score_completions, trainer._calculate_rewards = scoring, rewarding
    with captured() as what:
        trainer.train()
    seen["captured"] = what
    seen["log"] = next(h for h in trainer.state.log_history if "loss" in h)
    return seen


def tool_results_in_sequence(completion_mask, tool_mask) -> list[int]:
    """Per episode, the tool results the trained sequence holds: runs of tool_mask 0 inside the completion."""
    out = []
    for cm, tm in zip(completion_mask.tolist(), tool_mask.tolist()):
        bits = [t for c, t in zip(cm, tm) if c]
        out.append(sum(1 for i, t in enumerate(bits) if t == 0 and (i == 0 or bits[i - 1] == 1)))
    return out


def call_and_result_tokens(tokenizer, think: int) -> tuple[int, int]:
    """(tokens of one scripted tool-call turn, tokens TRL appends for one ``tick`` result): the latter from TRL's
    own ``GRPOTrainer._get_tool_suffix_ids`` on a stand-in holding what it reads (the training template TRL
    selects for this tokenizer)."""
    from types import SimpleNamespace

    from trl import GRPOTrainer
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    call = scripted_player(tokenizer, 1, think)([[]])[0][0]  # no "tick" seen yet: a call
    template = None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)
    stand_in = SimpleNamespace(processing_class=tokenizer, chat_template=template, chat_template_kwargs={},
                               _is_vlm=False, _tokenizer=tokenizer)
    suffix = GRPOTrainer._get_tool_suffix_ids(stand_in, [{"role": "tool", "name": "tick", "content": "tick 1 of 3"}])
    return len(call), len(suffix)


# ------------------------------------------------------------------------------------------------ the findings
def finding_1(calls: int, think: int) -> None:
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    from gigpo_trl import GiGPOConfig, GiGPOTrainer
    from gigpo_trl.observers import RolloutObserver

    print("\n=== Finding 1: SmolLM2-135M-Instruct's own chat template: TRL refuses it, GiGPO trains with it")
    model, tokenizer = load("own")
    print(f"  own template: {tokenizer.chat_template!r}")
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "tick", "arguments": {}}}]},
                {"role": "tool", "name": "tick", "content": "tick 1 of 3"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    print(f"  it renders user -> assistant(tool_calls=[tick]) -> tool as: {rendered!r}")
    print(f"  trl.chat_template_utils.supports_tool_calling(tokenizer) = {supports_tool_calling(tokenizer)}")
    try:
        trl_trainer(model, tokenizer, 4096, calls)
        print("  TRL: GRPOTrainer(environment_factory=Ticker) was built (finding 1 is FALSE on this TRL)")
    except Exception as e:  # noqa: BLE001 - the point is to show whatever TRL raises
        print(f"  TRL GRPOTrainer(environment_factory=Ticker, processing_class=<own template>) raises "
              f"{type(e).__module__}.{type(e).__name__}: {e}")
    try:  # the next gate, had the template rendered tool calls: TRL parses responses of known templates only
        add_response_schema(tokenizer)
        print("  trl.chat_template_utils.add_response_schema(tokenizer): accepted")
    except Exception as e:  # noqa: BLE001
        print(f"  trl.chat_template_utils.add_response_schema(tokenizer) raises {type(e).__name__}: {e}")
    model, tokenizer = load("own")  # fresh weights (TRL's attempt may have wrapped them)
    own = tokenizer.chat_template
    args = GiGPOConfig(output_dir=tempfile.mkdtemp(), max_completion_length=96, max_turns=calls + 1, **COMMON)
    trainer = GiGPOTrainer(model, env=Ticker, args=args, train_dataset=dataset(2), processing_class=tokenizer,
                           peft_config=lora())
    trainer._generate_single_turn = scripted_player(tokenizer, calls, think)
    batches = []

    class Collecting(RolloutObserver):  # every batch the collector returns
        def on_rollout(self, batch, context):
            batches.append(batch)

    trainer.add_rollout_observer(Collecting())
    start = time.perf_counter()
    trainer.train()
    log = next(h for h in trainer.state.log_history if "loss" in h)
    batch = batches[0]
    row = batch.rows[0]
    again = tokenizer.apply_chat_template(row.prompt_messages, add_generation_prompt=True, tokenize=True,
                                          return_dict=False)
    print(f"  GiGPO: GiGPOTrainer(env=Ticker, processing_class=<own template>) trained 1 iteration in "
          f"{time.perf_counter() - start:.0f} s; template unchanged: {tokenizer.chat_template == own}")
    print(f"  rows {len(batch.rows)} from {len(batch.trajectories)} episodes; episode returns "
          f"{[t.episode_return for t in batch.trajectories]}; turns {[t.num_turns for t in batch.trajectories]}; "
          f"logged loss {log['loss']:.4g}, episode/success_rate {log.get('episode/success_rate')}")
    print(f"  row 0 prompt ({len(row.prompt_ids)} tokens) == apply_chat_template(row.prompt_messages, "
          f"add_generation_prompt=True): {list(again) == list(row.prompt_ids)}")
    print("  row 0 prompt as text:\n    " + tokenizer.decode(row.prompt_ids).replace("\n", "\n    "))
    last = max((r for r in batch.rows if r.trajectory_id == row.trajectory_id), key=lambda r: r.turn)
    print(f"  the same episode's last row (turn {last.turn}, reward {last.reward}, completion "
          f"{last.completion_text!r}), prompt tail: {tokenizer.decode(last.prompt_ids[-40:])!r}")


def finding_2(calls: int, think: int) -> None:
    print("\n=== Finding 2: TRL's max_completion_length covers the whole episode; a small one cuts episodes silently")
    _, tokenizer = load("qwen2.5")
    call, result = call_and_result_tokens(tokenizer, think)
    print(f"  one scripted tool-call turn = {call} tokens; TRL's tool-result suffix for 'tick 1 of 3' = {result} "
          f"tokens; the full {calls}-call episode needs {calls * (call + result)} + the final turn")
    # A: at the tool-result boundary (the first call fits, call + result does not); B: inside turn 2's generation
    for label, limit in (("A", call + result - 1), ("B", call + result + call // 2)):
        model, tokenizer = load("qwen2.5")
        trainer = trl_trainer(model, tokenizer, limit, calls)
        seen = run_trl(trainer, tokenizer, calls, think)
        b, log = seen["batch"], seen["log"]
        lengths = b["completion_mask"].sum(dim=1).tolist()
        results = tool_results_in_sequence(b["completion_mask"], b["tool_mask"])
        print(f"  --- {label}: max_completion_length={limit}")
        print(f"  completion tokens per episode {lengths}; tool calls executed per episode (env counter) "
              f"{seen['executed']}; tool results in the trained sequence {results}")
        print(f"  rewards {seen['rewards']}; logged reward {log.get('reward')}, completions/clipped_ratio "
              f"{log.get('completions/clipped_ratio')}, tools/call_frequency {log.get('tools/call_frequency')}, "
              f"completions/mean_length {log.get('completions/mean_length')}")
        ids = b["completion_ids"][0][b["completion_mask"][0].bool()].tolist()
        print(f"  episode 0 as trained: {tokenizer.decode(ids)!r}")
        print_captured(seen["captured"])


def finding_3(calls: int, think: int) -> None:
    print("\n=== Finding 3: TRL's logged num_tokens leaves the tool-result tokens out")
    model, tokenizer = load("qwen2.5")
    trainer = trl_trainer(model, tokenizer, 4096, calls)
    seen = run_trl(trainer, tokenizer, calls, think)
    b, log = seen["batch"], seen["log"]
    prompt = int(b["prompt_mask"].sum())
    completion = int(b["completion_mask"].sum())
    model_tokens = int((b["completion_mask"] * b["tool_mask"]).sum())
    print(f"  episodes: tool calls executed {seen['executed']}, rewards {seen['rewards']}, "
          f"completions/clipped_ratio {log.get('completions/clipped_ratio')}")
    print(f"  this batch: prompt tokens {prompt}, completion tokens {completion} = model-generated {model_tokens} "
          f"+ tool results {completion - model_tokens}")
    print(f"  logged num_tokens {log.get('num_tokens')}; prompt + completion incl. tool results = "
          f"{prompt + completion}; prompt + model-generated only = {prompt + model_tokens}")
    print(f"  logged completions/mean_length {log.get('completions/mean_length')} (mean model-generated "
          f"{model_tokens / b['completion_mask'].size(0)}, mean incl. tool results "
          f"{completion / b['completion_mask'].size(0)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--think", type=int, default=12, help="words in each scripted <think>")
    parser.add_argument("--only", choices=["1", "2", "3"], help="one finding only")
    cli = parser.parse_args()
    import torch
    import transformers
    import trl

    transformers.utils.logging.disable_progress_bar()  # the weight-loading bars

    print(f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
          f"load {os.getloadavg()}")
    for n, fn in (("1", finding_1), ("2", finding_2), ("3", finding_3)):
        if cli.only in (None, n):
            fn(cli.calls, cli.think)


if __name__ == "__main__":
    main()
