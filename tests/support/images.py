"""Small images and reference computations for the multimodal tests."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image


def make_image(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    """A deterministic noise image."""
    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB").convert(mode)


def png_bytes(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def data_url(width: int, height: int, seed: int = 0) -> str:
    """``data:image/png;base64,...`` of :func:`make_image`."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(make_image(width, height, seed))).decode()


def decode_data_url(url: str) -> Image.Image:
    header, _, payload = url.partition(",")
    assert header == "data:image/png;base64", header
    image = Image.open(io.BytesIO(base64.b64decode(payload)))
    assert image.format == "PNG"
    return image


def full_forward_logprobs(model, token_ids: Sequence[int], image_token_id: int, train_inputs: dict,
                          start: int, temperature: float = 1.0) -> list[float]:
    """``log_softmax(logits / T)`` of ``token_ids[start:]`` from one unpadded full forward pass."""
    ids = torch.tensor([list(token_ids)])  # (1, T)
    kwargs = {}
    if train_inputs:
        kwargs = {
            "pixel_values": torch.tensor(np.asarray(train_inputs["pixel_values"])),
            "image_grid_thw": torch.tensor(np.asarray(train_inputs["image_grid_thw"])),
            "mm_token_type_ids": (ids == image_token_id).to(torch.int32),
        }
    with torch.inference_mode():
        logits = model(input_ids=ids, **kwargs).logits[0].float()  # (T, V)
    rows = torch.log_softmax(logits[start - 1 : len(token_ids) - 1] / temperature, dim=-1)  # (N, V)
    targets = torch.tensor(list(token_ids[start:])).unsqueeze(1)
    return rows.gather(1, targets).squeeze(1).tolist()


def closed_port_url(path: str = "/a.png") -> str:
    """An ``http://127.0.0.1:<port>`` URL nothing listens on (connections are refused)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"
