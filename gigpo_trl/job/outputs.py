"""The job's outputs: the output folder check (a run never overwrites an earlier one), the evaluation JSON, the
model card, the Hub push and the run's report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..envs.registry import PROTOCOLS
from ..report.data import PHASES
from .arguments import JobArguments


def check_output_dir(job: JobArguments, args) -> None:
    """Refuse to overwrite an earlier run: a non-empty ``output_dir`` (training) or an existing eval JSON.

    Raises:
        FileExistsError: naming the folder or file and the flags that resolve it; nothing has been written then.
    """
    if job.overwrite_output_dir:
        return
    eval_json = Path(job.eval_json or Path(args.output_dir) / "eval_results.json")
    out = Path(args.output_dir)
    if not job.eval_only and out.is_dir() and any(out.iterdir()):
        names = sorted(p.name for p in out.iterdir())
        shown = ", ".join(names[:4]) + (f", ... ({len(names)} entries)" if len(names) > 4 else "")
        raise FileExistsError(
            f"--output_dir {str(out)!r} already holds files ({shown}); nothing was overwritten. Pass "
            "--overwrite_output_dir true to replace them, or choose another --output_dir"
        )
    if eval_json.exists():
        raise FileExistsError(
            f"the evaluation JSON {str(eval_json)!r} already exists; nothing was overwritten. Pass "
            "--overwrite_output_dir true to replace it, or choose another --eval_json"
        )


def _evaluation_rows(results: dict) -> list[str]:
    """The card's evaluation rows: the job's evaluation phases in order (each with its paper-protocol draw, where the
    environment has one); the warm-up's expert statistics are not an evaluation and stay out."""
    rows = []
    for phase in (p for key in PHASES for p in (key, f"{key}_paper")):
        metrics = results.get(phase)
        if isinstance(metrics, dict) and "success_rate" in metrics:
            rows.append(f"| {phase} | {metrics['success_rate']:.3f} | {int(metrics.get('num_tasks', 0))} |")
    return rows


def _warmup_text(results: dict) -> str:
    stats = results.get("warmup")
    if not isinstance(stats, dict):
        return "No expert warm-up: GiGPO trained from the base model."
    return (f"Before GiGPO, an expert warm-up (`gigpo_trl.warmup.expert_warmup`): {stats.get('episodes', 0)} expert "
            f"episodes on the training tasks (expert success {stats.get('success_rate', 0.0):.3f}) gave "
            f"{stats.get('rows', 0)} demonstration rows, trained by TRL's `SFTTrainer` on the same weights for "
            f"{stats.get('sft_steps', 0)} steps (mean loss {stats.get('train_loss', float('nan')):.4f}). The "
            "`after_warmup` row below is the policy after the warm-up, before GiGPO.")


def model_card(base_model: str | None, job: JobArguments, args, results: dict, local_name: str | None = None,
               lora: bool = True) -> str:
    """Markdown model card: base model, how to load and evaluate the weights, the environment and its data, the
    warm-up, GiGPO settings and the evaluations' success rates (the keys of ``eval_results.json``).

    ``base_model`` is a Hub id (see :func:`gigpo_trl.models.hub_model_id`) or None for a local model of unknown
    origin, which the card then names by ``local_name`` in its text only (a ``base_model`` entry must be a Hub id).
    ``lora``: the run trained a PEFT adapter (``library_name: peft``); False for full fine-tuning (the paper configs).
    """
    kind = "LoRA adapter for" if lora else "Full fine-tune of"
    settings = {**args.estimator_settings.to_dict(), **{k: getattr(args, k) for k in (
        "num_generations", "max_turns", "history_length", "learning_rate", "beta", "max_steps",
        "max_completion_length")}}
    base_line = [f"base_model: {base_model}"] if base_model else []
    base_text = f"`{base_model}`" if base_model else f"a local model (`{local_name or 'unknown'}`)"
    base_arg = base_model or "PATH/TO/BASE_MODEL"
    data = (f"the environment's official data (given with `--data_dir`)" if job.data_dir
            else "the data bundled with `gigpo_trl` (no download)")
    protocol = "" if job.protocol == PROTOCOLS[0] else f", environment protocol `{job.protocol}`"
    if lora:
        load = ["```python", "from peft import PeftModel", "from transformers import AutoModelForCausalLM", "",
                f'base = AutoModelForCausalLM.from_pretrained("{base_arg}")',
                'model = PeftModel.from_pretrained(base, "THIS_REPO_OR_FOLDER")', "```"]
    else:
        load = ["```python", "from transformers import AutoModelForCausalLM", "",
                'model = AutoModelForCausalLM.from_pretrained("THIS_REPO_OR_FOLDER")', "```"]
    evaluate = (f"python -m gigpo_trl.job --env {job.env} --model_name_or_path {base_arg} --eval_only true "
                f"--adapter_path THIS_REPO_OR_FOLDER --output_dir outputs/eval-{job.env}" if lora else
                f"python -m gigpo_trl.job --env {job.env} --model_name_or_path THIS_REPO_OR_FOLDER --use_peft false "
                f"--eval_only true --output_dir outputs/eval-{job.env}")
    lines = [
        "---", *(["library_name: peft"] if lora else []), *base_line,
        "tags: [gigpo, trl, reinforcement-learning, agent]",
        "---", "", f"# GiGPO agent for {job.env}", "",
        f"{kind} {base_text}, trained with GiGPO (Group-in-Group Policy Optimization, arXiv 2505.10978) "
        f"using `gigpo_trl` on the `{job.env}` environment ({'official data' if job.data_dir else 'bundled data'}).",
        "", "## How to use", "", *load, "",
        f"Evaluate it on the `{job.env}` environment's eval split (with `gigpo_trl` installed; the results go "
        "to `eval_results.json` in `--output_dir`):", "", "```bash", evaluate, "```", "",
        "## Training", "",
        f"Environment `{job.env}`{protocol}, tasks from {data}. {_warmup_text(results)}", "",
        "## GiGPO settings", "", "| setting | value |", "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in settings.items()], "",
        "## Evaluation (success rate on the eval split)", "",
        "Each row is one evaluation of the run, named as in its `eval_results.json`.", "",
        "| when | success rate | tasks |", "| --- | --- | --- |", *_evaluation_rows(results),
    ]
    return "\n".join(lines) + "\n"


def push_adapter(folder: str, repo_id: str, token: str | None) -> None:
    """Upload ``folder`` to the Hub repo ``repo_id``. Raises on any failure (no network, no token)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(folder_path=folder, repo_id=repo_id, commit_message="GiGPO adapter and model card")


def write_outputs(job: JobArguments, args, results: dict, hub_id: str | None, base_model: str, lora: bool,
                  push: bool) -> int:
    """Write the evaluation JSON and (after training) the model card, and push to the Hub when asked; returns the
    exit code: 0, or 1 when only the push failed (the local files are kept)."""
    out = Path(job.eval_json or Path(args.output_dir) / "eval_results.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(f"[gigpo] evaluation written to {out}", flush=True)
    if job.eval_only:
        return 0
    card = model_card(hub_id, job, args, results, local_name=Path(base_model).name, lora=lora)
    Path(args.output_dir, "README.md").write_text(card)
    print(f"[gigpo] {'adapter' if lora else 'model'} and model card saved in {args.output_dir}", flush=True)
    if not push:
        return 0
    repo_id = args.hub_model_id or Path(args.output_dir).name
    try:
        push_adapter(args.output_dir, repo_id, args.hub_token)
    except Exception as exc:  # no network, no token, ...: say so once, keep the local files
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"[gigpo] push to the Hub failed ({type(exc).__name__}: {reason}); the adapter and model "
              f"card are saved in {args.output_dir}", file=sys.stderr, flush=True)
        return 1
    print(f"[gigpo] pushed to the Hub: {repo_id}", flush=True)
    return 0


def print_report(trainer, output_dir: str) -> None:
    """Save the log history (``trainer_state.json``) and write the run's report (:mod:`gigpo_trl.report`) from it and
    the rollout records; print its path, or, without the ``report`` extra (plotly), how to build it later."""
    trainer.save_state()
    try:
        from ..report import build_report

        print(f"[gigpo] report (curves, each task group's anchor-state graph): {build_report(output_dir)}", flush=True)
    except ImportError as exc:
        print(f"[gigpo] rollout records in {Path(output_dir) / 'records'}; the report needs the `report` extra "
              f"({exc.name or exc}): pip install 'gigpo_trl[report]' && python -m gigpo_trl.report {output_dir}",
              flush=True)
