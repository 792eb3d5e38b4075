"""The message rules one protocol adds to the canonical ones (docs/canonical-contract.md#messages).

The canonical rules hold for every source of messages (requests of each protocol, export records,
dataset rows). A protocol may add checks of its own API, which only reject inputs and never change
the canonical form of an accepted one (so hashes do not depend on which rules were used): Chat
Completions requires ``tool_call_id`` on tool messages and names its content-part types.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from .._errors import InvalidRequestError
from .._validate import type_name

__all__ = ["NO_RULES", "MessageRules"]


@attrs.frozen
class MessageRules:
    """Checks a protocol adds to the canonical message rules; the default adds none.

    Attributes:
        require_tool_call_id: a ``tool`` message without ``tool_call_id`` is rejected (Chat
            Completions requires it); else it is optional, as in export records.
        part_types: the content-part ``type`` values accepted, or None for any part (dataset
            rows carry internal ``image`` parts; Responses and Messages project only ``text``
            and ``image_url`` parts). A part of another type would reach the chat template,
            which shows the model nothing for it.
    """

    require_tool_call_id: bool = False
    part_types: frozenset[str] | None = None

    def check_part(self, part: Mapping[str, Any], path: str) -> None:
        """Checks one content part (an object) at ``path`` (``messages[1].content[0]``).

        Raises:
            InvalidRequestError: an empty ``text`` part (always), or, where :attr:`part_types`
                is set, a ``text`` part whose ``text`` is missing or not a string (``param`` is
                ``<path>.text``), or a missing ``type`` or one outside :attr:`part_types`
                (``param`` is ``<path>.type``).
        """
        kind = part.get("type")
        if kind == "text" and part.get("text") == "":
            raise InvalidRequestError.at(f"{path}.text", "must not be empty")
        if self.part_types is None:
            return
        if kind == "text" and not isinstance(part.get("text"), str):
            raise InvalidRequestError.at(f"{path}.text", f"must be a string, got {type_name(part.get('text'))}")
        if isinstance(kind, str) and kind in self.part_types:
            return
        if "type" not in part:
            raise InvalidRequestError.at(f"{path}.type", "is required")
        got = repr(kind) if isinstance(kind, str) else type_name(kind)
        raise InvalidRequestError.at(f"{path}.type", f"must be one of: {', '.join(sorted(self.part_types))}, "
                                                     f"got {got}")


NO_RULES: Final = MessageRules()
"""The canonical rules alone (export records, dataset rows, Responses and Messages)."""
