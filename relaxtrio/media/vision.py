"""Vision preprocessing shared by the compiler (training view) and the embedded engine.

A vision-language model sees an image twice in relaxtrio (docs/canonical-contract.md#images,
docs/client-quirks.md#images-expanded-twice):

* **rollout ids** hold exactly one image placeholder token per image (``<|image_pad|>`` for the
  Qwen2-VL family), which is what an SGLang server expects next to ``image_data``: the engine
  expands each placeholder itself;
* **training ids** hold the processor expansion: placeholder ``k`` repeated
  ``prod(image_grid_thw[k]) // merge_size**2`` times, exactly as the Hugging Face processor
  (``Qwen2VLProcessor.replace_image_token``) does on text, plus the image processor's outputs
  (``pixel_values``, ``image_grid_thw``) as the training inputs.

Expanding placeholder *ids* is the same as the processor's text-level replacement followed by
tokenization, because the placeholder is an added special token: repeating it never merges with
its neighbours. The same :class:`VisionProcessor` (loaded from the model directory) runs in the
compiler and in the embedded engine, so both expand an image to the same number of tokens.

Supported: image processors that return ``pixel_values`` + ``image_grid_thw`` and a config with
``image_token_id`` (Qwen2-VL, Qwen2.5-VL). Without torchvision, transformers 5.24 loads the
PIL/numpy image processor; nothing here needs torch.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np
from PIL import Image

from .._errors import InvalidRequestError
from .images import (
    REMOTE_IMAGE_MAX_BYTES,
    REMOTE_IMAGE_TIMEOUT_S,
    ImagePart,
    decode_image_url,
    fetch_image_url,
    is_remote_url,
)

__all__ = ["MultimodalPayload", "RenderedObservation", "VisionProcessor"]

_ENGINE_CACHE_IMAGES: Final = 32


def _frozen_array(value: Any, dtype: Any) -> np.ndarray:
    array = np.array(value, dtype=dtype, copy=True)
    array.setflags(write=False)
    return array


@attrs.frozen(eq=False)
class MultimodalPayload:
    """The media of one observation node; the forest stores it without looking inside.

    Pickle-able and torch-free (numpy arrays, read-only).

    Attributes:
        image_urls: the observation's images in placeholder order (``data:`` URLs), sent to the
            engine as ``image_data`` on every later turn of the lineage.
        pixel_values: ``(num_patches, patch_dim) float32``, the images' patches concatenated in
            image order.
        image_grid_thw: ``(num_images, 3) int64``, ``(t, h, w)`` patch grid of each image.
        num_image_tokens: per image, how many placeholder ids it has in the training ids;
            ``len(num_image_tokens) == len(image_urls) == image_grid_thw.shape[0]``.
    """

    image_urls: tuple[str, ...] = attrs.field(converter=tuple)
    pixel_values: np.ndarray = attrs.field(converter=lambda v: _frozen_array(v, np.float32))
    image_grid_thw: np.ndarray = attrs.field(converter=lambda v: _frozen_array(v, np.int64))
    num_image_tokens: tuple[int, ...] = attrs.field(converter=lambda v: tuple(int(n) for n in v))

    def __attrs_post_init__(self) -> None:
        n = len(self.image_urls)
        if self.image_grid_thw.shape != (n, 3) or len(self.num_image_tokens) != n:
            raise ValueError(
                f"MultimodalPayload: {n} image_urls, image_grid_thw shape {self.image_grid_thw.shape}, "
                f"{len(self.num_image_tokens)} num_image_tokens; they must agree"
            )
        patches = int(self.image_grid_thw.prod(axis=1).sum()) if n else 0
        if self.pixel_values.ndim != 2 or self.pixel_values.shape[0] != patches:
            raise ValueError(
                f"MultimodalPayload.pixel_values shape {self.pixel_values.shape} does not hold the "
                f"{patches} patches of image_grid_thw"
            )

    @property
    def train_inputs(self) -> dict[str, np.ndarray]:
        """Model keyword inputs for training: ``pixel_values`` and ``image_grid_thw``."""
        return {"pixel_values": self.pixel_values, "image_grid_thw": self.image_grid_thw}


@attrs.frozen
class RenderedObservation:
    """The two id views of one rendered observation (full render or delta).

    Attributes:
        token_ids: ``[t]`` training ids (image placeholders expanded to their feature count).
        rollout_token_ids: ``[r]`` generation ids (one placeholder per image), ``r <= t``.
        multimodal: the observation's images and training inputs, or None for text.
    """

    token_ids: tuple[int, ...] = attrs.field(converter=tuple)
    rollout_token_ids: tuple[int, ...] = attrs.field(converter=tuple)
    multimodal: MultimodalPayload | None = None


class VisionProcessor:
    """The image processor of a VLM plus its placeholder-expansion rule.

    Args:
        image_processor: a transformers image processor returning ``pixel_values`` and
            ``image_grid_thw`` (Qwen2-VL style).
        image_token_id: the placeholder id the chat template writes once per image.
        merge_size: spatial merge size; an image of grid ``(t, h, w)`` takes
            ``t * h * w // merge_size**2`` placeholder ids after expansion.
        cache_images: how many processed images to remember by URL (the engine sees every image
            of a lineage again on each turn); 0 disables the cache.
        remote_image_max_bytes: size limit of one fetched ``http(s)`` image, in bytes.
        remote_image_timeout_s: time limit of one fetch, in seconds.

    Thread safety: calls may run in worker threads; the cache is guarded by a lock.
    """

    def __init__(
        self,
        image_processor: Any,
        *,
        image_token_id: int,
        merge_size: int,
        cache_images: int = 0,
        remote_image_max_bytes: int = REMOTE_IMAGE_MAX_BYTES,
        remote_image_timeout_s: float = REMOTE_IMAGE_TIMEOUT_S,
    ) -> None:
        self.remote_image_max_bytes = remote_image_max_bytes
        self.remote_image_timeout_s = remote_image_timeout_s
        self.image_processor = image_processor
        self.image_token_id = int(image_token_id)
        self.merge_size = int(merge_size)
        self._cache_images = cache_images
        self._cache: OrderedDict[bytes, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, model_dir: Path | str, *, cache_images: int = 0) -> VisionProcessor | None:
        """Loads the vision processor of a model directory, or None for a text-only model.

        A directory is a VLM when its ``config.json`` has a ``vision_config``.

        Raises:
            ValueError: a VLM config without ``image_token_id`` (not a supported family).
        """
        config_file = Path(model_dir) / "config.json"
        if not config_file.is_file():
            return None
        config = json.loads(config_file.read_text(encoding="utf-8"))
        if "vision_config" not in config:
            return None
        if not isinstance(config.get("image_token_id"), int):
            raise ValueError(f"{config_file}: a vision config without image_token_id is not supported")
        from transformers import AutoImageProcessor

        processor = AutoImageProcessor.from_pretrained(str(model_dir))
        merge = getattr(processor, "merge_size", None) or config["vision_config"].get("spatial_merge_size", 1)
        return cls(processor, image_token_id=config["image_token_id"], merge_size=merge,
                   cache_images=cache_images)

    @classmethod
    def for_engine(cls, model_dir: Path | str) -> VisionProcessor | None:
        """:meth:`from_pretrained` with the engine's per-URL image cache enabled."""
        return cls.from_pretrained(model_dir, cache_images=_ENGINE_CACHE_IMAGES)

    # ------------------------------------------------------------------ images

    def process(self, images: Sequence[Image.Image]) -> tuple[np.ndarray, np.ndarray]:
        """Runs the image processor.

        Returns:
            ``pixel_values (num_patches, patch_dim) float32`` and ``image_grid_thw (n, 3) int64``.
        """
        out = self.image_processor(images=list(images), return_tensors="np")
        return np.asarray(out["pixel_values"], np.float32), np.asarray(out["image_grid_thw"], np.int64)

    def tokens_per_image(self, image_grid_thw: np.ndarray) -> tuple[int, ...]:
        """Placeholder ids per image after expansion: ``t * h * w // merge_size**2``."""
        return tuple(int(n) for n in np.asarray(image_grid_thw).prod(axis=1) // self.merge_size**2)

    def expand(self, token_ids: Sequence[int], num_image_tokens: Sequence[int], *, param: str | None = None
               ) -> tuple[int, ...]:
        """Repeats placeholder ``k`` of ``token_ids`` ``num_image_tokens[k]`` times.

        Raises:
            InvalidRequestError: the ids hold another number of placeholders than there are images.
        """
        count = sum(1 for t in token_ids if t == self.image_token_id)
        if count != len(num_image_tokens):
            raise InvalidRequestError(
                f"the prompt has {count} image placeholder token(s) for {len(num_image_tokens)} image(s)",
                param=param,
            )
        out: list[int] = []
        images = iter(num_image_tokens)
        for t in token_ids:
            if t == self.image_token_id:
                out.extend([t] * next(images))
            else:
                out.append(t)
        return tuple(out)

    def count_placeholders(self, token_ids: Sequence[int]) -> int:
        """How many placeholder ids ``token_ids`` holds."""
        return sum(1 for t in token_ids if t == self.image_token_id)

    # ------------------------------------------------------------------ the two views

    def observation(
        self, rollout_ids: Sequence[int], images: Sequence[ImagePart]
    ) -> tuple[tuple[int, ...], MultimodalPayload]:
        """Training ids and payload of a rendered observation (compiler side).

        Args:
            rollout_ids: the rendered ids, one placeholder per image.
            images: the observation's images in rendering order (at least one).

        Returns:
            ``(training ids, payload)``.

        Remote ``http(s)`` images are fetched here, once (blocking: this runs in a worker
        thread), bounded by ``remote_image_max_bytes`` and ``remote_image_timeout_s``; the
        payload keeps the fetched bytes as ``data:`` URLs, so the engine and the trainer see
        exactly what was downloaded. The committed message keeps the agent's URL.

        Raises:
            InvalidRequestError: a remote image that cannot be fetched within the bounds, an
                undecodable image (``param`` is its field path), or a placeholder count that
                differs from the number of images.
        """
        urls = [self._inline(part) for part in images]
        decoded = [decode_image_url(url, where=part.param) for url, part in zip(urls, images, strict=True)]
        pixel_values, grid = self.process(decoded)
        per_image = self.tokens_per_image(grid)
        train_ids = self.expand(rollout_ids, per_image, param=images[0].param if images else None)
        payload = MultimodalPayload(
            image_urls=urls,
            pixel_values=pixel_values,
            image_grid_thw=grid,
            num_image_tokens=per_image,
        )
        return train_ids, payload

    def _inline(self, part: ImagePart) -> str:
        """The part's URL, with a remote image fetched into a ``data:`` URL."""
        if not is_remote_url(part.url):
            return part.url
        return fetch_image_url(part.url, where=part.param, max_bytes=self.remote_image_max_bytes,
                               timeout_s=self.remote_image_timeout_s)

    def engine_inputs(
        self, input_ids: Sequence[int], image_data: Sequence[str]
    ) -> tuple[tuple[int, ...], np.ndarray | None, np.ndarray | None]:
        """Expanded ids and pixels of a ``/generate`` request (engine side).

        Args:
            input_ids: the request's ids with one placeholder per image.
            image_data: ``data:`` URLs or bare base64 images, in placeholder order.

        Returns:
            ``(expanded ids, pixel_values | None, image_grid_thw | None)``; the arrays are None
            without images.

        Raises:
            InvalidRequestError: an image that is remote or undecodable (``param``
                ``image_data[i]``), or a placeholder count different from ``len(image_data)``.
        """
        if not image_data:
            if self.count_placeholders(input_ids):
                raise InvalidRequestError(
                    f"input_ids hold {self.count_placeholders(input_ids)} image placeholder token(s) "
                    "but image_data is empty", param="image_data")
            return tuple(input_ids), None, None
        pixels: list[np.ndarray] = []
        grids: list[np.ndarray] = []
        for i, url in enumerate(image_data):
            p, g = self._process_cached(url, f"image_data[{i}]")
            pixels.append(p)
            grids.append(g)
        grid = np.concatenate(grids, axis=0)
        ids = self.expand(input_ids, self.tokens_per_image(grid), param="image_data")
        return ids, np.concatenate(pixels, axis=0), grid

    def _process_cached(self, url: str, where: str) -> tuple[np.ndarray, np.ndarray]:
        key = hashlib.sha256(url.encode("utf-8", "surrogatepass")).digest()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        result = self.process([decode_image_url(url, where=where, allow_bare_base64=True)])
        if self._cache_images > 0:
            with self._lock:
                self._cache[key] = result
                while len(self._cache) > self._cache_images:
                    self._cache.popitem(last=False)
        return result
