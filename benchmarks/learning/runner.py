"""The learning benchmark's runs: one (seed, arm) run from the seed's warm-up weights with periodic held-out
evaluations, the worker pool over seeds and arms, ``runs.jsonl`` and the merge of split runs (``--report_only``)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import time
from pathlib import Path

import numpy as np
import torch

from gigpo_trl import GiGPOConfig, GiGPOTrainer
from gigpo_trl.models import hub_model_id
from gigpo_trl.observers import RolloutObserver
from results_io import cpu_model

from . import progress
from .evaluation import KeptStartEval, PeriodicEval, greedy_iterations
from .map import map_report
from .report import write_report
from .server_standin import serving
from .runs import load_runs
from .settings import ARMS, RESULTS, RUN_KEYS, default_results_dir, parse_args, run_settings_filled
from .staleness import staleness_report
from .statistics import auc, eval_schedule, iters_to, row_size_hist
from .testbeds import (_ids, completion_text, env_factory_for, instruction_for, make_tokenizer, random_prompt_messages,
                       with_fresh_clock)
from .llm import load_policy, load_tokenizer, model_path
from .llm import warm_up_seed as warm_up_llm
from .warmup import warm_up_seed, warmup_line


class StepGroupSizes(RolloutObserver):
    """Rollout observer that keeps, per training rollout, the size of the step group of every row (the histogram
    the trainer does not log), and for HGPO the sizes of the deepest level's groups G_K."""

    def __init__(self):
        self.iterations: list[np.ndarray] = []
        self.deepest: list[np.ndarray] = []

    def on_advantages(self, batch, result, context):
        if context.mode != "train" or result is None:
            return
        self.iterations.append(np.asarray(result.anchor_group_sizes, dtype=np.int64).copy())
        levels = getattr(result, "level_group_sizes", None)
        if levels is not None and np.ndim(levels) == 2:
            self.deepest.append(np.asarray(levels, dtype=np.int64)[:, -1].copy())


def make_config(a, out_dir: str, arm_fields: dict, seed: int) -> GiGPOConfig:
    """The run's shared settings; the arm's fields override them (GraphGPO: its own gamma)."""
    shared = dict(
        output_dir=out_dir, seed=seed, data_seed=seed,
        num_generations=a.num_generations, per_device_train_batch_size=a.groups * a.num_generations // a.spg,
        steps_per_generation=a.spg, max_steps=a.iterations * a.spg, max_turns=a.max_turns,
        history_length=a.history_length, learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, temperature=1.0, top_k=0, top_p=1.0,
        max_completion_length=a.max_completion_length, gamma=a.gamma, advantage_mode=a.advantage_mode,
        bf16=False, gradient_checkpointing=False, use_cpu=True, report_to="none", save_strategy="no",
        disable_tqdm=True, logging_steps=1, eval_max_tasks=a.eval_tasks, eval_temperature=0.0,
        per_device_eval_batch_size=a.eval_batch or a.eval_tasks, require_think=a.think,
        # the recorded protocols (headline, map) ran with TRL's row split; a new protocol may choose
        micro_batch_split=a.micro_batch_split,
    )
    if a.max_staleness is not None:  # generation through the server stand-in (learning/server_standin.py)
        shared |= dict(use_vllm=True, vllm_mode="server", vllm_server_base_url="http://in-process",
                       max_staleness=a.max_staleness)
    if a.model:  # the job's CPU memory settings; a checkpoint after every iteration (the last one kept) to resume from
        from gigpo_trl.job.arguments import CPU_DEFAULTS

        shared |= {k: CPU_DEFAULTS[k] for k in ("gradient_checkpointing", "gradient_checkpointing_kwargs",
                                                 "max_tokens_per_microbatch")}
        shared |= dict(save_strategy="steps", save_steps=a.spg, save_total_limit=1)
        if a.critic_model is not None and arm_fields.get("estimator") == "ppo":
            from gigpo_trl.models import resolve_model_path

            shared["critic_model_name_or_path"] = resolve_model_path(
                a.model if a.critic_model == "policy" else a.critic_model)
    if a.history_mode is not None:
        shared["history_mode"] = a.history_mode
    # GraphGPO matches states exactly (its graph's nodes); RLOO and PPO group no states (baselines_arm.md)
    if (a.anchor_similarity_threshold is not None and arm_fields.get("step_return") != "graph"
            and arm_fields.get("estimator") not in ("rloo", "ppo")):
        shared["anchor_similarity_threshold"] = a.anchor_similarity_threshold
    return GiGPOConfig(**{**shared, **arm_fields})


LOG_KEYS = ["episode/success_rate", "episode/length_mean", "episode/invalid_action_rate", "rollout/rows",
            "completions/mean_length", "anchor/singleton_fraction", "anchor/row_group_size_mean",
            "anchor/group_size_mean", "rollout/seconds", "graph/states_reaching_success", "graph/rows_reaching_success",
            # --max_staleness runs (server stand-in): the rollouts' age and the importance weights that correct it
            "async/staleness_mean", "async/staleness_max", "async/groups_dropped",
            "sampling/importance_sampling_ratio/mean", "sampling/importance_sampling_ratio/max",
            "sampling/importance_sampling_ratio/truncated_fraction", "sampling/sampling_logp_difference/max",
            # the baselines (benchmarks/experiments/baselines_arm.md): the advantages' cost, PPO's critic
            "rollout/advantage_seconds", "critic/loss", "critic/explained_variance", "critic/value_error"]


def iteration_series(log_history) -> dict:
    """Per training iteration (one rollout), the logged metrics in ``LOG_KEYS`` (nan where TRL logged None)."""
    # TRL logs None for a metric with no defined value in an iteration (PPO's explained variance when the returns do
    # not vary): nan keeps the series one value per iteration
    return {k: [float("nan") if e[k] is None else float(e[k]) for e in log_history if k in e] for k in LOG_KEYS}


def run_arm(a, arm, seed, init_dir, tok, env_factory, train_ds, eval_ds):
    """One (seed, arm) run from the seed's warm-up weights: held-out evaluations at ``eval_schedule``'s iterations,
    the training series, the step-group statistics early / middle / late. With ``--model`` it resumes from its
    folder's last checkpoint (learning/progress.py). Returns the run's result dict."""
    from transformers import AutoModelForCausalLM, PrinterCallback

    env_factory = with_fresh_clock(env_factory)  # every (seed, arm) run sees the clock cells' lines from 1
    run_dir = Path(a.output_dir) / f"seed{seed}" / arm
    settings = {k: getattr(a, k) for k in RUN_KEYS}
    checkpoint, kept_evals, kept_progress = progress.start(run_dir, settings | {"seed": seed, "arm": arm}, a.spg,
                                                           resume=bool(a.model))
    model = load_policy(a, init_dir) if a.model else AutoModelForCausalLM.from_pretrained(init_dir)
    schedule = eval_schedule(a.iterations, a.eval_every, a.eval_every_early)
    groups = StepGroupSizes()
    for line in kept_progress:
        groups.iterations += [np.asarray(x, dtype=np.int64) for x in line["group_sizes"]]
        groups.deepest += [np.asarray(x, dtype=np.int64) for x in line["deepest"]]
    greedy_at = greedy_iterations(a.greedy_evals, schedule)
    cb = PeriodicEval(schedule, greedy_at, a.spg, a.sampled_eval_temperature, run_dir, groups, kept_evals,
                      kept_progress)
    args = make_config(a, str(run_dir), ARMS[arm], seed)
    with serving(model) if a.max_staleness is not None else contextlib.nullcontext():
        trainer = GiGPOTrainer(model, env=env_factory, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                               processing_class=tok, callbacks=[cb.callback])
    trainer.add_rollout_observer(groups)
    cb.trainer = trainer
    cb.label = f"seed {seed} {arm}"
    trainer.remove_callback(PrinterCallback)  # the per-step log dicts; everything is kept in log_history
    if checkpoint:
        print(f"  seed {seed} {arm}: resuming from {checkpoint} (iteration {len(kept_progress)})", flush=True)
    cb.t_start, cb.c_start = time.perf_counter(), time.process_time()
    kept = KeptStartEval(a, seed, init_dir, greedy=0 in greedy_at) if a.share_start_eval else None
    start = kept_evals[0] if kept_evals else cb.start(kept)
    # a run cut after its last checkpoint resumes there with nothing left: train() runs no step (no rollout; see
    # gigpo_trl.checkpoint) and the series is the checkpoint's log history
    trainer.train(resume_from_checkpoint=checkpoint)
    log_history = trainer.state.log_history
    wall, cpu = cb.totals()
    series = iteration_series(log_history)
    trainer.collector.close()
    sizes, deepest = groups.iterations, groups.deepest
    points = [start] + cb.points
    last3 = points[-3:]
    rows = np.asarray(series["rollout/rows"])
    tokens = rows * np.asarray(series["completions/mean_length"][: len(rows)])
    thirds = np.array_split(np.arange(len(sizes)), 3)
    anchor_phases = {}
    for name, idx in zip(("early", "middle", "late"), thirds):
        if len(idx):
            pooled = np.concatenate([sizes[i] for i in idx])
            sf = [series["anchor/singleton_fraction"][i] for i in idx if i < len(series["anchor/singleton_fraction"])]
            anchor_phases[name] = {"iterations": [int(idx[0]) + 1, int(idx[-1]) + 1],
                                   "singleton_group_fraction": float(np.mean(sf)) if sf else None,
                                   "rows_in_groups_ge2": float((pooled >= 2).mean()),
                                   "row_size_hist": row_size_hist(pooled),
                                   "row_group_size_mean": float(pooled.mean())}
            if len(deepest) == len(sizes):
                anchor_phases[name]["deepest_level_rows_in_groups_ge2"] = float(
                    (np.concatenate([deepest[i] for i in idx]) >= 2).mean())
    result = {
        "arm": arm, "fields": ARMS[arm], "seed": seed, "points": points,
        "run_settings": {k: getattr(a, k) for k in RUN_KEYS},
        "headline_sampled": float(np.mean([p["sampled"] for p in last3])),
        # None (absent, never 0) where the last 3 evaluations were not all greedy (--greedy_evals start / none)
        "headline_greedy": float(np.mean([p["greedy"] for p in last3])) if all("greedy" in p for p in last3)
        else None,
        "auc_sampled": auc(points),
        "iters_to_50pct_train": iters_to(series["episode/success_rate"]),
        "env_steps": int(rows.sum()), "generated_tokens": int(round(float(tokens.sum()))),
        "wall_seconds": wall, "eval_seconds": cb.eval_seconds,
        # CPU seconds of this single-threaded run: ~ its wall time on an idle core (for the budget arithmetic)
        "cpu_seconds": cpu, "eval_cpu_seconds": cb.eval_cpu_seconds,
        "train_cpu_seconds_per_iteration": (cpu - cb.eval_cpu_seconds) / a.iterations,
        "peak_rss_mb": progress.peak_rss_mb(), "resumed_from": checkpoint,
        "start_eval": cb.start_source,  # "own", "kept" (--share_start_eval) or "resumed" (the checkpoint's)
        "cpu_model": cpu_model(),  # another CPU model computes other floats: starts compare only on the same one
        "series": series, "anchor_phases": anchor_phases,
    }
    sampled = " ".join(f"{p['sampled']:.2f}" for p in points)
    greedy = " ".join(f"{p['greedy']:.2f}" if "greedy" in p else "-" for p in points)
    last_greedy = "-" if result["headline_greedy"] is None else f"{result['headline_greedy']:.3f}"
    print(f"  seed {seed} {arm:5s}: sampled {sampled} | greedy {greedy} | last3 {result['headline_sampled']:.3f}/"
          f"{last_greedy} | AUC {result['auc_sampled']:.3f} | 50% at it {result['iters_to_50pct_train']} | "
          f"wall {result['wall_seconds']:.0f}s, CPU {result['cpu_seconds']:.0f}s (train "
          f"{result['train_cpu_seconds_per_iteration']:.2f}s/iteration, evaluations {result['eval_cpu_seconds']:.0f}s)",
          flush=True)
    return result


def arm_job(job, a, tok, env_factory, train_ds, eval_ds, out):
    seed, arm = job
    torch.set_num_threads(1)
    return run_arm(a, arm, seed, str(Path(a.warmup_dir or out) / f"seed{seed}" / "init"), tok, env_factory, train_ds,
                   eval_ds)


def main(argv=None) -> int:
    import datasets
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    a = parse_args(argv)
    if a.map_report:
        return map_report(a.map_dir or RESULTS / "map")
    if a.staleness_report:
        return staleness_report(a.staleness_report, a.staleness_json)
    if a.report_only:
        return report_only(a)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")) or 1)
    out = Path(a.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    env_factory = env_factory_for(a)
    env = env_factory()
    print(f"settings: {json.dumps(vars(a))}", flush=True)
    tok = load_tokenizer(a) if a.model else make_tokenizer(a, env_factory, a.vocab)
    train_ds = env.tasks("train").select(range(a.train_tasks))
    eval_ds = env.tasks("eval").select(range(a.eval_tasks))
    train_tasks = list(train_ds["task"])
    shared = set(train_tasks) & set(eval_ds["task"])
    print(f"tasks: {len(train_tasks)} train, {len(eval_ds)} held-out eval, {len(shared)} shared", flush=True)
    msgs, _ = random_prompt_messages(env, random.Random(0), train_tasks, a.history_length, a.walk_turns,
                                     instruction_for(a), a.max_turns)
    sample = _ids(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))
    word = env.action_words[0]
    print(f"tokenizer: {len(tok)} tokens; a prompt is ~{len(sample)} tokens, a completion "
          f"{len(tok.encode(completion_text(word, a.think)))} + eos", flush=True)
    schedule = eval_schedule(a.iterations, a.eval_every, a.eval_every_early)
    greedy = ", ".join(map(str, greedy_iterations(a.greedy_evals, schedule)))
    print(f"evaluations at iterations 0, {', '.join(map(str, schedule))}"
          f" ({f'greedy too at {greedy}' if greedy else 'sampled only'})"
          + (f"; the iteration-0 evaluation kept per seed in its warm-up folder" if a.share_start_eval else ""),
          flush=True)

    if a.model:
        warm = functools.partial(warm_up_llm, a=a, tok=tok, env_factory=env_factory, train_ds=train_ds,
                                 eval_ds=eval_ds, out=out, config_for=functools.partial(_warmup_config, a))
    else:
        warm = functools.partial(warm_up_seed, a=a, tok=tok, env_factory=env_factory, train_tasks=train_tasks,
                                 out=out)
    # GiGPO and GRPO of every seed first (they run side by side on the two workers), further arms after them, so a
    # run cut short still has the main comparison on as many seeds as possible (see --report_only).
    first = [arm for arm in a.arms if arm in ("GiGPO", "GRPO")]
    jobs = [(seed, arm) for seed in a.seeds for arm in first] + [
        (seed, arm) for arm in a.arms if arm not in first for seed in a.seeds]
    job = functools.partial(arm_job, a=a, tok=tok, env_factory=env_factory, train_ds=train_ds, eval_ds=eval_ds,
                            out=out)
    runs_log = out / "runs.jsonl"  # one line per finished (seed, arm) run, so a cut run still has its results
    finished = finished_runs(runs_log, a)  # a rerun of the same command skips them
    jobs = [j for j in jobs if j not in finished]
    if finished:
        print(f"runs already finished in {runs_log}, skipped: "
              + ", ".join(f"seed {s} {arm}" for s, arm in sorted(finished)), flush=True)
    old_warmups = json.loads((out / "warmups.json").read_text()) if (out / "warmups.json").exists() else {}

    def record(result):
        with runs_log.open("a") as f:
            f.write(json.dumps(result, default=float) + "\n")
        return result

    def check_warmups(warmups):
        (out / "warmups.json").write_text(json.dumps({str(k): v for k, v in warmups.items()}, default=float))
        print("\nwarm-ups:")
        for seed in a.seeds:
            print(f"  seed {seed:>4}: {warmup_line(warmups[seed])}")
        failed = [seed for seed in a.seeds if warmups[seed].get("failed")]
        print(f"warm-up wall time {time.perf_counter() - t_all:.0f}s", flush=True)
        if failed and not a.quick:
            raise SystemExit(f"warm-up failed on seed(s) {failed}: " + "; ".join(warmups[s]["failed"] for s in failed))

    pool = None
    if a.workers > 1:
        import multiprocessing as mp

        pool = mp.get_context("fork").Pool(min(a.workers, max(len(jobs), len(a.seeds))))
    try:
        # a seed whose runs are all finished keeps its recorded warm-up figures
        todo = [seed for seed in a.seeds if str(seed) not in old_warmups or any(j[0] == seed for j in jobs)
                or a.warmup_only]
        warmups = {seed: old_warmups[str(seed)] for seed in a.seeds if seed not in todo}
        warmups |= dict(zip(todo, (pool.map(warm, todo, chunksize=1) if pool else map(warm, todo))))
        check_warmups(warmups)
        if a.warmup_only:
            return 0
        for result in (pool.imap_unordered(job, jobs, chunksize=1) if pool else map(job, jobs)):
            record(result)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    (out / "invocation.json").write_text(json.dumps({"seeds": a.seeds, "arms": a.arms,
                                                     "wall_seconds": time.perf_counter() - t_all}))
    results = {k: r for k, r in load_runs([runs_log]).items() if k[0] in a.seeds and k[1] in a.arms}
    seeds = [s for s in a.seeds if all((s, arm) in results for arm in a.arms)]
    res_dir = Path(default_results_dir(a, seeds))
    res_dir.mkdir(parents=True, exist_ok=True)
    extra = {"tasks": {"train": len(train_ds), "held_out": len(eval_ds), "shared": len(shared)},
             "same_start": same_start(results, [arm for arm in a.arms if arm != "GRPO"])}
    if a.model:
        w = next((w for w in warmups.values() if "lora" in w), {})
        extra["model"] = {"model": a.model, "path": model_path(a), "hub_id": hub_model_id(a.model),
                          "params": w.get("params"), "trainable_params": w.get("trainable_params"),
                          "lora": w.get("lora")}
    write_report(a, results, seeds, warmups, time.perf_counter() - t_all, res_dir, extra=extra)
    return 0


def _warmup_config(a, seed, out_dir):
    return make_config(a, out_dir, {}, seed)


def finished_runs(runs_log, a) -> dict:
    """The (seed, arm) runs already in ``runs_log`` (none when it is missing). Raises ValueError when they were made
    with other ``RUN_KEYS`` settings than ``a``'s (the folder belongs to another command)."""
    if not Path(runs_log).exists() or not Path(runs_log).read_text().strip():
        return {}
    runs = load_runs([runs_log])
    mine = run_settings_filled({k: getattr(a, k) for k in RUN_KEYS})
    for (seed, arm), r in runs.items():
        theirs = run_settings_filled(r.get("run_settings"))
        if json.loads(json.dumps(theirs, default=float)) != json.loads(json.dumps(mine, default=float)):
            diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            raise ValueError(f"{runs_log} holds runs made with other settings ({', '.join(diff)}; seed {seed} "
                             f"{arm}); give another --output_dir or move that file away")
    return runs


# warm-up figures that a re-run of a seed's warm-up reproduces exactly when it is deterministic
WARMUP_FIGURES = ("steps", "rules_steps", "balance_rounds", "restarts", "init_seed", "legal",
                  "leads_on_among_two_legal", "n_two_door", "loss")


def same_start(results, new_arms, reference="GRPO", new_warmups=None, recorded_warmups=None) -> dict:
    """Per seed, whether each of ``new_arms`` started where the recorded ``reference`` arm did: the iteration-0
    evaluation (the first point: sampled and greedy held-out success) and, where both are given, the warm-up
    figures of ``WARMUP_FIGURES``. Returns {"reference", "per_seed": {seed: {arm: {field: [new, recorded]}}} of
    the differences only, "differing_seeds"}."""
    per_seed = {}
    for seed in sorted({s for s, _ in results}):
        ref = results.get((seed, reference))
        if ref is None:
            continue
        for arm in new_arms:
            run = results.get((seed, arm))
            if run is None:
                continue
            diff = {f"iteration 0 {k}": [run["points"][0].get(k), ref["points"][0].get(k)]
                    for k in ("sampled", "greedy") if run["points"][0].get(k) != ref["points"][0].get(k)}
            if run.get("cpu_model") and ref.get("cpu_model") and run["cpu_model"] != ref["cpu_model"]:
                diff["cpu model"] = [run["cpu_model"], ref["cpu_model"]]
            new_w, old_w = (new_warmups or {}).get(str(seed)), (recorded_warmups or {}).get(str(seed))
            if new_w and old_w:
                diff |= {f"warm-up {k}": [new_w.get(k), old_w.get(k)] for k in WARMUP_FIGURES
                         if new_w.get(k) != old_w.get(k)}
            if diff:
                per_seed.setdefault(str(seed), {})[arm] = diff
    return {"reference": reference, "arms": list(new_arms), "per_seed": per_seed,
            "differing_seeds": sorted(int(s) for s in per_seed)}


def report_only(a) -> int:
    """--report_only: merge the runs (and warm-up figures) of ``a.runs`` and of the recorded reports
    ``a.recorded`` and write the report. With recorded reports, the arms of ``a.runs`` that they lack are checked
    against the recorded GRPO of the same seed (``same_start``) and the seeds where they differ are printed."""
    paths = [Path(p) for p in (a.runs or [Path(a.output_dir) / "runs.jsonl"])]
    recorded = [Path(p) for p in (a.recorded or [])]
    results = load_runs(paths, recorded)
    warmups, wall = {}, 0.0
    for path in paths:
        w = path.parent / "warmups.json"
        if w.exists():
            for seed, stats in json.loads(w.read_text()).items():
                warmups.setdefault(str(seed), stats)
        inv = path.parent / "invocation.json"
        wall += json.loads(inv.read_text())["wall_seconds"] if inv.exists() else float("nan")
    extra = {}
    if recorded:
        reports = [json.loads(p.read_text()) for p in recorded]
        old_arms = {arm for d in reports for arm in d.get("arms", {})}
        recorded_warmups = {str(s): w for d in reports for s, w in (d.get("warmup") or {}).items()}
        new_arms = [arm for arm in ARMS if arm not in old_arms and any(k[1] == arm for k in results)]
        start = same_start(results, new_arms, new_warmups=warmups, recorded_warmups=recorded_warmups)
        print(f"same start: {', '.join(new_arms) or 'no new arm'} against the recorded {start['reference']}, "
              f"seed by seed (iteration-0 evaluation, warm-up figures)")
        for seed, arms in start["per_seed"].items():
            for arm, diff in arms.items():
                print(f"  seed {seed} {arm} differs: " + "; ".join(f"{k} {v[0]} vs {v[1]}" for k, v in diff.items()))
        if not start["per_seed"]:
            print("  identical on every seed")
        extra = {"same_start": start, "recorded": {str(p): {k: d.get(k) for k in (
            "command", "commit", "date", "machine", "total_seconds") if k in d} | {"arms": list(d.get("arms", {}))}
            for p, d in zip(recorded, reports)}}
        # the recorded arms' warm-ups are the ones every arm started from (the re-run's only where none is recorded)
        warmups = warmups | recorded_warmups
        wall += sum(d.get("total_seconds") or 0.0 for d in reports)
    arms = [arm for arm in ARMS if arm in a.arms and any(k[1] == arm for k in results)]
    if not a.seeds_given:
        a.seeds = sorted({s for s, _ in results})
    a.arms = arms
    seeds = [s for s in a.seeds if all((s, arm) in results for arm in arms)]
    if results:  # the merged runs' own settings, not this invocation's defaults
        for k, v in (next(iter(results.values())).get("run_settings") or {}).items():
            setattr(a, k, v)
    res_dir = Path(default_results_dir(a, seeds))
    res_dir.mkdir(parents=True, exist_ok=True)
    return write_report(a, results, seeds, warmups, wall, res_dir, extra=extra)
