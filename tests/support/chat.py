"""Chat-compiler shortcuts for tests, written on the compiler's real API.

Prompt ids come straight from :meth:`ChatCompiler.render` (a subtree root) and
:meth:`ChatCompiler.render_delta` (below it). An observation's two id views take two calls in
production (:meth:`ChatCompiler.observation_ids`, then :meth:`ChatCompiler.attach_images` in a
worker thread); :func:`observation` makes them in one for tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from relaxtrio.chat.compiler import ChatCompiler, RenderedObservation


def observation(compiler: ChatCompiler, messages: Sequence[Mapping[str, Any]],
                tools: Sequence[Mapping[str, Any]] = (), template_kwargs: Mapping[str, Any] | None = None,
                *, delta: bool, message_offset: int = 0) -> RenderedObservation:
    """Both id views of an observation, as a turn builds them (images processed in-line)."""
    ids, images = compiler.observation_ids(messages, tools, template_kwargs, delta=delta,
                                           message_offset=message_offset)
    return compiler.attach_images(ids, images)
