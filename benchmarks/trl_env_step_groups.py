"""Step groups of a TRL-style tool environment trained with GiGPOTrainer.

A TRL ``environment_factory`` class (Tower of Hanoi, tool ``move(src, dst)``, ``get_reward()``) goes to
``GiGPOTrainer(env=...)`` unchanged. The policy's *moves* come from a seeded random player writing native
``<tool_call>{json}</tool_call>`` blocks (a tiny random model writes no tool call, which would end every episode at
turn 0); the rows are trained on with the tiny model as usual. Printed per iteration: rows (= tool calls), invalid
calls, and the size of the step groups per HGPO level (level 0 = GiGPO's anchor-state groups), from the trainer's
logged metrics.

    python benchmarks/trl_env_step_groups.py [--iterations 3] [--disks 3] [--max_turns 6]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--disks", type=int, default=3)
    parser.add_argument("--max_turns", type=int, default=6)
    parser.add_argument("--num_generations", type=int, default=8)
    return parser


if __name__ == "__main__":
    build_parser().parse_args()  # --help and a bad flag answer before the heavy imports

import datasets  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import CORPUS  # noqa: E402  (the test suite's tokenizer corpus)

from gigpo_trl import GiGPOConfig, GiGPOTrainer  # noqa: E402
from tiny_models import build_tiny_model, build_tiny_tokenizer  # noqa: E402
from results_io import is_default_run, write_result  # noqa: E402


class TowerOfHanoi:
    """A TRL environment_factory environment: reset(**row), tool move(src, dst), get_reward()."""

    def reset(self, n_disks: int = 3, **row) -> str:
        self.n, self.pegs, self.done = n_disks, [list(range(n_disks, 0, -1)), [], []], False
        return f"pegs: {self.pegs}"

    def move(self, src: int, dst: int) -> str:
        """Move the top disk of one peg onto another.

        Args:
            src: the peg to take the top disk from (0, 1 or 2)
            dst: the peg to put it on (0, 1 or 2)
        """
        if not self.pegs[src] or (self.pegs[dst] and self.pegs[dst][-1] < self.pegs[src][-1]):
            raise ValueError(f"illegal move {src} -> {dst}")
        self.pegs[dst].append(self.pegs[src].pop())
        self.done = len(self.pegs[2]) == self.n
        return f"pegs: {self.pegs}"

    def get_reward(self) -> float:
        return len(self.pegs[2]) / self.n


def main() -> None:
    args = build_parser().parse_args()

    tokenizer = build_tiny_tokenizer(CORPUS, vocab_size=300)
    folder = tempfile.mkdtemp(prefix="tiny-model-")
    build_tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    prompt = [{"role": "user", "content": "Move all disks to peg 2."}]
    tasks = datasets.Dataset.from_dict({"task": [f"hanoi-{i}" for i in range(8)], "seed": list(range(8)),
                                        "n_disks": [args.disks] * 8, "prompt": [prompt] * 8})
    config = GiGPOConfig(
        output_dir=tempfile.mkdtemp(prefix="hanoi-"), num_generations=args.num_generations,
        per_device_train_batch_size=2 * args.num_generations, max_steps=args.iterations, max_turns=args.max_turns,
        max_completion_length=48, step_grouping="hierarchical", hierarchy_depth=2, history_length=2,
        logging_steps=1, disable_tqdm=True, report_to="none", save_strategy="no", bf16=False,
        gradient_checkpointing=False, use_cpu=True, seed=0,
    )
    trainer = GiGPOTrainer(folder, env=TowerOfHanoi, args=config, train_dataset=tasks, processing_class=tokenizer)
    rng = random.Random(0)
    moves = [(s, d) for s in range(3) for d in range(3) if s != d]

    def random_player(prompt_ids):
        texts = []
        for _ in prompt_ids:
            src, dst = rng.choice(moves)
            texts.append(f'<tool_call>{{"name": "move", "arguments": {{"src": {src}, "dst": {dst}}}}}</tool_call>')
        return [tokenizer.encode(t) for t in texts], None

    trainer.collector.policy.generate_fn = random_player
    trainer.train()
    keys = ["rollout/rows", "episode/invalid_action_rate", "episode/return_mean", "episode/success_rate"]
    figures = {"rows_per_iteration": [], "return": [], "level0_row_group_size_mean": [], "level0_singleton_groups": []}
    for log in trainer.state.log_history:
        if "rollout/rows" not in log:
            continue
        out = {k: log[k] for k in keys if k in log}
        for level in range(3):
            name = f"anchor/level_{level}"
            out[f"level_{level}"] = {k: round(log[f"{name}/{k}"], 3) for k in
                                     ("num_groups", "group_size_mean", "row_group_size_mean", "singleton_fraction")}
        print(json.dumps({"step": log["step"], **out}))
        figures["rows_per_iteration"].append(int(log["rollout/rows"]))
        figures["return"].append(round(log["episode/return_mean"], 3))
        figures["level0_row_group_size_mean"].append(round(log["anchor/level_0/row_group_size_mean"], 1))
        figures["level0_singleton_groups"].append(round(log["anchor/level_0/singleton_fraction"], 2))
    write_result("trl_env_step_groups", figures, recorded=is_default_run(build_parser(), args))


if __name__ == "__main__":
    main()
