"""gigpo_trl: Group-in-Group Policy Optimization (arXiv 2505.10978) for multi-turn LLM agents on TRL."""

__version__ = "0.1.0"

from .advantage import AdvantageResult, compute_gigpo_advantages  # noqa: E402

__all__ = ["AdvantageResult", "compute_gigpo_advantages", "__version__"]
