"""The reward registry: reward functions looked up by name.

An RLJob names its reward (``math`` by default); the verifier service resolves that name with
:func:`get_reward` per request, and users add their own with the :func:`register_reward`
decorator in a module that is imported before the verifier starts. Built-in rewards live in
modules listed in :data:`BUILTIN_MODULES`; they are imported on first lookup, so
``get_reward("math")`` works no matter which module of this package was imported first.

A reward function has the signature of :class:`RewardFn`::

    @register_reward("exact")
    def exact(answer: str, gold: str, *, format_weight: float = 0.0) -> RewardResult: ...
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

from longtail_workers.rewards.result import RewardResult

BUILTIN_MODULES = ("longtail_workers.rewards.math_reward",)
"""Modules whose import registers the built-in rewards."""

_NAME = re.compile(r"[a-z][a-z0-9_.:-]{0,63}")  # the RLJob schema's dataset.reward pattern


class RewardFn(Protocol):
    """Scores one model answer against one gold answer. Must not raise on any ``str`` input."""

    def __call__(self, answer: str, gold: str, *, format_weight: float = 0.0) -> RewardResult: ...


F = TypeVar("F", bound=RewardFn)


class UnknownRewardError(KeyError):
    """``get_reward`` was asked for a name nobody registered. Lists the names that exist."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(name)
        self.name = name
        self.known = known
        self.message = (
            f"unknown reward {name!r}; known rewards: {', '.join(known) or '(none)'} "
            f"(pick one of those, or register yours with @register_reward({name!r}) in a module "
            f"that the verifier imports: --reward-module MODULE)"
        )

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the key, hiding the message.
        return self.message


_registry: dict[str, RewardFn] = {}
_lock = threading.Lock()
_builtins_loaded = False


def register_reward(name: str, *, replace: bool = False) -> Callable[[F], F]:
    """Decorator: register the decorated function as reward ``name`` and return it unchanged.

    Names are lowercase (``[a-z][a-z0-9_.:-]*``, the RLJob schema's pattern for
    ``dataset.reward``; at most 64 characters). Registering a name twice raises ``ValueError``
    unless ``replace=True``, so two plugins cannot silently shadow each other.
    """
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise ValueError(
            f"reward name: must match [a-z][a-z0-9_.:-]* (at most 64 characters), got {name!r} "
            f"(use a lowercase name such as 'math' or 'my_task.exact')"
        )

    def decorator(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"register_reward({name!r}): expected a function, got {fn!r:.60}")
        with _lock:
            existing = _registry.get(name)
            if existing is not None and existing is not fn and not replace:
                raise ValueError(
                    f"reward {name!r} is already registered to {_describe(existing)} "
                    f"(pick another name, or pass replace=True to override it on purpose)"
                )
            _registry[name] = fn
        return fn

    return decorator


def unregister_reward(name: str) -> None:
    """Remove reward ``name``; raises :class:`UnknownRewardError` if it is not registered."""
    _load_builtins()
    with _lock:
        if name not in _registry:
            raise UnknownRewardError(name, sorted(_registry))
        del _registry[name]


def get_reward(name: str) -> RewardFn:
    """The reward function registered as ``name``; :class:`UnknownRewardError` if none is."""
    _load_builtins()
    with _lock:
        fn = _registry.get(name)
        if fn is None:
            raise UnknownRewardError(name, sorted(_registry))
        return fn


def known_rewards() -> list[str]:
    """Sorted names of every registered reward, built-ins included."""
    _load_builtins()
    with _lock:
        return sorted(_registry)


def _load_builtins() -> None:
    # Imported lazily: the built-in modules import this one to register themselves.
    global _builtins_loaded
    if _builtins_loaded:
        return
    for module in BUILTIN_MODULES:
        importlib.import_module(module)
    _builtins_loaded = True


def _describe(fn: object) -> str:
    module = getattr(fn, "__module__", "?")
    qualname = getattr(fn, "__qualname__", repr(fn))
    return f"{module}.{qualname}"
