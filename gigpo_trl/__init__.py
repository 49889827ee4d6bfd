"""gigpo_trl: Group-in-Group Policy Optimization (arXiv 2505.10978) for multi-turn LLM agents on TRL.

``compute_gigpo_advantages`` imports only numpy/torch; ``GiGPOConfig`` and ``GiGPOTrainer`` (which import TRL)
load on first access, so environment worker processes stay light.
"""

__version__ = "0.1.0"

from .advantage import AdvantageResult, compute_gigpo_advantages  # noqa: E402

_LAZY = {
    "GiGPOConfig": "gigpo_trl.config",
    "GiGPOTrainer": "gigpo_trl.trainer",
    "RolloutCollector": "gigpo_trl.rollout",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gigpo_trl' has no attribute {name!r}")


__all__ = ["AdvantageResult", "GiGPOConfig", "GiGPOTrainer", "RolloutCollector", "compute_gigpo_advantages",
           "__version__"]
