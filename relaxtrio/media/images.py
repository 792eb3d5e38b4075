"""Images at the process boundaries: dataset values → OpenAI ``image_url`` parts, and back to pixels.

Pillow only (no torch, no transformers), so the dataset loader and the API side can use it.

Conversions (docs/agent-contract.md#session-input, docs/canonical-contract.md#images):

* :func:`to_image_url` turns a dataset image value into the URL an agent receives. An existing
  ``data:`` URL, or an ``http://`` / ``https://`` URL, is kept as it is (remote URLs are never
  fetched here). A local path, raw bytes, a ``PIL.Image.Image`` or a Hugging Face datasets
  ``{"bytes": ..., "path": ...}`` object is decoded, converted to RGB, encoded as PNG and returned
  as ``data:image/png;base64,...``.
* :func:`fetch_image_url` downloads a remote ``http(s)://`` image an agent sent, once, bounded
  in bytes and seconds, and returns it as a ``data:`` URL of the exact bytes received; every
  later use (the engine's ``image_data``, the training inputs) reads those bytes, so a second
  download can never differ from the first. Failures are a clear 400
  (:class:`~relaxtrio.InvalidRequestError` naming the field).
* :func:`decode_image_url` turns a ``data:`` URL (or, for the engine, bare base64) back into an
  RGB image. It never fetches: a remote URL reaching it is refused with a clear
  :class:`~relaxtrio.InvalidRequestError` (callers resolve remote URLs first).
* :func:`image_parts` lists the ``image_url`` parts of canonical messages in the order a chat
  template renders them (message order, then part order).
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
from PIL import Image, UnidentifiedImageError

from .._errors import InvalidRequestError

__all__ = [
    "IMAGE_MARKER",
    "IMAGE_PART_TYPE",
    "REMOTE_IMAGE_MAX_BYTES",
    "REMOTE_IMAGE_TIMEOUT_S",
    "ImagePart",
    "decode_image_url",
    "fetch_image_url",
    "image_content_part",
    "image_parts",
    "images_as_text",
    "is_kept_url",
    "is_remote_url",
    "png_data_url",
    "resolve_image_path",
    "to_image_url",
]

IMAGE_PART_TYPE: Final = "image_url"
"""The OpenAI content-part type of an image."""

IMAGE_MARKER: Final = "[image omitted: this model cannot see images]"
"""The text an image becomes for a text-only policy under ``--agentic-text-only-images marker``."""

_KEPT_PREFIXES: Final = ("data:", "http://", "https://")
_REMOTE_PREFIXES: Final = ("http://", "https://")

REMOTE_IMAGE_MAX_BYTES: Final = 20 * 1024 * 1024
"""Default size limit of one fetched remote image, in bytes."""

REMOTE_IMAGE_TIMEOUT_S: Final = 15.0
"""Default time limit of one remote image fetch (connect, headers and body), in seconds."""

_READ_CHUNK_BYTES: Final = 64 * 1024


def is_kept_url(value: str) -> bool:
    """True for values an agent receives unchanged: ``data:``, ``http://`` and ``https://`` URLs."""
    return value.startswith(_KEPT_PREFIXES)


def png_data_url(image: Image.Image) -> str:
    """Encodes an image as an RGB PNG ``data:image/png;base64,...`` URL."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _open_bytes(data: bytes, where: str) -> Image.Image:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InvalidRequestError(f"{where} is not a readable image ({exc})", param=where) from exc


def to_image_url(value: Any, *, where: str = "image", base_dir: Path | None = None) -> str:
    """Converts one dataset image value to the URL of an OpenAI ``image_url`` part.

    Args:
        value: a ``data:`` / ``http(s)://`` URL (kept), a local path (``str`` or
            ``os.PathLike``), ``bytes``, a ``PIL.Image.Image``, or a mapping with ``bytes``,
            ``path`` or ``url`` (the Hugging Face datasets image shape; ``bytes`` wins).
        where: the value's location, for error messages (``data.jsonl:3 images[1]``).
        base_dir: relative paths are looked up here first, then in the working directory.

    Returns:
        The kept URL, or ``data:image/png;base64,...`` (RGB PNG).

    Raises:
        InvalidRequestError: an unsupported value, a missing file, or bytes that are no image.
    """
    if isinstance(value, str) and is_kept_url(value):
        return value
    if isinstance(value, Image.Image):
        return png_data_url(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return png_data_url(_open_bytes(bytes(value), where))
    if isinstance(value, Mapping):
        if value.get("bytes") is not None:
            return to_image_url(value["bytes"], where=where, base_dir=base_dir)
        for key in ("url", "path"):
            if isinstance(value.get(key), str) and value[key]:
                return to_image_url(value[key], where=where, base_dir=base_dir)
        raise InvalidRequestError(f"{where} must have a non-empty 'bytes', 'path' or 'url'", param=where)
    if isinstance(value, (str, os.PathLike)):
        path = resolve_image_path(value, where=where, base_dir=base_dir)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InvalidRequestError(f"{where}: cannot read {str(path)!r} ({exc})", param=where) from exc
        return png_data_url(_open_bytes(data, where))
    raise InvalidRequestError(
        f"{where} must be a path, URL, bytes or image, got {type(value).__name__}", param=where
    )


def resolve_image_path(value: str | os.PathLike, *, where: str = "image", base_dir: Path | None = None) -> Path:
    """The existing file a local image path names (``base_dir`` first for relative paths).

    Raises:
        InvalidRequestError: the path is empty or names no file.
    """
    text = os.fspath(value)
    if not text:
        raise InvalidRequestError(f"{where} is an empty path", param=where)
    path = Path(text).expanduser()
    candidates = [path] if path.is_absolute() or base_dir is None else [Path(base_dir) / path, path]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise InvalidRequestError(f"{where}: image file {text!r} not found", param=where)


def decode_image_url(url: str, *, where: str = "image_url", allow_bare_base64: bool = False) -> Image.Image:
    """Decodes a base64 ``data:`` URL into an RGB image.

    Args:
        url: ``data:image/...;base64,<data>``; with ``allow_bare_base64`` also ``<data>`` alone
            (SGLang's ``image_data`` accepts both).
        where: the field path for errors.
        allow_bare_base64: accept a string without the ``data:`` prefix as base64.

    Returns:
        The decoded image in RGB mode.

    Raises:
        InvalidRequestError: a remote URL (never fetched), a non-base64 ``data:`` URL, or bytes
            that are no image; ``param`` is ``where``.
    """
    if not isinstance(url, str) or not url:
        raise InvalidRequestError(f"{where} must be a non-empty string", param=where)
    if url.startswith(_REMOTE_PREFIXES):
        raise InvalidRequestError(
            f"{where}: remote image URLs are not fetched by relaxtrio; send the image inline as a "
            "data:image/...;base64 URL",
            param=where,
        )
    if url.startswith("data:"):
        header, comma, payload = url.partition(",")
        if not comma or not header.endswith(";base64"):
            raise InvalidRequestError(f"{where} must be a base64 data URL (data:image/...;base64,...)", param=where)
    elif allow_bare_base64:
        payload = url
    else:
        raise InvalidRequestError(f"{where} must be a data:image/...;base64 URL", param=where)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequestError(f"{where} holds invalid base64 ({exc})", param=where) from exc
    return _open_bytes(data, where)


def is_remote_url(url: str) -> bool:
    """True for ``http://`` and ``https://`` URLs."""
    return url.startswith(_REMOTE_PREFIXES)


def fetch_image_url(
    url: str,
    *,
    where: str = "image_url",
    max_bytes: int = REMOTE_IMAGE_MAX_BYTES,
    timeout_s: float = REMOTE_IMAGE_TIMEOUT_S,
) -> str:
    """Downloads a remote image once and returns it as a ``data:`` URL of the received bytes.

    Blocking (stdlib ``urllib``): call it from a worker thread. The whole fetch (connect,
    headers, body) must finish within ``timeout_s``; a body above ``max_bytes`` (announced by
    ``Content-Length`` or seen while reading) is refused without reading the rest.

    Args:
        url: an ``http://`` or ``https://`` URL.
        where: the field path for errors (``messages[1].content[0].image_url.url``).
        max_bytes: the size limit in bytes.
        timeout_s: the time limit in seconds.

    Returns:
        ``data:image/<format>;base64,<the exact bytes>``.

    Raises:
        InvalidRequestError: (HTTP 400 to the agent, ``param`` = ``where``) the URL is not
            remote, the server answered an error status, the fetch failed or took longer than
            ``timeout_s``, the body is larger than ``max_bytes``, or it is no readable image.
    """
    if not is_remote_url(url):
        raise InvalidRequestError(f"{where} is not an http(s) URL", param=where)
    deadline = time.monotonic() + timeout_s

    def fail(reason: str, exc: BaseException | None = None) -> InvalidRequestError:
        error = InvalidRequestError(f"{where}: cannot fetch remote image {url[:200]!r}: {reason}", param=where)
        error.__cause__ = exc
        return error

    request = urllib.request.Request(url, headers={"User-Agent": "relaxtrio", "Accept": "image/*"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            announced = response.headers.get("Content-Length")
            if announced is not None and announced.isdigit() and int(announced) > max_bytes:
                raise fail(f"{int(announced)} bytes is more than the {max_bytes}-byte limit")
            chunks: list[bytes] = []
            received = 0
            while True:
                if time.monotonic() > deadline:
                    raise fail(f"took longer than {timeout_s:g} s")
                chunk = response.read(_READ_CHUNK_BYTES)
                if not chunk:
                    break
                received += len(chunk)
                if received > max_bytes:
                    raise fail(f"more than the {max_bytes}-byte limit")
                chunks.append(chunk)
    except urllib.error.HTTPError as exc:
        exc.close()  # an HTTPError holds the open response; don't leave its socket to the GC
        raise fail(f"HTTP {exc.code}", exc) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError) or isinstance(exc, TimeoutError):
            raise fail(f"took longer than {timeout_s:g} s", exc) from exc
        raise fail(str(reason), exc) from exc
    if time.monotonic() > deadline:
        raise fail(f"took longer than {timeout_s:g} s")
    data = b"".join(chunks)
    image_format = _image_format(data, where)
    return f"data:image/{image_format};base64," + base64.b64encode(data).decode("ascii")


def _image_format(data: bytes, where: str) -> str:
    """The lower-case Pillow format name of image bytes (``png``, ``jpeg``...)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
            return (image.format or "png").lower()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InvalidRequestError(f"{where} is not a readable image ({exc})", param=where) from exc


def image_content_part(url: str) -> dict[str, Any]:
    """The OpenAI content part ``{"type": "image_url", "image_url": {"url": url}}``."""
    return {"type": IMAGE_PART_TYPE, "image_url": {"url": url}}


@attrs.frozen
class ImagePart:
    """One image of a message list.

    Attributes:
        url: the part's URL (``data:`` or remote).
        param: its field path, ``messages[i].content[j].image_url.url`` (``i`` counts from the
            offset given to :func:`image_parts`).
    """

    url: str
    param: str


def image_parts(messages: Sequence[Mapping[str, Any]], *, offset: int = 0) -> tuple[ImagePart, ...]:
    """The ``image_url`` parts of ``messages``, in rendering order.

    Args:
        messages: canonical messages (string content has no images).
        offset: index of ``messages[0]`` in the request, for field paths.

    Returns:
        One :class:`ImagePart` per ``{"type": "image_url"}`` part; the URL may be given as
        ``image_url.url`` or as a plain ``image_url`` string.

    Raises:
        InvalidRequestError: an ``image_url`` part without a non-empty string URL.
    """
    found: list[ImagePart] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, (list, tuple)):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != IMAGE_PART_TYPE:
                continue
            param = f"messages[{offset + i}].content[{j}].image_url"
            value = part.get("image_url")
            url = value.get("url") if isinstance(value, Mapping) else value
            if not isinstance(url, str) or not url:
                raise InvalidRequestError(f"{param}.url must be a non-empty string", param=f"{param}.url")
            found.append(ImagePart(url, f"{param}.url"))
    return tuple(found)


def images_as_text(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """``messages`` with every ``image_url`` part replaced by a text part holding
    :data:`IMAGE_MARKER` (what a text-only model is shown instead of the image), and how many
    parts were replaced (every message a shallow copy; the input is not modified)."""
    out: list[dict[str, Any]] = []
    replaced = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, (list, tuple)) and any(
                isinstance(p, Mapping) and p.get("type") == IMAGE_PART_TYPE for p in content):
            parts = [{"type": "text", "text": IMAGE_MARKER}
                     if isinstance(p, Mapping) and p.get("type") == IMAGE_PART_TYPE else p for p in content]
            replaced += len(content) - sum(p is q for p, q in zip(parts, content, strict=True))
            message = {**message, "content": parts}
        out.append(dict(message))
    return out, replaced
