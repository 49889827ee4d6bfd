"""What each estimator arm costs, side by side on one map cell: the peak resident memory of its training process and
the seconds per training iteration, split into the rollout, the advantages and the rest (the policy's forward,
backward and optimizer step; PPO's critic value pass, loss and step). The paper's claim for critic-free step credit
is about memory (benchmarks/experiments/baselines_arm.md, "Cost"); this measures it on our testbed.

    python benchmarks/bench_estimator_cost.py                  # h12, seed 600, GRPO GiGPO G2PO RLOO PPO: the record
    python benchmarks/bench_estimator_cost.py --arms GRPO PPO --iterations 2
    python benchmarks/bench_estimator_cost.py --condition h6 --arms GRPO PPO -- --model default \
        --warmup_episodes 2 --warmup_epochs 1 --groups 1 --num_generations 4 --spg 1 --iterations 3 \
        --eval_every 1 --eval_every_early 1 --eval_tasks 2 --eval_batch 2 --history_mode window   # the default LLM

Flags after ``--`` go to every ``benchmarks/learning.py`` call as they are; with ``--model`` there the record is
``bench_estimator_cost_llm.json`` (LoRA on the pretrained model; PPO's critic a second adapter on the same base
weights with a value head), and the parameter counts are the trainable ones. With ``--model`` one more arm may be
named: ``PPO-whole``, PPO with the critic the paper's baselines train (``--critic_model policy``: a second whole copy
of the model, every weight trained, its AdamW state beside it), the memory claim's other side.

A rerun of the same command resumes: the arms already measured (``OUTPUT_DIR/arms.json``) are kept, not rerun; each
arm records the commit and date it ran at.

One warm-up (``benchmarks/learning.py --warmup_only``), then every arm in turn in its own process
(``benchmarks/learning.py --arms ARM --workers 1 --reuse_warmup``, single-threaded), from the same warm-up weights,
with the cell's settings (iterations, evaluations, 128 held-out tasks). Per arm: the child's peak resident memory
(``ru_maxrss`` from ``os.wait4``: the whole process, the tokenizer, tasks and the reused warm-up included), wall and
CPU seconds per iteration without the held-out evaluations, the mean logged ``rollout/seconds`` and
``rollout/advantage_seconds``, the load average before and after, the run's held-out success (sampled, last 3
evaluations) and its model sizes (policy parameters; PPO's critic: its parameters too). The wall times hold only for
the load recorded with them; the CPU seconds are the figure to compare on a busy machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
DEFAULT_ARMS = ["GRPO", "GiGPO", "G2PO", "RLOO", "PPO"]
# arms of this benchmark that are a map arm run with more learning.py flags (with --model only)
VARIANTS = {"PPO-whole": ("PPO", ["--critic_model", "policy"])}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--condition", default="h12", help="the map cell (benchmarks/learning/settings.py CONDITIONS)")
    p.add_argument("--seed", type=int, default=600)
    p.add_argument("--arms", nargs="+", default=DEFAULT_ARMS)
    p.add_argument("--iterations", type=int, default=None, help="default: the cell's pre-registered iterations")
    p.add_argument("--output_dir", default="outputs/bench/estimator_cost")
    p.add_argument("learning_args", nargs=argparse.REMAINDER,
                   help="after --: flags for every benchmarks/learning.py call (e.g. --model default ...)")
    return p


def run_child(cmd: list[str], log: Path) -> tuple[int, float, float]:
    """Run ``cmd`` with its output in ``log``; returns ``(return code, its peak resident memory in MB, wall s)``."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024, time.perf_counter() - t0


def adapter_sizes(warmups: Path, seed: int, arm_fields: dict, whole_critic: bool = False) -> dict:
    """With ``--model``: the trainable parameters of the warm-up's LoRA adapter (``warmups.json``) and, for PPO, of
    its critic and a scalar value head on the hidden size: a second adapter of the same configuration, or with
    ``whole_critic`` the whole decoder (the model's parameters less its output head where that is not tied; counted
    on the meta device, no weights loaded)."""
    w = json.loads(warmups.read_text())[str(seed)]
    sizes = {"policy_params": w["params"], "policy_trainable_params": w["trainable_params"]}
    if arm_fields.get("estimator") == "ppo":
        import torch
        from transformers import AutoConfig, AutoModel

        from gigpo_trl.models import resolve_model_path

        config = AutoConfig.from_pretrained(resolve_model_path(w["settings"]["model"]))
        hidden = config.hidden_size
        if whole_critic:
            with torch.device("meta"):
                decoder = sum(p.numel() for p in AutoModel.from_config(config).parameters())
            sizes["critic_trainable_params"] = decoder + hidden + 1
        else:
            sizes["critic_trainable_params"] = w["trainable_params"] + hidden + 1
    return sizes


def model_sizes(init_dir: Path, arm_fields: dict) -> dict:
    """Parameters of the warmed-up policy and, for PPO, of its critic (a copy of the policy's decoder with a value
    head: gigpo_trl.critic), counted from the saved warm-up weights."""
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(init_dir)
    n = sum(p.numel() for p in policy.parameters())
    sizes = {"policy_params": n}
    if arm_fields.get("estimator") == "ppo":
        decoder = sum(p.numel() for p in policy.base_model.parameters())
        sizes["critic_params"] = decoder + policy.config.hidden_size + 1  # the decoder and a scalar head
    return sizes


def arm_figures(arm: str, out: Path, seed: int, peak_mb: float, wall: float, loads: list[float]) -> dict:
    """The figures of one arm's run from its ``runs.jsonl`` line."""
    run = json.loads((out / "runs.jsonl").read_text().splitlines()[-1])
    iters = len(run["series"]["rollout/rows"])
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    rollout = mean(run["series"].get("rollout/seconds", []))
    adv = mean(run["series"].get("rollout/advantage_seconds", []))
    train_wall = (run["wall_seconds"] - run["eval_seconds"]) / iters
    return {
        "seed": seed, "iterations": iters, "peak_rss_mb": round(peak_mb, 1), "process_wall_seconds": round(wall, 1),
        "train_wall_seconds_per_iteration": round(train_wall, 3),
        "train_cpu_seconds_per_iteration": round(run["train_cpu_seconds_per_iteration"], 3),
        "rollout_seconds_per_iteration": round(rollout, 3), "advantage_seconds_per_iteration": round(adv, 4),
        "rest_seconds_per_iteration": round(train_wall - rollout - adv, 3),
        "rows_per_iteration": round(mean(run["series"]["rollout/rows"]), 1),
        "held_out_success_last3": round(run["headline_sampled"], 4), "load": [round(x, 2) for x in loads],
    }


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from learning.settings import ARMS
    import results_io
    from results_io import write_result

    unknown = [arm for arm in a.arms if arm not in ARMS and arm not in VARIANTS]
    if unknown:
        parser.error(f"unknown arm(s) {unknown}; choose from {sorted(ARMS) + sorted(VARIANTS)}")
    out = Path(a.output_dir)
    warm = out / "warmup"
    base = [sys.executable, str(HERE / "learning.py"), "--condition", a.condition, "--seeds", str(a.seed),
            "--workers", "1", "--warmup_dir", str(warm), "--reuse_warmup"]
    if a.iterations:
        base += ["--iterations", str(a.iterations)]
    extra = [x for x in a.learning_args if x != "--"]
    llm = "--model" in extra
    if not llm and any(arm in VARIANTS for arm in a.arms):
        parser.error(f"{[arm for arm in a.arms if arm in VARIANTS]} need --model after --: the tiny policy's critic "
                     "is already a whole copy of its decoder")
    base += extra
    warm.mkdir(parents=True, exist_ok=True)
    variant = lambda arm: VARIANTS.get(arm, (arm, []))  # noqa: E731  (the map arm and its extra flags)
    rc, _, wall = run_child(base + ["--arms", variant(a.arms[0])[0], "--warmup_only", "--output_dir", str(warm)],
                            out / "warmup.log")
    if rc:
        print((out / "warmup.log").read_text()[-3000:], file=sys.stderr)
        return rc
    print(f"warm-up (seed {a.seed}, {a.condition}): {wall:.0f} s", flush=True)
    figures = {"condition": a.condition, "seed": a.seed, "arms": {}}
    # a rerun of the same command keeps the arms already measured (OUTPUT_DIR/arms.json), so a cut run resumes
    done_path, key = out / "arms.json", {k: v for k, v in vars(a).items() if k not in ("output_dir", "arms")}
    if done_path.exists():
        done = json.loads(done_path.read_text())
        if done["key"] == json.loads(json.dumps(key)):
            figures["arms"] = {arm: f for arm, f in done["arms"].items() if arm in a.arms}
            print(f"arms already measured in {done_path}, kept: {', '.join(figures['arms']) or 'none'}", flush=True)
    for arm in a.arms:
        if arm in figures["arms"]:
            continue
        arm_out = out / arm
        shutil.rmtree(arm_out, ignore_errors=True)  # a fresh run: learning.py skips runs already in runs.jsonl
        arm_out.mkdir(parents=True)
        load_before = os.getloadavg()[0]
        map_arm, flags = variant(arm)
        rc, peak, wall = run_child(base + ["--arms", map_arm, *flags, "--output_dir", str(arm_out)],
                                   out / f"{arm}.log")
        if rc:
            print((out / f"{arm}.log").read_text()[-3000:], file=sys.stderr)
            return rc
        f = arm_figures(arm, arm_out, a.seed, peak, wall, [load_before, os.getloadavg()[0]])
        # the code and day each arm ran: a resumed command keeps the arms measured before, at their own commit
        f |= {"commit": results_io.commit(), "date": time.strftime("%Y-%m-%d", time.gmtime())}
        f |= (adapter_sizes(warm / "warmups.json", a.seed, ARMS[map_arm], whole_critic="--critic_model" in flags)
              if llm else model_sizes(warm / f"seed{a.seed}" / "init", ARMS[map_arm]))
        figures["arms"][arm] = f
        done_path.write_text(json.dumps({"key": key, "arms": figures["arms"]}, indent=1))
        print(f"{arm:>6}: peak {f['peak_rss_mb']:.0f} MB | per iteration: train {f['train_wall_seconds_per_iteration']:.2f}"
              f" s wall, {f['train_cpu_seconds_per_iteration']:.2f} s CPU (rollout {f['rollout_seconds_per_iteration']:.2f}"
              f", advantages {f['advantage_seconds_per_iteration']:.4f}, rest {f['rest_seconds_per_iteration']:.2f}) | "
              f"{f['rows_per_iteration']:.0f} rows | held-out success {f['held_out_success_last3']:.3f} | load "
              f"{f['load'][0]:.1f} -> {f['load'][1]:.1f}", flush=True)
    figures["arms"] = {arm: figures["arms"][arm] for arm in a.arms}  # in the order asked, kept arms included
    # the record: the default cell, seed and arms (with --model: whatever flags follow), wherever the runs' folders
    # were kept
    keep = {"output_dir": None, "learning_args": None} if llm else {"output_dir": None}
    recorded = {**vars(a), **keep} == {**vars(parser.parse_args([])), **keep}
    if llm:
        figures["learning_args"] = extra
    write_result("bench_estimator_cost_llm" if llm else "bench_estimator_cost", figures, recorded=recorded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
