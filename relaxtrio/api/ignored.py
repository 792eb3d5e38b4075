"""Reporting request options that do not alter generation (docs/agent-contract.md#ignored-request-fields).

The protocol parsers list them (:class:`~.options.IgnoredField`); here each one is either
refused (``--agentic-strict-request-fields``: a 400 naming the field, before anything is
generated) or reported: counted per Session in ``Session.ignored_request_fields`` (field key →
requests that sent it, read by the rollout step's metrics), and logged once per Session and field
key, as a warning when it left a tool out of the prompt, else as an info line.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..nursery.session import Session
from .options import IgnoredField

log = logging.getLogger(__name__)


def report_ignored(session: Session, ignored: Sequence[IgnoredField], *, protocol: str, strict: bool) -> None:
    """Refuses (``strict``) or counts and logs the ignored options of one request of ``session``.

    Args:
        session: the Session the request belongs to.
        ignored: the parsed request's :attr:`~.wire.ParsedRequest.ignored`.
        protocol: ``chat``, ``responses`` or ``messages`` (for the log line).
        strict: ``ApiConfig.strict_request_fields``.

    Raises:
        InvalidRequestError: ``strict`` and an option strict mode refuses (the first one);
            nothing is counted then.
    """
    if strict:
        for field in ignored:
            if field.refused_when_strict:
                raise field.error()
    counts = session.ignored_request_fields
    for field in ignored:
        if field.key not in counts:
            level = logging.WARNING if field.dropped else logging.INFO
            strict_note = "; --agentic-strict-request-fields refuses it" if field.refused_when_strict else ""
            log.log(level, "session %s: %s request field %s is ignored (it does not alter generation; "
                    "counted in ignored_request_fields%s): %s",
                    session.session_id, protocol, field.param, strict_note, field.message)
        counts[field.key] = counts.get(field.key, 0) + 1
