r"""GiGPO vs GRPO (vs HGPO, GraphGPO, G2PO) at equal budget, on a testbed where step-level credit matters, on a CPU.

    python benchmarks/learning.py                         # headline: corridor, the 10 HEADLINE_SEEDS, all five arms
    python benchmarks/learning.py --quick                 # <= 3-minute smoke version (1 seed, 3 iterations)
    python benchmarks/learning.py --seeds 200 201 202 203 204 --output_dir outputs/bench/learning/a   # a split run
    python benchmarks/learning.py --report_only --runs outputs/bench/learning/a/runs.jsonl \
        outputs/bench/learning/b/runs.jsonl              # merge split runs into one report
    python benchmarks/learning.py --report_only --condition h12 --runs outputs/bench/map/h12/runs.jsonl \
        --recorded benchmarks/results/map/h12/learning.json   # a new arm's runs paired with a cell's recorded arms
    python benchmarks/learning.py --warmup_only --seeds 1 100   # only the warm-ups, with their figures
    python benchmarks/learning.py --arms GiGPO GRPO       # without the HGPO and GraphGPO arms
    python benchmarks/learning.py --arms GraphGPO --reuse_warmup   # add an arm to a run (same output_dir)
    python benchmarks/learning.py --testbed frozenlake4   # the former FrozenLake 4x4 run (smoke option)
    python benchmarks/learning.py --condition clock --iterations 20   # one cell of the map (CONDITIONS, MAP_SEEDS)
    python benchmarks/learning.py --map_report            # the map's table and figure from its cells' results
    python benchmarks/learning.py --condition h12 --seeds 600 601 602 603 --arms GiGPO GRPO --max_staleness 4 \
        --output_dir outputs/bench/async_learning/staleness4   # generation through the server stand-in, one rollout ahead
    python benchmarks/learning.py --staleness_report S0/runs.jsonl S4/runs.jsonl   # staleness K against 0, paired
    python benchmarks/learning.py --model default --condition h12 --seeds 700 --arms GRPO --history_mode conversation \
        --output_dir /work/runs/llm_pilot/x   # SmolLM2-135M-Instruct (or a folder / Hub id) instead of the tiny policy

``--model``: a pretrained model with its own tokenizer and chat template, LoRA as the main job sets it up, the
package's expert warm-up (``gigpo_trl.warmup.expert_warmup``, ``--warmup_episodes``) once per seed into that adapter,
every arm from the saved adapter; the tiny policy's flags (``--hidden``, ``--layers``, ``--vocab``, the legal-move
warm-up's) are refused. Its results never go beside the tiny policy's: ``benchmarks/results/llm_learning/`` once
the pre-registration (``LLM_PREREGISTERED``) names the measured run, ``--output_dir`` otherwise
(benchmarks/experiments/llm_pilot.md).

Resuming: each (seed, arm) run writes ``evals.jsonl`` and ``progress.jsonl`` (per iteration: seconds, peak memory,
load) in ``OUTPUT_DIR/seedS/ARM`` as it goes; a rerun of the same command skips the runs already in ``runs.jsonl``
(refusing a file made with other settings), and a ``--model`` run resumes from its last checkpoint (one per
iteration, the last kept) with its warm-up adapter reused.

Testbed ``corridor`` (default): ``gigpo_trl.envs.corridor.CorridorEnv`` with 12 rooms, each with a passage and
a dead end (left/right in random order), ``max_turns`` 30; the shortest episode is 12 turns, reward 1 only for
leaving the last room (plus the trainer's invalid-action penalty). The policy acts through ``DoorCorridor``: it
names the door it walks through (``arch``, ``stairs``: passages; ``closet``, ``niche``: dead ends; ``back`` out of
a dead end) and the benchmark translates that to the env's move, so observations, dynamics, rewards and anchors
are the env's (``--actions moves`` names directions instead). Training uses the env's train ids, evaluation its
disjoint eval ids. The prompt is a compact version of the env's.

Per seed:

1. a tiny Qwen2 policy (random init, compact BPE tokenizer trained offline on the testbed's prompts) gets a
   supervised *legal-move* warm-up (``legal_move_warmup``): real prompts (``gigpo_trl.rollout.prompts.build_messages`` +
   the chat template) of states reached by random walks, each with every legal move as a target
   (``<think>go</think><action>{move}</action>``; corridor: both doors of a room, ``back`` in a dead end), i.e.
   cross-entropy against the uniform distribution over the legal moves. Phase 1 runs until >= 95 % of sampled moves
   are legal; phase 2 (learning rate decaying to 0) until the final sampled check also has the passage chosen in
   0.5 +- 0.05 of two-door rooms (the policy knows the rules, not the way). A seed that misses either within
   ``--warmup_max_steps`` stops the run with an error naming it. The weights are saved once; every arm starts from
   them.
2. every arm (``ARMS``; default all five) trains from those weights with identical settings, seed, task
   order and number of iterations; only the arm's config fields differ (GiGPO: omega = 1; GRPO: omega = 0; HGPO:
   the authors' recipe, ``step_grouping="hierarchical"`` with K = 2 and alpha = 1; GraphGPO: the authors' recipe,
   ``step_return="graph"`` with the gamma of its ALFWorld script, 0.10; G2PO: ``step_return="g2po"`` with the
   corridor's success reward 1.0 as ``g2po_success_reward``).
3. held-out evaluation (the env's eval split, sampled at T = 1) at iteration 0 and at ``eval_schedule``'s
   iterations (every ``--eval_every_early`` iterations, then the last three ``--eval_every`` apart); greedy too at
   iteration 0 and the last three (``--greedy_evals schedule``, the default), at iteration 0 only (``start``) or
   never (``none``). ``--greedy_evals`` is a run setting: runs made with different values are not merged, and a
   greedy metric the runs lack is reported absent ("-", no gap), never as 0.

``--share_start_eval``: every arm of a seed starts from the same warm-up weights with the same random state, so
their iteration-0 evaluations are identical (the report's same-start check compares them). With the flag the first
arm of a seed to start makes it and keeps it in the seed's warm-up folder (``start_eval_<digest>.json`` beside the
weights, with the random state after it), and every later arm of the seed reuses it, the random state restored, so
that it trains exactly as if it had evaluated itself (``learning/evaluation.py``; checked on the tiny model for
GRPO, PPO and RLOO by tests/test_learning_evals.py). The digest covers what the evaluation depends on: the warm-up
settings and weights, the seed, the evaluation's settings (``START_EVAL_KEYS``: eval tasks, eval batch, sampled
temperature, greedy at iteration 0, ...) and the CPU model; a kept evaluation made otherwise is not reused. A run's
``start_eval`` says whether its iteration-0 point is its own or kept. Refused with the clock nuisance (the
evaluation advances the run's clock) and ``--max_staleness``.

Primary metric (``PRIMARY_METRIC``, fixed before the headline run): per seed and arm, the mean held-out success
over the last 3 evaluations, sampled at T = 1; the paired per-seed gap between arms, its mean and a 95% t interval
over seeds. Second metric: the area under the sampled held-out success curve (``auc``), with its paired interval.
Also greedy success; iterations until the 5-iteration running mean of training success reaches 0.5; the env steps
and generated tokens per arm; the anchor-group statistics early / middle / late; each seed's warm-up figures.
Writes ``learning.json`` and ``learning_curve.png`` to ``--results_dir`` (default: ``benchmarks/results`` only for
a complete report of the 10 headline seeds at the default budget, ``--output_dir`` otherwise) and the weights and
``runs.jsonl`` (one line per finished (seed, arm) run) to ``--output_dir``. ``--workers 2`` (default) runs the
warm-ups, then the (seed, arm) runs, in two single-threaded processes.

Modules: ``settings`` (arms, seeds, testbed settings, the map's conditions, the command line), ``testbeds``,
``warmup``, ``llm`` (``--model``), ``runner`` (the runs, the worker pool, merging split runs), ``evaluation`` (a
run's held-out evaluations, ``--greedy_evals``, ``--share_start_eval``), ``progress`` (a run's files as it goes,
resuming), ``runs`` (reading finished runs),
``statistics``, ``report``, ``map``, ``staleness``, ``server_standin``.
"""


import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the repository root (gigpo_trl), benchmarks/ (results_io) and tests/ (tiny_models), when run from a checkout
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for _path in (_ROOT, os.path.join(_ROOT, "benchmarks"), os.path.join(_ROOT, "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)
