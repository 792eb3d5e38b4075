"""Prompt datasets: JSONL rows → Session inputs (messages and metadata).

``--input-key`` maps a row field to messages (a string becomes one user message, a message list
keeps its OpenAI shape, a dict becomes one message); ``--metadata-key`` maps a row field to
metadata. A row may have both (docs/agent-contract.md#session-input).

Images: ``--multimodal-keys '{"image": "images"}'`` names the row field
holding the prompt's images (a list, or one value). Each ``<image>`` placeholder in the prompt
text, in message order, is joined with the next image: the text is split there and an internal
``{"type": "image", "image": value}`` part takes the placeholder's place. The number of
placeholders must equal the number of images (else a clear error naming the row and both
counts). Local paths are checked and made absolute at load time (relative paths are looked up
next to the dataset file first, then in the working directory); ``data:`` and ``http(s)://``
URLs are kept as they are and never fetched here.

Errors: a row that cannot be used is a :class:`~relaxtrio.ConfigError` at load time (the run
refuses to start, exit status 2), naming ``file:line``. The one check left for later, an image
file that disappears after loading, raises the media layer's
:class:`~relaxtrio.InvalidRequestError` from :meth:`Prompt.session_input`; the pipeline drops that
prompt's Group.

:meth:`Prompt.session_input` then converts every internal image part to OpenAI ``image_url``
content before the agent starts: URLs are kept, a path / bytes / PIL image becomes an RGB PNG
``data:`` URL. The conversion runs per call (decoding and PNG-encoding the row's images), so large
images are never held in memory for the whole dataset.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from .._errors import ConfigError, InvalidRequestError
from ..forest import Conversation
from ..media.images import image_content_part, is_kept_url, resolve_image_path, to_image_url
from ..nursery.agent import RolloutMode
from ..nursery.group import Group

IMAGE_PLACEHOLDER: Final = "<image>"
"""The dataset prompt's image placeholder (the standard Relax format)."""

SUPPORTED_MODALITIES: Final = ("image",)


@attrs.frozen(kw_only=True)
class Prompt:
    """One dataset row, ready to become a Group.

    Attributes:
        index: the row's position in the file (0-based).
        messages: canonical messages for the Session input (may be empty for metadata-only rows).
        metadata: the row's metadata object (copied into every exported sample).
    """

    index: int
    messages: tuple[dict, ...]
    metadata: dict[str, Any]

    def session_input(self) -> dict[str, Any]:
        """The JSON object written to RELAX_INPUT_JSON; images become ``image_url`` parts.

        Raises:
            InvalidRequestError: an image that can no longer be read or decoded.
        """
        payload: dict[str, Any] = {
            "messages": [
                _with_image_urls(m, where=f"prompt {self.index} messages[{i}]")
                for i, m in enumerate(self.messages)
            ]
        }
        if self.metadata:
            payload["metadata"] = self.metadata
        return payload

    def make_group(self, group_id: str, *, num_sessions: int, timeout_s: float, mode: RolloutMode = "train",
                   max_context_tokens: int | None = None) -> Group:
        """The Group of ``num_sessions`` Sessions for this row (not started); each agent's
        active-time budget is ``timeout_s`` seconds and each lineage's limit
        ``max_context_tokens`` training tokens (None: none).

        A row whose input cannot be built (e.g. an image file that disappeared) gives a Group
        that is already dropped, with the reason; the caller does not run it.
        """
        try:
            payload = self.session_input()
        except InvalidRequestError as exc:
            return Group.unusable(group_id, f"prompt {self.index} cannot be used: {exc}",
                                  mode=mode, prompt_index=self.index)
        return Group.create(group_id, num_sessions=num_sessions, input_payload=payload, timeout_s=timeout_s,
                            mode=mode, prompt_index=self.index, dataset_metadata=self.metadata,
                            max_context_tokens=max_context_tokens)


def _messages_of(value: Any, where: str) -> tuple[dict, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [{"role": "user", "content": value}] if value.strip() else []
    elif isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise ConfigError(f"{where} must be a string, a message or a list of messages")
    if not value:
        return ()
    try:
        return Conversation.from_wire(value).messages
    except InvalidRequestError as exc:
        raise ConfigError(f"{where}: {exc}", param=exc.param) from exc


def _with_image_urls(message: dict, *, where: str) -> dict:
    """A copy of ``message`` whose internal ``{"type": "image"}`` parts are ``image_url`` parts."""
    content = message.get("content")
    if not isinstance(content, list):
        return dict(message)
    parts = []
    for j, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "image" and "image" in part:
            part = image_content_part(to_image_url(part["image"], where=f"{where}.content[{j}].image"))
        parts.append(part)
    return {**message, "content": parts}


def _image_key(multimodal_keys: Mapping[str, str] | None) -> str | None:
    if not multimodal_keys:
        return None
    for modality, field in multimodal_keys.items():
        if modality not in SUPPORTED_MODALITIES:
            raise ConfigError(
                f"--multimodal-keys: modality {modality!r} is not supported (supported: "
                f"{', '.join(SUPPORTED_MODALITIES)})", param="multimodal_keys")
        if not isinstance(field, str) or not field:
            raise ConfigError(
                f"--multimodal-keys: the field of {modality!r} must be a non-empty string",
                param="multimodal_keys")
    return multimodal_keys.get("image")


def _checked_image(value: Any, where: str, base_dir: Path | None) -> Any:
    """A row's image value, validated; local paths become absolute path strings."""
    if isinstance(value, Mapping):
        for key in ("url", "path"):
            if isinstance(value.get(key), str) and value[key]:
                return _checked_image(value[key], where, base_dir)
        if value.get("bytes") is not None:
            return value
        raise ConfigError(f"{where} must have a non-empty 'path' or 'url'")
    if isinstance(value, str):
        if is_kept_url(value):
            return value
        try:
            return str(resolve_image_path(value, where=where, base_dir=base_dir))
        except InvalidRequestError as exc:
            raise ConfigError(exc.message, param=exc.param) from exc
    if isinstance(value, (bytes, bytearray)) or hasattr(value, "convert"):  # bytes or a PIL image
        return value
    raise ConfigError(f"{where} must be a path or URL string, got {type(value).__name__}")


def join_images(
    messages: tuple[dict, ...],
    images: Any,
    *,
    where: str,
    field: str,
    base_dir: Path | None = None,
) -> tuple[dict, ...]:
    """Joins ``<image>`` placeholders with a row's images (in order) as internal image parts.

    Args:
        messages: the row's canonical messages.
        images: the row's image field: a list, one value, or None (no images).
        where: ``file:line`` of the row, for errors.
        field: the image field's name, for errors.
        base_dir: where relative image paths are looked up first.

    Returns:
        The messages with every placeholder replaced by ``{"type": "image", "image": value}``
        (text around it kept as text parts; string content becomes a part list when it has
        a placeholder).

    Raises:
        ConfigError: the placeholder count differs from the image count, a placeholder
            sits in a system message, or an image value is unusable (missing file, bad type).
    """
    values = [] if images is None else list(images) if isinstance(images, (list, tuple)) else [images]
    values = [_checked_image(v, f"{where}: {field}[{k}]", base_dir) for k, v in enumerate(values)]
    found = sum(_count_placeholders(m) for m in messages)
    if found != len(values):
        raise ConfigError(
            f"{where}: the prompt has {found} {IMAGE_PLACEHOLDER} placeholder(s) but {field!r} has "
            f"{len(values)} image(s); each image needs exactly one placeholder"
        )
    if not values:
        return messages
    remaining = iter(values)
    out = []
    for i, message in enumerate(messages):
        if not _count_placeholders(message):
            out.append(message)
            continue
        if message["role"] == "system":
            raise ConfigError(f"{where}: messages[{i}] is a system message; images must be in "
                                      "user, assistant or tool messages")
        content = message["content"]
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        joined: list[dict] = []
        for part in parts:
            if part.get("type") != "text" or IMAGE_PLACEHOLDER not in part.get("text", ""):
                joined.append(part)
                continue
            pieces = part["text"].split(IMAGE_PLACEHOLDER)
            for k, piece in enumerate(pieces):
                if k:
                    joined.append({"type": "image", "image": next(remaining)})
                if piece:
                    joined.append({"type": "text", "text": piece})
        out.append({**message, "content": joined})
    return tuple(out)


def _count_placeholders(message: dict) -> int:
    content = message.get("content")
    if isinstance(content, str):
        return content.count(IMAGE_PLACEHOLDER)
    if isinstance(content, list):
        return sum(part.get("text", "").count(IMAGE_PLACEHOLDER) for part in content
                   if isinstance(part, dict) and part.get("type") == "text")
    return 0


def load_prompts(
    path: Path,
    *,
    input_key: str = "input",
    metadata_key: str = "metadata",
    multimodal_keys: Mapping[str, str] | None = None,
) -> list[Prompt]:
    """Reads a JSONL prompt file.

    Args:
        path: the JSONL file.
        input_key: row field holding the prompt (string, message or message list).
        metadata_key: row field holding the metadata object.
        multimodal_keys: modality → row field, e.g. ``{"image": "images"}``
            (``--multimodal-keys``); only ``image`` is supported.

    Raises:
        ConfigError: unreadable JSON, a non-object row, a row with neither field, an
            unsupported modality, or a row whose placeholders and images do not match.
        FileNotFoundError: no such file.
    """
    image_key = _image_key(multimodal_keys)
    prompts = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: invalid JSON ({exc})") from exc
            if not isinstance(row, dict):
                raise ConfigError(f"{where}: each line must be a JSON object")
            if input_key not in row and metadata_key not in row:
                raise ConfigError(f"{where}: row has neither {input_key!r} nor {metadata_key!r}")
            metadata = row.get(metadata_key) or {}
            if not isinstance(metadata, dict):
                raise ConfigError(f"{where}: {metadata_key!r} must be a JSON object")
            messages = _messages_of(row.get(input_key), where)
            if image_key is not None:
                messages = join_images(messages, row.get(image_key), where=where, field=image_key,
                                       base_dir=Path(path).parent)
            prompts.append(Prompt(index=len(prompts), messages=messages, metadata=metadata))
    if not prompts:
        raise ConfigError(f"{path}: no prompts")
    return prompts


@attrs.define(kw_only=True)
class PromptStream:
    """An endless, epoch-shuffled stream of prompts (deterministic for a seed).

    Epoch ``e`` serves every prompt once, in the order ``random.Random(seed + e)`` shuffles them
    to (file order without ``shuffle``). Prompts pending in a restored cursor (a checkpoint's held
and run-end Groups, :mod:`relaxtrio.rollout.resume`) are served first.
    :meth:`cursor` and :meth:`restore` save and restore the position, so a resumed run is served
    exactly the prompts the interrupted run would have been served next.
    """

    prompts: list[Prompt]
    shuffle: bool = True
    seed: int = 0
    epoch: int = 0
    _order: list[int] = attrs.field(factory=list)  # this epoch's remaining indices, last is next
    _requeued: list[int] = attrs.field(factory=list)  # served before _order, first is next

    def __iter__(self) -> Iterator[Prompt]:
        return self

    def __next__(self) -> Prompt:
        if self._requeued:
            return self.prompts[self._requeued.pop(0)]
        if not self._order:
            self._order = list(range(len(self.prompts)))
            if self.shuffle:
                random.Random(self.seed + self.epoch).shuffle(self._order)
            self._order.reverse()
            self.epoch += 1
        return self.prompts[self._order.pop()]

    def cursor(self) -> dict[str, Any]:
        """The stream's position as JSON: ``{"epoch", "pending", "remaining", "num_prompts"}``.

        ``pending`` are requeued prompt indices (served first), ``remaining`` the rest of epoch
        ``epoch - 1`` in serving order; then epoch ``epoch`` is shuffled with ``seed + epoch``.
        """
        return {"epoch": self.epoch, "pending": list(self._requeued),
                "remaining": list(reversed(self._order)), "num_prompts": len(self.prompts),
                "seed": self.seed, "shuffle": self.shuffle}

    def restore(self, cursor: Mapping[str, Any]) -> None:
        """Continues from a :meth:`cursor` taken on a stream over the same prompts.

        Raises:
            ConfigError: the cursor is for a different number of prompts (another
                dataset), or names indices this stream does not have.
        """
        if int(cursor["num_prompts"]) != len(self.prompts):
            raise ConfigError(
                f"the checkpoint's dataset cursor is for {cursor['num_prompts']} prompts, but "
                f"--prompt-data has {len(self.prompts)}: resume with the same prompt file",
                param="prompt_data")
        pending, remaining = list(cursor["pending"]), list(cursor["remaining"])
        self._check_indices(pending + remaining, "checkpoint prompt")
        self.epoch = int(cursor["epoch"])
        self._requeued = pending
        self._order = remaining[::-1]

    def _check_indices(self, indices: Sequence[int], what: str) -> None:
        for index in indices:
            if not (isinstance(index, int) and 0 <= index < len(self.prompts)):
                raise ConfigError(f"{what} index {index!r} is not in 0..{len(self.prompts) - 1}",
                                          param="prompt_data")
