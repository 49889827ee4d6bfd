"""Recognise the kind of an ``env=`` value and wrap foreign environment APIs, in this one place.

Three kinds, told apart by their methods (duck typing: no import of TRL's or OpenEnv's classes):

- ``"protocol"``: ours (``gigpo_trl/envs/base.py``): a :class:`TextEnv` subclass, or any class with ``reset`` and
  ``step`` that is not an OpenEnv environment. Used as is.
- ``"openenv"``: an OpenEnv ``Environment``: ``reset`` has an ``episode_id`` parameter, or a class of its MRO comes
  from an ``openenv`` module. Wrapped in :class:`~gigpo_trl.envs.openenv.OpenEnvEnv`.
- ``"trl"``: a TRL ``environment_factory`` environment: ``reset`` and no ``step`` (its public methods are tools).
  Wrapped in :class:`~gigpo_trl.envs.trl_tools.TRLToolEnv`. A TRL environment with a tool named ``step`` looks like
  ours: wrap it explicitly, ``env=TRLToolEnv(MyEnv)``.

A class (or a ``functools.partial`` of one) is classified without being instantiated; any other callable is called
once to look at what it builds (that probe instance is then discarded). :func:`resolve_envs` turns the trainer's
whole ``env=`` value (a registered name, a class, a factory, or a dict of them) into named factories.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from .base import TextEnv
from .openenv import OpenEnvEnv
from .registry import get_env_class
from .trl_tools import TRLToolEnv

ADAPTERS = (TRLToolEnv, OpenEnvEnv)
#: The name of the environment when ``env=`` is a single one rather than a dict.
DEFAULT_ENV_KEY = "default"


def env_kind(cls: type) -> str:
    """``"protocol"``, ``"openenv"`` or ``"trl"`` for an environment class (see the module doc).

    Raises:
        TypeError: ``cls`` has no callable ``reset``.
    """
    if issubclass(cls, TextEnv):
        return "protocol"
    if not callable(getattr(cls, "reset", None)):
        raise TypeError(
            f"{cls.__name__} has no reset method: an environment is our protocol (reset(task, seed) and step(action)), "
            "a TRL environment_factory class (reset(**row) and tool methods) or an OpenEnv Environment"
        )
    if not callable(getattr(cls, "step", None)):
        return "trl"
    if any((getattr(base, "__module__", "") or "").split(".")[0] == "openenv" for base in cls.__mro__):
        return "openenv"
    try:
        if "episode_id" in inspect.signature(cls.reset).parameters:
            return "openenv"
    except (TypeError, ValueError):
        pass
    return "protocol"


def as_env_factory(env: Callable[[], Any]) -> Callable[[], Any]:
    """A zero-argument factory of protocol environments for ``env`` (a class or a factory of any of the three kinds).
    Protocol factories and adapter instances (which are their own factories) come back unchanged.

    Raises:
        TypeError: ``env`` is not callable, or what it builds has no ``reset``.
    """
    if isinstance(env, ADAPTERS):
        return env
    if not callable(env):
        raise TypeError(f"env must be an environment class or a zero-argument factory, got {type(env).__name__}")
    target = env.func if isinstance(env, functools.partial) else env
    if isinstance(target, type):
        kind = env_kind(target)
    else:
        probe = env()
        kind = env_kind(type(probe))
        if kind == "protocol" and callable(getattr(probe, "close", None)):
            probe.close()  # (a TRL env's close would be a tool: never called)
    if kind == "trl":
        return TRLToolEnv(env)
    if kind == "openenv":
        return OpenEnvEnv(env)
    return env


def as_env(env: Any) -> Any:
    """A protocol environment instance for ``env``: an instance of any kind, or a class/factory (instantiated)."""
    if isinstance(env, TextEnv):
        return env
    if isinstance(env, type) or isinstance(env, functools.partial) or not callable(getattr(env, "reset", None)):
        return as_env_factory(env)()
    kind = env_kind(type(env))
    if kind == "trl":
        return TRLToolEnv(lambda: env)
    if kind == "openenv":
        return OpenEnvEnv(lambda: env)
    return env


def resolve_envs(env: Any) -> dict[str, Callable[[], Any]]:
    """``env`` as ``{name: zero-argument factory}``; accepts a class, a factory, a registered name, or a dict.

    Raises ``ValueError`` for ``None`` or an empty dict, ``TypeError`` for something not callable (after a
    registered name is looked up with :func:`gigpo_trl.envs.get_env_class`, which raises for an unknown name)."""
    if env is None:
        raise ValueError("GiGPOTrainer needs env=: an environment class, a factory, a registered name or a dict")
    if isinstance(env, Mapping):
        if not env:
            raise ValueError("env= is an empty dict; give at least one environment")
        return {str(name): resolve_envs(factory)[DEFAULT_ENV_KEY] for name, factory in env.items()}
    if isinstance(env, str):
        env = get_env_class(env)
    if not callable(env):
        raise TypeError(f"env must be an environment class or a zero-argument factory, got {type(env).__name__}")
    return {DEFAULT_ENV_KEY: as_env_factory(env)}  # TRL / OpenEnv environments get their adapter


__all__ = ["ADAPTERS", "DEFAULT_ENV_KEY", "as_env", "as_env_factory", "env_kind", "resolve_envs"]
