"""The estimator's settings as one value: :class:`EstimatorSettings`.

``GiGPOConfig.estimator_settings`` builds it from the configuration; :func:`~gigpo_trl.advantage.compute_gigpo_advantages`
takes it; the rollout records store it (``settings.json``, :meth:`EstimatorSettings.to_dict`) and the report reads
it back (:meth:`EstimatorSettings.from_dict`). A new estimator option is a field here (checked in
``__post_init__``), its use in the estimator, and the configuration field that sets it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from .options import EPISODE_STATS, MODES, STEP_GROUPINGS, STEP_RETURNS
from .rows import as_scalar

#: Configuration fields whose name differs from the setting they set (``GiGPOConfig`` field -> setting); every other
#: setting has a configuration field of its own name.
CONFIG_NAMES = {"mode": "advantage_mode", "similarity_threshold": "anchor_similarity_threshold"}


@dataclass(frozen=True)
class EstimatorSettings:
    """Every option of :func:`~gigpo_trl.advantage.compute_gigpo_advantages` (see its Parameters for each meaning).

    Checked when built: a bad value raises ``ValueError`` (or ``TypeError`` for a wrong type) naming the setting
    and what is allowed. Numbers are stored as ``float`` / ``int``, so equal settings compare and hash equal.
    """

    gamma: float = 0.95
    step_advantage_weight: float = 1.0
    mode: str = "mean_norm"
    invalid_action_penalty: float = 0.1
    episode_stats: str = "rows"
    similarity_threshold: float | None = None
    step_grouping: str = "state"
    hierarchy_depth: int = 2
    hierarchy_alpha: float = 1.0
    hierarchy_base_group: bool = False
    step_return: str = "discounted"
    graph_normalize_distance: bool = False

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        for name, allowed in (("mode", MODES), ("episode_stats", EPISODE_STATS), ("step_grouping", STEP_GROUPINGS),
                              ("step_return", STEP_RETURNS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        put("gamma", as_scalar(self.gamma, "gamma", 0.0, 1.0))
        put("step_advantage_weight", as_scalar(self.step_advantage_weight, "step_advantage_weight"))
        put("invalid_action_penalty", as_scalar(self.invalid_action_penalty, "invalid_action_penalty"))
        if self.similarity_threshold is not None:
            threshold = as_scalar(self.similarity_threshold, "similarity_threshold")
            if not 0.0 < threshold < 1.0:
                raise ValueError(f"similarity_threshold must be in (0, 1), got {self.similarity_threshold!r}")
            put("similarity_threshold", threshold)
        depth = self.hierarchy_depth
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)):
            raise TypeError(f"hierarchy_depth must be an int >= 0, got {type(depth).__name__}")
        if depth < 0:
            raise ValueError(f"hierarchy_depth must be an int >= 0, got {depth!r}")
        put("hierarchy_depth", int(depth))
        put("hierarchy_alpha", as_scalar(self.hierarchy_alpha, "hierarchy_alpha", 0.0))
        for name in ("hierarchy_base_group", "graph_normalize_distance"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
            put(name, bool(getattr(self, name)))
        if self.step_return == "graph":
            if self.step_grouping != "state":
                raise ValueError(f"step_return='graph' uses GiGPO's step groups: step_grouping must be 'state', got "
                                 f"{self.step_grouping!r}")
            if self.similarity_threshold is not None:
                raise ValueError(f"step_return='graph' matches states exactly (its graph's nodes): "
                                 f"similarity_threshold must be None, got {self.similarity_threshold!r}")

    def replace(self, **changes: Any) -> EstimatorSettings:
        """A copy with ``changes`` (setting names), checked again. ``TypeError`` names an unknown setting."""
        unknown = sorted(set(changes) - set(self.to_dict()))
        if unknown:
            raise TypeError(f"unknown estimator setting(s) {unknown}; allowed: {sorted(self.to_dict())}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """``{setting: value}`` of plain JSON types, in field order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EstimatorSettings:
        """The settings of :meth:`to_dict`'s output; a missing setting takes its default (settings written by a
        version that did not have it). ``TypeError`` names an unknown setting."""
        return cls().replace(**values)

    @classmethod
    def config_fields(cls) -> dict[str, str]:
        """``{setting: GiGPOConfig field that sets it}``."""
        return {f.name: CONFIG_NAMES.get(f.name, f.name) for f in dataclasses.fields(cls)}


__all__ = ["CONFIG_NAMES", "EstimatorSettings"]
