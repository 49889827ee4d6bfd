"""PPO's critic (``estimator="ppo"``): a value function trained beside the policy, GAE advantages from its values.

- :mod:`.fields`: the configuration fields (``gae_level``, ``lam``, ``vf_coef``, ``cliprange_value``,
  ``critic_learning_rate``, ``critic_model_name_or_path``), inherited by ``GiGPOConfig``;
- :mod:`.model`: :class:`Critic`, a value head on a second LoRA adapter of the policy's base model (or on a model of
  its own), its forwards (packed for the token budget, sharing prefixes and chains as the policy's do), its save / load;
- :mod:`.loss`: the clipped value loss;
- :mod:`.mixin`: :class:`CriticMixin`, the trainer's hooks (values → GAE → advantages, the critic's backward and
  optimizer step, checkpoints).

GAE itself is numpy in :mod:`gigpo_trl.advantage.gae`. This package imports ``trl_compat``, ``advantage`` and
``forward`` only.
"""

from .fields import GAE_LEVELS, CriticFields
from .loss import clipped_value_loss
from .mixin import CriticMixin, critic_refusal
from .model import CRITIC_NAME, Critic

__all__ = ["CRITIC_NAME", "GAE_LEVELS", "Critic", "CriticFields", "CriticMixin",
           "clipped_value_loss", "critic_refusal"]
