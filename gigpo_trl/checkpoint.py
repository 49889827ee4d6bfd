"""Checkpoint, resume and model-card behaviour of :class:`~gigpo_trl.trainer.GiGPOTrainer` (a mixin).

Four things on top of TRL/Trainer's own checkpointing:

- **rollout position**: TRL keeps its place in the generation cycle in the micro-step counter and the buffered
  generation batch (see :func:`gigpo_trl.trl_compat.rollout_position`); they are saved per process as
  ``gigpo_rollout_state_<rank>.pt`` next to Trainer's files and restored on resume, so a resumed run continues the
  cycle instead of regenerating at once; a resume with another number of processes is refused
  (:func:`check_checkpoint_world_size`).
- **nothing left, nothing run**: a run resumed from a checkpoint at (or past) ``max_steps`` trains no step: no
  rollout, no optimizer step, no step logged, no checkpoint written (:meth:`CheckpointMixin._init_training_state`).
- **token scrub**: the config file that Trainer writes (``training_args.bin``) and pushes carries no Hub token
  (:func:`gigpo_trl.config.scrubbed_tokens`), while the live config keeps it.
- **base model's name**: TRL's and PEFT's cards and the saved adapter's ``adapter_config.json`` name the base model
  by its Hub id, not a local cache path (:func:`gigpo_trl.models.hub_model_id`).

The overridden hooks (``_save_checkpoint``, ``_save``, ``_push_from_checkpoint``, ``_init_training_state``,
``_load_optimizer_and_scheduler``) are TRL/Trainer private methods, listed with their contract tests in :mod:`gigpo_trl.trl_compat`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import warnings

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from . import trl_compat
from .config import scrubbed_tokens
from .models import hub_model_id

# Per-process rollout state written into every checkpoint next to TRL/Trainer's files (see _save_checkpoint).
ROLLOUT_STATE_NAME = "gigpo_rollout_state_{rank}.pt"


def check_checkpoint_world_size(checkpoint: str, world_size: int) -> None:
    """Refuse to resume from ``checkpoint`` with another number of processes than the one that saved it: each rank's
    rollout buffer (``ROLLOUT_STATE_NAME``) holds that rank's rows, so another world size would train on the wrong
    ones. Checkpoints without rollout state files (saved with ``save_only_model``) pass.

    Raises:
        ValueError: one line naming both process counts.
    """
    saved = len(glob.glob(os.path.join(glob.escape(checkpoint), ROLLOUT_STATE_NAME.format(rank="*"))))
    if saved and saved != world_size:
        raise ValueError(f"checkpoint {checkpoint} was saved by {saved} processes but this run has {world_size}; "
                         f"resume with {saved} processes (its rollout buffers are per process)")


@contextlib.contextmanager
def card_names_hub_base_model(model):
    """While the block runs, ``model`` (unwrapped from accelerate; a PEFT model or a transformers model), its config
    and its PEFT adapters' configs name the base model by its Hub id (:func:`gigpo_trl.models.hub_model_id`) instead
    of a local path; every name is restored afterwards, also when the block raises. No effect when the local name
    has no known Hub id (a local folder of unknown origin keeps its path).

    TRL's card (``create_model_card``, also written with every checkpoint) and PEFT's (written by ``save_model``)
    name the base model after the model's ``name_or_path`` / its config's ``_name_or_path``, and PEFT's
    ``adapter_config.json`` after ``base_model_name_or_path``; for the default model that is its cached local
    conversion, which exists on the training machine only (``AutoPeftModelForCausalLM`` could not load the adapter
    elsewhere; TRL's card would say "[None]")."""
    adapters = list(getattr(model, "peft_config", {}).values())  # read before unwrapping: PEFT models only
    model = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT: the transformers model
    config = getattr(model, "config", None)
    local = trl_compat.config_name_or_path(config) if config is not None else None
    hub_id = hub_model_id(local) if local else None
    if hub_id is None or hub_id == local:
        yield
        return
    saved = model.name_or_path
    renamed = [(adapter, adapter.base_model_name_or_path) for adapter in adapters
               if adapter.base_model_name_or_path in (local, saved)]
    trl_compat.set_config_name_or_path(config, hub_id)
    model.name_or_path = hub_id
    for adapter, _ in renamed:
        adapter.base_model_name_or_path = hub_id
    try:
        with warnings.catch_warnings():
            # Offline, PEFT cannot read the Hub id's config to compare vocabularies and says so on every save; the
            # local folder it was loaded from is a copy of that model, the vocabulary is unchanged.
            warnings.filterwarnings("ignore", message=f"Could not find a config file in {re.escape(hub_id)}")
            yield
    finally:
        trl_compat.set_config_name_or_path(config, local)
        model.name_or_path = saved
        for adapter, name in renamed:
            adapter.base_model_name_or_path = name


class CheckpointMixin:
    """Rollout position in checkpoints, token-free saved configs, Hub ids in model cards (mixed into a
    ``GRPOTrainer`` subclass, before it in the bases)."""

    def _save_checkpoint(self, model, trial):
        """Also save this process's rollout position: TRL's micro-step counter ``_step`` and, when the checkpoint
        falls inside a generation cycle, the buffered generation batch the next steps train on. Without them a
        resumed run would regenerate at once (new samples, a shifted generation cycle) instead of continuing."""
        if not self.args.save_only_model:
            name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            folder = os.path.join(trl_compat.output_dir(self, trial), name)
            os.makedirs(folder, exist_ok=True)
            step, buffered = trl_compat.rollout_position(self)
            reuse = buffered is not None and not self.args.starts_rollout(step)
            state = {"step": step, "buffered_inputs": buffered if reuse else None}
            # Tensors, lists, dicts and ints only: loadable with torch.load(weights_only=True).
            torch.save(state, os.path.join(folder, ROLLOUT_STATE_NAME.format(rank=self.accelerator.process_index)))
        super()._save_checkpoint(model, trial)

    # Trainer writes the config (``torch.save(self.args)``, training_args.bin) in these two methods only, the second
    # before pushing the folder to the Hub: no token in those files, while the live config keeps its token.
    # _save also writes PEFT's model card: see card_names_hub_base_model.
    def _save(self, output_dir=None, state_dict=None):
        with scrubbed_tokens(), card_names_hub_base_model(self.accelerator.unwrap_model(self.model)):
            super()._save(output_dir, state_dict)

    def _push_from_checkpoint(self, checkpoint_folder):
        with scrubbed_tokens():
            super()._push_from_checkpoint(checkpoint_folder)

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint,
                             trial):
        """Trainer's ``(epochs trained, micro-steps trained in the epoch)`` once the checkpoint's state is loaded,
        which bound its epoch loop; all ``num_train_epochs`` (no step left) when the state is at or past
        ``max_steps``. Trainer counts ``global_step // num_update_steps_per_epoch`` epochs as trained and stops only
        after a step (``DefaultFlowCallback.on_step_end``), so where ``max_steps`` ends inside an epoch it ran one
        more step: a rollout (the checkpoint ends an iteration, nothing buffered) or a repeat of the buffered
        batch, an optimizer step, its log and a checkpoint past ``max_steps``."""
        trained = super()._init_training_state(max_steps, num_update_steps_per_epoch, num_train_epochs,
                                               resume_from_checkpoint, trial)
        if resume_from_checkpoint is not None and self.state.global_step >= max_steps:
            return num_train_epochs, 0
        return trained

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is not None:
            check_checkpoint_world_size(checkpoint, self.accelerator.num_processes)
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        self.mark_weights_changed()  # Trainer loaded the checkpoint's weights just before: vLLM must get them
        path = os.path.join(checkpoint, ROLLOUT_STATE_NAME.format(rank=self.accelerator.process_index))
        if os.path.isfile(path):
            state = torch.load(path, map_location=self.accelerator.device, weights_only=True)
            trl_compat.set_rollout_position(self, int(state["step"]), state["buffered_inputs"])
        else:  # a checkpoint of another version: keep the generation cycle aligned, regenerate at once
            trl_compat.set_rollout_position(self, self.args.micro_steps(self.state.global_step), None)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        with card_names_hub_base_model(self.accelerator.unwrap_model(self.model)):
            super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)

