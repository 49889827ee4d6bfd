"""Design runs of the main job's sizes (README's WebShop job with the expert warm-up) on TRAINING goals only.

    python benchmarks/warmup_design.py --design_eval_goals 60 [any flag of examples/train_webshop.py]

Runs ``gigpo_trl.job.main("webshop", ...)`` unchanged, except that the WebShop env's splits are re-cut from the
training goals: its last ``--design_eval_goals`` training goals become the evaluation split and the others stay the
training split, so choosing the sizes never looks at the held-out eval goals (the rule and the runs:
benchmarks/experiments/warmup.md). Prints the job's own lines (phase table, ``[gigpo] done in N s``).
"""

from __future__ import annotations

import argparse
import sys


def recut_splits(held: int) -> None:
    """Make ``WebShopEnv.tasks`` serve the last ``held`` training goals as the eval split and the other training goals
    as the training split (for the rest of the process)."""
    from gigpo_trl.envs import webshop

    tasks = webshop.WebShopEnv.tasks

    def design_tasks(self, split: str = "train"):
        goals = tasks(self, "train")
        n = len(goals)
        return goals.select(range(n - held, n)) if split in ("eval", "test") else goals.select(range(n - held))

    webshop.WebShopEnv.tasks = design_tasks


def main(argv: list[str]) -> None:
    # this script's own flag; every other flag goes to the main job's parser (examples/train_webshop.py --help)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--design_eval_goals", type=int, default=60,
                        help="the last this many training goals become the evaluation split")
    opts, argv = parser.parse_known_args(argv)
    held = opts.design_eval_goals

    from gigpo_trl.job import main as job_main

    recut_splits(held)
    print(f"[design] evaluation split = the last {held} training goals; training split = the other training goals",
          flush=True)
    job_main("webshop", argv)


if __name__ == "__main__":
    main(sys.argv[1:])
