"""Chat-template compiler: canonical messages → prompt token ids.

relaxtrio is token-in/token-out: sampled ids are stored and reused exactly, and only new
observations are rendered (docs/canonical-contract.md#rendering-observations). Two renders exist:

* **full render** at a subtree root: ``apply_chat_template(messages, tools,
  tokenize=False, add_generation_prompt=True, **template_kwargs)`` then
  ``encode(text, add_special_tokens=False)``, so a template that writes BOS itself yields exactly one
  BOS (docs/client-quirks.md#double-bos);
* **observation delta** below a subtree root: render the fixed
  ``DUMMY_PREFIX`` (system + user) without a generation prompt, drop one trailing ``"\\n"``,
  tokenize → ``trim`` ids; render ``DUMMY_PREFIX + delta`` with the generation prompt, tokenize, and
  drop the first ``len(trim)`` ids. The dropped ids are checked to equal ``trim``; a template that
  changes the dummy prefix when more messages follow (e.g. one that moves the tool list before the
  last user message) raises :class:`~relaxtrio.InternalError` instead of producing wrong ids. The
  delta therefore starts with whatever the template writes after the previous turn's end-of-turn
  token (``"\\n<|im_start|>user..."`` for ChatML: docs/client-quirks.md#turn-separator-in-a-delta),
  and consecutive tool results are rendered the way the template groups them
  (docs/client-quirks.md#grouped-tool-results). A delta leaves out a leading id equal to the stop
  id the lineage ends with (docs/client-quirks.md#a-stop-token-that-opens-the-next-message), and
  tool results the template refuses after the dummy prefix alone are rendered after it plus the
  assistant message they answer (docs/client-quirks.md#tool-results-named-after-their-call).

Both renders call the compiled template and the Rust tokenizer through :mod:`._fast_render`
(what ``apply_chat_template`` and ``encode`` compute, without their per-call input handling), a
delta whose dummy text ends with an added token tokenizes only the text after it, and a byte-level
BPE tokenizer's ids are assembled from remembered ids of space-separated chunks
(:mod:`._chunked_encode`: exactly ``encode``'s ids, computed only for chunks not seen recently).

Rendering inputs (docs/client-quirks.md#tool-call-arguments-mapping-or-string): canonical assistant
tool calls hold arguments as compact JSON strings; the compiler decodes them to mappings for
rendering, unless a probe at construction shows the template needs strings (it concatenates them, or
prints a mapping as a Python repr). Empty ``tool_calls`` lists are dropped (Llama 3.1 rejects an
empty list), and an empty tools list is passed as ``None`` by default, because templates such as
Llama 3.1 test ``tools is not none`` and would otherwise announce tools to a tool-less conversation
(this is what an OpenAI-compatible server's chat path does; ``pass_empty_tools=True`` passes a
literal ``[]``; see docs/client-quirks.md#empty-tools-lists).

Stop ids and the end of an assistant turn: :attr:`ChatCompiler.stop_token_ids` is the tokenizer's
EOS plus every known end-of-turn marker that is an added token and appears in the template text
(plus ``extra_stop_token_ids``, e.g. a model's ``generation_config`` EOS list).
:attr:`ChatCompiler.turn_closed_by_stop_token` says whether the template ends an assistant turn
with one of those ids; when it does, lineage = generated ids including the sampled EOS + the next
observation delta, with no re-rendering of the assistant turn. A generation stopped by a stop
*string* or by length has no end-of-turn id, and none is inserted
(docs/client-quirks.md#turns-ended-by-a-stop-string).

Images (docs/canonical-contract.md#images): :meth:`ChatCompiler.observation_ids` and
:meth:`ChatCompiler.attach_images` render an observation into two id views. The **rollout ids**
are the tokenizer ids of the template text, with one image placeholder per ``image_url`` part
(what an SGLang server takes next to ``image_data``); the **training ids** expand each placeholder to the image's feature count and
come with the processor's training inputs (:class:`~relaxtrio.media.vision.MultimodalPayload`).
The dummy prefix has no images, so trimming it from the rollout ids and then expanding equals
expanding the whole render and trimming the same number of ids: both views get the same trim.
A text observation has identical views and no payload.

Thread safety: a ChatCompiler holds no per-call state, so calls may run in worker threads
(``trio.to_thread.run_sync``); the dummy-prefix cache is guarded by a lock.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import jinja2

from .._errors import InternalError, InvalidRequestError
from ..media.images import ImagePart, image_parts
from ..media.vision import RenderedObservation, VisionProcessor
from . import _template_inputs as _inputs
from ._chunked_encode import ChunkedEncoder
from ._fast_render import TemplateRenderer, fast_decode
from ._template_inputs import RESERVED_TEMPLATE_KWARGS, TURN_END_MARKERS, ArgumentsForm
from ._template_probe import probe_arguments_form, probe_turn_end
from .parsers.tool_calls import resolve_tool_call_parser

__all__ = [
    "DUMMY_PREFIX",
    "RESERVED_TEMPLATE_KWARGS",
    "TURN_END_MARKERS",
    "ChatCompiler",
    "EncodedPrompt",
    "RenderedObservation",
]

logger = logging.getLogger(__name__)

DUMMY_PREFIX: Final[tuple[Mapping[str, str], ...]] = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "I am a user."},
)
"""The fixed conversation an observation delta is rendered after
(docs/canonical-contract.md#rendering-observations)."""

THINK_OPEN: Final[str] = "<think>"
_TRIM_CACHE_SIZE: Final[int] = 64


@attrs.frozen
class EncodedPrompt:
    """Token ids of one render plus how long it took.

    Attributes:
        token_ids: the prompt ids (``(T,)`` ints); for a delta, only the ids after the dummy prefix.
        text: the rendered text the ids were encoded from (for a delta, the full dummy render).
        apply_chat_template_s: seconds spent rendering the template (wall clock, ``perf_counter``).
        tokenizer_encode_s: seconds spent tokenizing.
        total_s: seconds for the whole call, including the dummy-prefix render when not cached.
    """

    token_ids: tuple[int, ...] = attrs.field(converter=tuple)
    text: str
    apply_chat_template_s: float
    tokenizer_encode_s: float
    total_s: float


class ChatCompiler:
    """Renders canonical conversations with a Hugging Face tokenizer's chat template.

    Args:
        tokenizer: a transformers tokenizer with a chat template (``apply_chat_template``,
            ``encode``, ``decode``, ``eos_token_id``, ``get_added_vocab``).
        extra_stop_token_ids: more ids that end generation (e.g. ``generation_config.eos_token_id``).
        pass_empty_tools: pass ``tools=[]`` rather than ``None`` when a subtree has no tools.
        vision: the model's vision processor, or None for a text-only model (whose observations
            may then hold no images).

    Construction renders two small probe conversations to learn the template's tool-argument form
    and how it ends an assistant turn; a template that cannot render them still works for plain
    text, with mapping arguments and ``turn_closed_by_stop_token`` False.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        extra_stop_token_ids: Sequence[int] = (),
        pass_empty_tools: bool = False,
        vision: VisionProcessor | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self.vision = vision
        """The vision processor of a VLM, or None."""
        self._pass_empty_tools = pass_empty_tools
        self._reserved_kwargs = _inputs.reserved_kwargs(tokenizer)
        self._trim_cache: dict[str, _Trim] = {}
        self._renderer = TemplateRenderer(tokenizer)
        self._encoder = ChunkedEncoder(tokenizer)
        self._trim_lock = threading.Lock()
        self._reasoning_key = _inputs.reasoning_key(self.chat_template_text)
        self.stop_token_ids: tuple[int, ...] = _inputs.stop_token_ids(tokenizer, extra_stop_token_ids)
        """Ids that end a generation: EOS, template end-of-turn markers, extras (sorted, unique)."""
        self.arguments_form: ArgumentsForm = probe_arguments_form(self._render_text, DUMMY_PREFIX)
        """How tool-call arguments are handed to the template: ``"mapping"`` or ``"string"``."""
        self.turn_end_token_id: int | None = probe_turn_end(
            self._render_text, self._encode, DUMMY_PREFIX, self.stop_token_ids
        )
        """The stop id the template writes right after an assistant message, or None."""

    @classmethod
    def from_pretrained(cls, model_dir: Any, **kwargs: Any) -> ChatCompiler:
        """The compiler of a model directory: its tokenizer, plus its vision processor for a VLM.

        Args:
            model_dir: a Hugging Face model directory (local).
            **kwargs: :class:`ChatCompiler` keyword arguments.
        """
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        kwargs.setdefault("vision", VisionProcessor.from_pretrained(model_dir))
        return cls(tokenizer, **kwargs)

    @property
    def tokenizer(self) -> Any:
        """The wrapped tokenizer."""
        return self._tokenizer

    @property
    def chat_template_text(self) -> str:
        """The tokenizer's chat template source (named templates joined by newlines), or ""."""
        return _inputs.template_text(self._tokenizer)

    def resolve_tool_call_parser(self, parser: str | None) -> str | None:
        """``parser``, or for ``auto`` the parser this chat template's markers name.

        Raises:
            ValueError: unknown name; ``auto`` with a template that names no format or several.
        """
        return resolve_tool_call_parser(parser, self.chat_template_text)

    @property
    def turn_closed_by_stop_token(self) -> bool:
        """True when the template closes an assistant turn with a stop id the model samples."""
        return self.turn_end_token_id is not None

    # ------------------------------------------------------------------ public renders

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] = (),
        template_kwargs: Mapping[str, Any] | None = None,
        *,
        add_generation_prompt: bool = True,
        message_offset: int = 0,
    ) -> EncodedPrompt:
        """Renders and tokenizes a whole conversation.

        Args:
            messages: canonical messages (not mutated).
            tools: canonical function tools of the subtree.
            template_kwargs: extra template variables (e.g. ``{"enable_thinking": False}``).
            add_generation_prompt: append the assistant header the model continues from.
            message_offset: index of ``messages[0]`` in the request, for error paths.

        Returns:
            The ids (``encode(text, add_special_tokens=False)``) and timings.

        Raises:
            InvalidRequestError: bad template kwargs (param ``chat_template_kwargs.<key>``), tool-call
                arguments that are not a JSON object (param ``messages[i].tool_calls[j].function.arguments``),
                or messages the template refuses to render (param ``messages``).
        """
        start = time.perf_counter()
        kwargs = self._checked_kwargs(template_kwargs)
        prepared = _inputs.template_messages(messages, self.arguments_form, message_offset, self._reasoning_key)
        text, render_s = self._render_text(prepared, tools, kwargs, add_generation_prompt)
        ids, encode_s = self._encode(text)
        return EncodedPrompt(ids, text, render_s, encode_s, time.perf_counter() - start)

    def render_delta(
        self,
        delta_messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] = (),
        template_kwargs: Mapping[str, Any] | None = None,
        *,
        message_offset: int = 0,
        previous: Mapping[str, Any] | None = None,
        sampled_stop_id: int | None = None,
    ) -> EncodedPrompt:
        """Renders an observation delta with the dummy-prefix method.

        See docs/canonical-contract.md#rendering-observations.

        Args:
            delta_messages: the new (unmatched) canonical messages; must not be empty.
            tools: the subtree root's tools.
            template_kwargs: the subtree root's template kwargs.
            message_offset: index of ``delta_messages[0]`` in the request, for error paths.
            previous: the canonical assistant message the delta follows, or None. A delta that
                starts with tool results and that the template refuses after the dummy prefix
                alone (gpt-oss names a result after the call it answers) is rendered after the
                dummy prefix plus ``previous``, and that longer prefix is trimmed.
            sampled_stop_id: the stop id the lineage ends with (sampled by the model and left out
                of its message), or None. A delta that starts with this id leaves it out: the model
                stopped by sampling the next message's header, which the lineage already holds
                (GLM's ``<|observation|>``).

        Returns:
            The ids after the dummy prefix, ending with the generation prompt.

        Raises:
            InvalidRequestError: as :meth:`render`.
            InternalError: the delta is empty, or the template renders the dummy prefix differently
                when messages follow it (the template is not prefix-stable there).
        """
        if not delta_messages:
            raise InternalError("an observation delta needs at least one message")
        start = time.perf_counter()
        kwargs = self._checked_kwargs(template_kwargs)
        prepared = _inputs.template_messages(delta_messages, self.arguments_form, message_offset, self._reasoning_key)
        try:
            delta, text, render_s, encode_s = self._delta_after(
                DUMMY_PREFIX, self._dummy_trim(tools, kwargs), prepared, tools, kwargs
            )
        except InvalidRequestError as refused:
            if previous is None or delta_messages[0].get("role") != "tool":
                raise
            delta, text, render_s, encode_s = self._delta_after_call(
                previous, prepared, tools, kwargs, message_offset, refused
            )
        if sampled_stop_id is not None and len(delta) > 1 and delta[0] == sampled_stop_id:
            delta = delta[1:]
        return EncodedPrompt(delta, text, render_s, encode_s, time.perf_counter() - start)

    def observation_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] = (),
        template_kwargs: Mapping[str, Any] | None = None,
        *,
        delta: bool,
        message_offset: int = 0,
        previous: Mapping[str, Any] | None = None,
        sampled_stop_id: int | None = None,
    ) -> tuple[tuple[int, ...], tuple[ImagePart, ...]]:
        """The rollout ids of an observation and the images their placeholders stand for.

        ``delta`` picks :meth:`render_delta` (which takes ``previous`` and ``sampled_stop_id``)
        over :meth:`render` (which ignores them).

        Returns:
            ``(ids, images)``; ``images`` in rendering order, empty for text.

        Raises:
            InvalidRequestError: as :meth:`render`; an image for a text-only model, or image
                placeholder text without an image (``param`` names the part or ``messages``).
            InternalError: as :meth:`render_delta`.
        """
        images = image_parts(messages, offset=message_offset)
        if delta:
            ids = self.render_delta(messages, tools, template_kwargs, message_offset=message_offset,
                                    previous=previous, sampled_stop_id=sampled_stop_id).token_ids
        else:
            ids = self.render(messages, tools, template_kwargs, message_offset=message_offset).token_ids
        if images and self.vision is None:
            raise InvalidRequestError(
                "the served model is text-only and cannot take image input", param=images[0].param
            )
        if not images and self.vision is not None and self.vision.count_placeholders(ids):
            raise InvalidRequestError(
                "the messages contain image placeholder text but no image_url part", param="messages"
            )
        return ids, images

    def attach_images(self, rollout_ids: Sequence[int], images: Sequence[ImagePart]) -> RenderedObservation:
        """The training view of rendered ids: decode and process the images, expand placeholders.

        Uses the vision processor only (no tokenizer), so it may run in a worker thread.

        Raises:
            InvalidRequestError: a remote or undecodable image, or a placeholder count that
                differs from the number of images (the template does not render one per image).
        """
        ids = tuple(rollout_ids)
        if not images:
            return RenderedObservation(ids, ids, None)
        assert self.vision is not None  # observation_ids refuses images for text-only models
        train_ids, payload = self.vision.observation(ids, images)
        return RenderedObservation(train_ids, ids, payload)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` with special tokens kept and no whitespace clean-up."""
        return fast_decode(self._tokenizer, list(token_ids))

    def prompt_opens_think(self, prompt_ids: Sequence[int]) -> bool:
        """True when the prompt ends inside an opened ``<think>`` block (R1 / Qwen3-thinking style).

        Args:
            prompt_ids: the generation input ids (at least the tail of them).
        """
        tail = self.decode(prompt_ids[-16:]).rstrip()
        return tail.endswith(THINK_OPEN)

    # ------------------------------------------------------------------ internals

    def _checked_kwargs(self, template_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
        return _inputs.checked_kwargs(template_kwargs, self._reserved_kwargs)

    def _tools_arg(self, tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
        tool_list = [dict(tool) for tool in tools]
        if not tool_list and not self._pass_empty_tools:
            return None
        return tool_list

    def _render_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        kwargs: Mapping[str, Any],
        add_generation_prompt: bool,
    ) -> tuple[str, float]:
        start = time.perf_counter()
        try:
            text = self._renderer.render(messages, self._tools_arg(tools), add_generation_prompt, kwargs)
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise InvalidRequestError(
                f"the chat template cannot render these messages: {type(exc).__name__}: {exc}", param="messages"
            ) from exc
        if not isinstance(text, str):
            raise InternalError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
        return text, time.perf_counter() - start

    def _encode(self, text: str) -> tuple[tuple[int, ...], float]:
        start = time.perf_counter()
        ids = self._encoder.encode(text)
        return ids, time.perf_counter() - start

    def _delta_after(
        self,
        prefix: Sequence[Mapping[str, Any]],
        trim: _Trim,
        prepared: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        kwargs: Mapping[str, Any],
    ) -> tuple[tuple[int, ...], str, float, float]:
        """``(ids, text, render_s, encode_s)``: the ids of ``prefix + prepared`` after ``trim``."""
        text, render_s = self._render_text([*prefix, *prepared], tools, kwargs, True)
        if trim.suffix_ok and text.startswith(trim.text):
            # The prefix text ends with an added token: the tokenizer splits there, so the ids
            # after it are the ids of the text after it (no need to tokenize the prefix again).
            delta, encode_s = self._encode(text[len(trim.text):])
            return delta, text, render_s, encode_s
        ids, encode_s = self._encode(text)
        trim_ids = trim.ids if trim.ids is not None else self._encode(trim.text)[0]
        if ids[: len(trim_ids)] != trim_ids:
            raise InternalError(
                "the chat template is not prefix-stable after the dummy prefix: rendering more messages "
                "changed the first tokens, so observation deltas cannot be rendered incrementally with "
                "this template and these tools/template kwargs"
            )
        return ids[len(trim_ids):], text, render_s, encode_s

    def _delta_after_call(
        self,
        previous: Mapping[str, Any],
        prepared: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        kwargs: Mapping[str, Any],
        message_offset: int,
        refused: InvalidRequestError,
    ) -> tuple[tuple[int, ...], str, float, float]:
        """:meth:`_delta_after` the dummy prefix plus the assistant message the tool results answer.

        Raises:
            InvalidRequestError: ``refused`` when the template refuses this prefix too, or is not
                prefix-stable after it.
        """
        context = [*DUMMY_PREFIX, *_inputs.template_messages(
            [previous], self.arguments_form, max(message_offset - 1, 0), self._reasoning_key)]
        try:
            text, _ = self._render_text(context, tools, kwargs, False)
            trim = self._trim_of(text, tokenize=False)
            return self._delta_after(context, trim, prepared, tools, kwargs)
        except (InvalidRequestError, InternalError):
            raise refused from None

    def _dummy_trim(self, tools: Sequence[Mapping[str, Any]], kwargs: Mapping[str, Any]) -> _Trim:
        """The dummy prefix's render (cached per tools and kwargs)."""
        key = (json.dumps([list(tools), kwargs], sort_keys=True, separators=(",", ":"), default=str)
               if tools or kwargs else "")
        with self._trim_lock:
            cached = self._trim_cache.get(key)
        if cached is not None:
            return cached
        text, _ = self._render_text(list(DUMMY_PREFIX), tools, kwargs, False)
        trim = self._trim_of(text, tokenize=True)
        with self._trim_lock:
            if len(self._trim_cache) >= _TRIM_CACHE_SIZE:
                self._trim_cache.pop(next(iter(self._trim_cache)))
            self._trim_cache[key] = trim
        return trim

    def _trim_of(self, text: str, *, tokenize: bool) -> _Trim:
        """The trim of a prefix rendered without a generation prompt: one trailing ``"\\n"`` dropped
        (it belongs to the separator a delta starts with); tokenized now, or only when a delta
        needs its ids (``tokenize=False``)."""
        if text.endswith("\n"):
            text = text[:-1]
        ids = self._encode(text)[0] if tokenize else None
        return _Trim(ids, text, suffix_ok=self._ends_with_split_token(text))

    def _ends_with_split_token(self, text: str) -> bool:
        """Whether ``text`` ends with an added token that the tokenizer always splits off as is
        (not normalized, strips no following whitespace), so what follows it tokenizes alone."""
        decoder = getattr(self._tokenizer, "added_tokens_decoder", None)
        if not isinstance(decoder, Mapping):
            return False
        return any(
            text.endswith(token.content) and token.content
            and not getattr(token, "rstrip", True) and not getattr(token, "normalized", True)
            for token in decoder.values()
        )


@attrs.frozen
class _Trim:
    """A prefix's ids (None: not tokenized yet) and text; ``suffix_ok``: a delta may tokenize only
    what follows."""

    ids: tuple[int, ...] | None
    text: str
    suffix_ok: bool
