"""User hooks loaded by dotted path: a custom reward model and a custom advantage function.

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
import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._errors import ConfigError, ExportError
from .._validate import is_real

CustomAdvantage = Callable[[list[dict[str | None, dict[str, Any]]]], Any]


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


def custom_advantages(
    fn: CustomAdvantage, exports: Sequence[Sequence[tuple[str | None, Mapping[str, Any]]]]
) -> list[list[float]] | None:
    """Calls a custom advantage function and validates its answer.

    Args:
        fn: the user's function.
        exports: per Session (sample order), ``(context name, export metadata)`` per exported
            context, in export order.

    Returns:
        Per Session, one credit per exported context (export order); None when the function
        filtered the Group.

    Raises:
        ExportError: wrong outer length, a missing name, or a value that is not a finite number
            (the message names the Session index and context name).
    """
    inputs = [{name: copy.deepcopy(dict(meta)) for name, meta in session} for session in exports]
    out = fn(inputs)
    if out is None:
        return None
    if not isinstance(out, list) or len(out) != len(exports):
        raise ExportError(
            f"custom advantage must return a list of {len(exports)} mappings (one per session), "
            f"got {type(out).__name__}{'' if not isinstance(out, list) else f' of {len(out)}'}"
        )
    credits: list[list[float]] = []
    for index, (session, mapping) in enumerate(zip(exports, out, strict=True)):
        if not isinstance(mapping, Mapping):
            raise ExportError(f"custom advantage for session {index} must be a mapping, "
                              f"got {type(mapping).__name__}")
        row = []
        for name, _ in session:
            if name not in mapping:
                raise ExportError(f"custom advantage for session {index} has no value for "
                                  f"context {name!r}")
            value = mapping[name]
            if not is_real(value):
                raise ExportError(f"custom advantage for session {index} context {name!r} must be "
                                  f"a finite number, got {value!r}")
            row.append(float(value))
        credits.append(row)
    return credits
