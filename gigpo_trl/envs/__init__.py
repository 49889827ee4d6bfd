"""Text environments and the environment pool.

Built-in environments are imported lazily (ALFWorld needs the optional ``alfworld`` package).
``make_env("webshop", split="train")`` builds one by name, ``make_env("webshop", protocol="verl-agent")`` the GiGPO
paper's version; :mod:`gigpo_trl.envs.registry` maps ``(protocol, name)`` to import paths.
"""

from __future__ import annotations

from .adapters import as_env_factory, env_kind
from .base import DEFAULT_PROMPT_TEMPLATE, DEFAULT_SYSTEM_PROMPT, ParsedAction, TextEnv, env_anchor
from .checker import check_env
from .openenv import OpenEnvEnv
from .registry import ENV_CLASSES, ENV_REGISTRY, PROTOCOLS, check_protocol, get_env_class, make_env
from .trl_tools import TRLToolEnv

__all__ = [
    "DEFAULT_PROMPT_TEMPLATE",
    "DEFAULT_SYSTEM_PROMPT",
    "ENV_CLASSES",
    "ENV_REGISTRY",
    "OpenEnvEnv",
    "PROTOCOLS",
    "ParsedAction",
    "TRLToolEnv",
    "TextEnv",
    "as_env_factory",
    "check_env",
    "check_protocol",
    "env_anchor",
    "env_kind",
    "get_env_class",
    "make_env",
]
