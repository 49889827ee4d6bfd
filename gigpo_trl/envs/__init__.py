"""Text environments and the environment pool.

Built-in environments are imported lazily (ALFWorld needs the optional ``alfworld`` package).
``make_env("webshop", split="train")`` builds one by name; ``ENV_CLASSES`` maps names to import paths.
"""

from __future__ import annotations

import importlib

from .adapters import as_env_factory, env_kind
from .base import DEFAULT_PROMPT_TEMPLATE, DEFAULT_SYSTEM_PROMPT, TextEnv, check_env, env_anchor
from .openenv import OpenEnvEnv
from .trl_tools import TRLToolEnv

ENV_CLASSES = {
    "webshop": "gigpo_trl.envs.webshop:WebShopEnv",
    "alfworld": "gigpo_trl.envs.alfworld:ALFWorldEnv",
    "frozenlake": "gigpo_trl.envs.frozenlake:FrozenLakeEnv",
    "sokoban": "gigpo_trl.envs.sokoban:SokobanEnv",
    "corridor": "gigpo_trl.envs.corridor:CorridorEnv",
}


def get_env_class(name: str):
    """Return the environment class registered as ``name``; raises ``ValueError`` for an unknown name."""
    if name not in ENV_CLASSES:
        raise ValueError(f"unknown environment {name!r}; choose one of {sorted(ENV_CLASSES)}")
    module, attr = ENV_CLASSES[name].split(":")
    return getattr(importlib.import_module(module), attr)


def make_env(name: str, **kwargs):
    """Instantiate the environment registered as ``name`` with ``kwargs``."""
    return get_env_class(name)(**kwargs)


__all__ = [
    "DEFAULT_PROMPT_TEMPLATE",
    "DEFAULT_SYSTEM_PROMPT",
    "ENV_CLASSES",
    "OpenEnvEnv",
    "TRLToolEnv",
    "TextEnv",
    "as_env_factory",
    "check_env",
    "env_anchor",
    "env_kind",
    "get_env_class",
    "make_env",
]
