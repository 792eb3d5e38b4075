"""User hooks loaded by dotted path: reward models, dynamic filters, custom advantage.

Every hook has two accepted signatures, relaxtrio's and Relax's (whose first parameter is the
parsed command line, ``args``), and may be a plain function (run in a worker thread, so a slow
one never blocks the trio loop) or an ``async def`` (awaited):

=====================  ===============================  ==========================
hook                   relaxtrio                        Relax
=====================  ===============================  ==========================
reward model           ``fn(sample)``                   ``fn(args, sample)``
group reward model     ``fn(samples)``                  ``fn(args, samples)``
dynamic filter         ``fn(samples, rewards)``         ``fn(args, samples)``
custom advantage       ``fn(metadata_by_slot)``         ``fn(args, metadata_by_slot)``
=====================  ===============================  ==========================

A two-parameter dynamic filter is Relax-shaped when its first parameter is named ``args``.
:func:`load_hook` refuses any other signature at start-up (:class:`ConfigError` naming the flag
and both shapes). A hook that raises, or answers in the wrong shape, fails only its Group:
:class:`HookError`, whose message (the Group's drop reason) starts with ``<hook> hook failed:``
(:func:`hook_failure_kind` reads it back for the step's metrics).

* ``--custom-rm-path pkg.mod.fn``: ``fn(sample) -> float`` scores a sample whose agent wrote no
  reward.
* ``--agentic-custom-advantage-path pkg.mod.fn``: ``fn(metadata_by_slot) -> list | None`` gives one
  base credit per exported context when a Session exports several contexts (multi-agent). Input:
  one ``{context name: export metadata}`` mapping per Session, in sample order (implicit export
  uses the name None). Output: the same outer order and names with one finite number each, or None
  to filter the whole Group. This bypasses GRPO normalization: normalize inside the function.
  The output is validated, and every violation names the Session index and context name
  (docs/export-and-credit.md#custom-advantage).
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

import trio

from .._errors import ConfigError, ExportError
from .._validate import is_real

CustomAdvantage = Callable[[list[dict[str | None, dict[str, Any]]]], Any]

HookKind = Literal["reward", "group_reward", "dynamic_filter", "custom_advantage"]
"""Which hook: the per-sample reward model, the group reward model (``--group-rm``), the dynamic
sampling filter, the custom advantage function."""

HookStyle = Literal["relaxtrio", "relax"]

HOOK_SHAPES: Final[dict[HookKind, tuple[str, str]]] = {
    "reward": ("fn(sample)", "fn(args, sample)"),
    "group_reward": ("fn(samples)", "fn(args, samples)"),
    "dynamic_filter": ("fn(samples, rewards)", "fn(args, samples)"),
    "custom_advantage": ("fn(metadata_by_slot)", "fn(args, metadata_by_slot)"),
}
"""Per hook kind, its relaxtrio and its Relax signature."""

_FAILURE = re.compile(r"^(reward|group_reward|dynamic_filter|custom_advantage) hook failed: ")


class HookError(ExportError):
    """A user hook raised, or answered in the wrong shape: its Group is dropped, the run goes on.

    Attributes:
        kind: the hook.
    """

    def __init__(self, kind: HookKind, message: str):
        super().__init__(f"{kind} hook failed: {message}")
        self.kind = kind


def hook_failure_kind(reason: str | None) -> HookKind | None:
    """The hook whose failure a Group's drop reason records (a :class:`HookError` message), or
    None when the Group was dropped for another reason."""
    match = _FAILURE.match(reason or "")
    return None if match is None else match.group(1)  # type: ignore[return-value]


def hook_style(fn: Callable[..., Any], kind: HookKind, *, flag: str) -> HookStyle:
    """Which of the two accepted signatures ``fn`` has (see the module table).

    Raises:
        ConfigError: neither: the message names the flag, the function's signature and both
            accepted shapes.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without introspection: trust relaxtrio's shape
        return "relaxtrio"
    params = list(signature.parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    first = params[0].name if params and params[0].kind in positional else None
    ours, theirs = HOOK_SHAPES[kind]
    fits = {n: _binds(signature, n) for n in (1, 2)}
    relax_arity, our_arity = 2, (2 if kind == "dynamic_filter" else 1)
    if first == "args" and fits[relax_arity]:
        return "relax"
    if fits[our_arity]:
        return "relaxtrio"
    if fits[relax_arity]:
        return "relax"
    name = getattr(fn, "__qualname__", repr(fn))
    raise ConfigError(f"{flag}: {name}{signature} does not fit the {kind.replace('_', ' ')} hook; "
                      f"expected {ours} or {theirs} (Relax), sync or async", param=flag)


def _binds(signature: inspect.Signature, n: int) -> bool:
    try:
        signature.bind(*range(n))
    except TypeError:
        return False
    return True


def load_hook(path: str, *, flag: str, kind: HookKind) -> Callable[..., Any]:
    """:func:`load_function`, then the signature check of :func:`hook_style`.

    Raises:
        ConfigError: the path does not name a callable, or its signature fits neither shape.
    """
    fn = load_function(path, flag=flag)
    hook_style(fn, kind, flag=flag)
    return fn


def hook_arguments(fn: Callable[..., Any], kind: HookKind, values: tuple[Any, ...],
                   hook_args: Any) -> tuple[Any, ...]:
    """The positional arguments of one call: ``values`` (relaxtrio's shape), or ``hook_args``
    and the first value (Relax's shape; a Relax filter gets no rewards)."""
    if hook_style(fn, kind, flag=kind) == "relax":
        return (hook_args, values[0])
    return values


def is_async_hook(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` (a function, or an object with an async ``__call__``) is an ``async def``."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


async def call_hook(fn: Callable[..., Any], kind: HookKind, *values: Any, hook_args: Any = None) -> Any:
    """Calls a hook in whichever shape it has: awaited when async, else in a worker thread
    (awaiting what it returns, if awaitable).

    Args:
        fn: the user's function.
        kind: which hook (decides the shapes).
        *values: relaxtrio's arguments.
        hook_args: ``args`` of a Relax-shaped hook (the parsed command line).

    Raises:
        HookError: the hook raised (the exception's type and message in the reason).

    Cancellation:
        A checkpoint; a sync hook already running finishes in its thread (result discarded).
    """
    try:
        arguments = hook_arguments(fn, kind, values, hook_args)
        if is_async_hook(fn):
            return await fn(*arguments)
        result = await trio.to_thread.run_sync(functools.partial(fn, *arguments))
        if inspect.isawaitable(result):
            result = await result
        return result
    except Exception as exc:  # the user's hook: its bug drops this Group, not the run
        raise HookError(kind, f"{type(exc).__name__}: {exc}") from exc


def load_function(path: str, *, flag: str) -> Callable[..., Any]:
    """Imports ``pkg.module.function`` (or ``pkg.module:function``).

    Raises:
        ConfigError: malformed path, missing module or attribute, or not callable.
    """
    module_name, sep, attr = path.replace(":", ".").rpartition(".")
    if not sep or not module_name or not attr:
        raise ConfigError.at(flag, f"must look like package.module.function, got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{flag}: cannot import {module_name!r}: {exc}", param=flag) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{flag}: {path!r} is not a callable", param=flag)
    return fn


async def custom_advantages(
    fn: CustomAdvantage, exports: Sequence[Sequence[tuple[str | None, Mapping[str, Any]]]],
    *, hook_args: Any = None,
) -> list[list[float]] | None:
    """Calls a custom advantage function (:func:`call_hook`) and validates its answer.

    Args:
        fn: the user's function.
        exports: per Session (sample order), ``(context name, export metadata)`` per exported
            context, in export order.
        hook_args: ``args`` of a Relax-shaped function.

    Returns:
        Per Session, one credit per exported context (export order); None when the function
        filtered the Group.

    Raises:
        HookError: the function raised; wrong outer length, a missing name, or a value that is
            not a finite number (the message names the Session index and context name).
    """
    inputs = [{name: copy.deepcopy(dict(meta)) for name, meta in session} for session in exports]
    out = await call_hook(fn, "custom_advantage", inputs, hook_args=hook_args)
    if out is None:
        return None
    if not isinstance(out, list) or len(out) != len(exports):
        got = f"{type(out).__name__}{'' if not isinstance(out, list) else f' of {len(out)}'}"
        raise HookError("custom_advantage", f"custom advantage must return a list of {len(exports)} "
                        f"mappings (one per session), got {got}")
    credits: list[list[float]] = []
    for index, (session, mapping) in enumerate(zip(exports, out, strict=True)):
        if not isinstance(mapping, Mapping):
            raise HookError("custom_advantage", f"custom advantage for session {index} must be a "
                            f"mapping, got {type(mapping).__name__}")
        row = []
        for name, _ in session:
            if name not in mapping:
                raise HookError("custom_advantage", f"custom advantage for session {index} has no "
                                f"value for context {name!r}")
            value = mapping[name]
            if not is_real(value):
                raise HookError("custom_advantage", f"custom advantage for session {index} context "
                                f"{name!r} must be a finite number, got {value!r}")
            row.append(float(value))
        credits.append(row)
    return credits
