"""Dynamic sampling (DAPO, arXiv 2503.14476, Sec. 3.2) for :class:`~gigpo_trl.trainer.GiGPOTrainer` (a mixin).

A task group whose trajectory returns are all equal carries no episode-level signal; its tasks are replaced by fresh
ones and rolled out again (``dynamic_sampling``, ``max_dynamic_sampling_rounds``). The advantage estimator is the
trainer's own ``_advantages``, so "flat" is judged with the settings the batch is trained with.
"""

from __future__ import annotations

import logging
import zlib

import numpy as np
from accelerate.utils import gather_object

from . import trl_compat
from .rollout import advantage_keys

logger = logging.getLogger("gigpo_trl.trainer")  # the trainer's logger: its warnings keep their old source


class DynamicSamplingMixin:
    """``_resample_flat_groups`` / ``_flat_groups`` (mixed into GiGPOTrainer; uses its ``collector``,
    ``train_dataset``, ``_advantages`` and ``accelerator``)."""

    def _resample_flat_groups(self, inputs: list[dict], group_ids: list[str], batch):
        """Dynamic sampling (DAPO, arXiv 2503.14476, Sec. 3.2): a task group whose trajectory returns are all equal
        carries no episode-level signal; roll out a fresh task in its place, up to ``max_dynamic_sampling_rounds``
        extra rounds. Unlike DAPO's rule, a group whose step groups still carry a non-zero A_S is kept by default
        (``dynamic_sampling_keep_step_signal``; see :meth:`_flat_groups`). Every rank takes the same decisions
        (gathered returns, replacement tasks chosen by a hash of the group id, round and step), so all ranks make
        the same collect calls. Groups still flat after the last round are kept, counted in
        ``dynamic_sampling/still_flat_groups`` and warned about once."""
        dataset = self.train_dataset
        replaced = 0
        flat = self._flat_groups(batch)
        for round_ in range(1, self.args.max_dynamic_sampling_rounds + 1):
            if not flat:
                break
            replaced += len(flat)
            positions = [i for i, g in enumerate(group_ids) if g in flat]
            for i in positions:
                key = f"{group_ids[i]}|{round_}|{self.state.global_step}"
                inputs[i] = dict(dataset[zlib.crc32(key.encode()) % len(dataset)])
                group_ids[i] = f"{group_ids[i]}|r{round_}"
            fresh = self.collector.collect([inputs[i] for i in positions], [group_ids[i] for i in positions],
                                           trajectory_prefix=(self.accelerator.process_index, round_))
            dropped = {batch.trajectories[i].trajectory_id for i in positions}
            batch.rows = [r for r in batch.rows if r.trajectory_id not in dropped] + fresh.rows
            for n, i in enumerate(positions):
                batch.trajectories[i] = fresh.trajectories[n]
            batch.num_generate_calls += fresh.num_generate_calls
            batch.max_prompt_tokens = max(batch.max_prompt_tokens, fresh.max_prompt_tokens)
            flat = self._flat_groups(batch)
        logged = trl_compat.metrics(self, "train")
        logged["dynamic_sampling/replaced_groups"].append(float(replaced))
        logged["dynamic_sampling/still_flat_groups"].append(float(len(flat)))
        if flat and not getattr(self, "_warned_still_flat", False):
            self._warned_still_flat = True
            logger.warning(
                "dynamic sampling: %d task group(s) still have all-equal returns after max_dynamic_sampling_rounds=%d "
                "extra rounds and are kept (no episode-level signal); the tasks may be too easy or too hard for the "
                "policy. Raise max_dynamic_sampling_rounds or change the task mix (this warning is shown once; see "
                "the metric dynamic_sampling/still_flat_groups).", len(flat), self.args.max_dynamic_sampling_rounds,
            )
        return batch

    def _flat_groups(self, batch) -> set:
        """Task groups (all ranks) whose healthy trajectories' returns are all equal; unless
        ``dynamic_sampling_keep_step_signal`` is off (DAPO's rule) or ω = 0, minus those whose step groups give
        some row a non-zero A_S (e.g. equal returns reached in different numbers of turns)."""
        multi = self.accelerator.num_processes > 1
        local = [(t.group_id, t.episode_return) for t in batch.trajectories if not t.failed]
        returns: dict[str, set] = {}
        for group, value in (gather_object(local) if multi else local):
            returns.setdefault(group, set()).add(round(value, 9))
        flat = {g for g, values in returns.items() if len(values) == 1}
        if flat and self.args.dynamic_sampling_keep_step_signal and self.args.step_advantage_weight != 0:
            keys = advantage_keys([r for r in batch.rows if r.group_id in flat])
            keys = gather_object(keys) if multi else keys
            if keys:  # the same estimator settings as the training advantages, so A_S is the one trained on
                groups = [key[0] for key in keys]
                A_S = self._advantages(keys).step_advantages
                flat -= {g for g, a in zip(groups, np.abs(A_S)) if a > 1e-9}
        return flat
