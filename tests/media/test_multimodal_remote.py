"""Remote ``http(s)`` images an agent sends are fetched once, bounded, into ``data:`` URLs.

A real HTTP server on 127.0.0.1 serves the images (no network beyond the machine). The fetcher is
used through its module: a build without it fails each test, not the file's import.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.support.images import closed_port_url, data_url, make_image, png_bytes
from tests.support.chat import observation

from relaxtrio import InvalidRequestError
from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.media import images
from relaxtrio.media.vision import VisionProcessor
from relaxtrio.models import load_tokenizer

PNG = png_bytes(make_image(56, 84, seed=1))
JPEG = png_bytes(make_image(28, 28, seed=2), fmt="JPEG")


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        if self.path == "/slow.png":
            time.sleep(1.0)
        if self.path in ("/a.png", "/slow.png"):
            self._send(PNG, "image/png")
        elif self.path == "/b.jpg":
            self._send(JPEG, "image/jpeg")
        elif self.path == "/big.png":
            self._send(PNG, "image/png", length=10**9, body=b"")
        elif self.path == "/chunked.png":  # no Content-Length: the reader must stop by itself
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.wfile.write(b"\0" * 300_000)
        elif self.path == "/text":
            self._send(b"hello, not an image", "text/plain")
        else:
            self.send_error(404)

    def _send(self, data: bytes, kind: str, *, length: int | None = None, body: bytes | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data) if length is None else length))
        self.end_headers()
        self.wfile.write(data if body is None else body)


@pytest.fixture(scope="module")
def image_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_fetch_returns_the_exact_bytes_as_a_data_url(image_server: str) -> None:
    url = images.fetch_image_url(f"{image_server}/a.png")
    assert url == "data:image/png;base64," + base64.b64encode(PNG).decode()
    jpeg = images.fetch_image_url(f"{image_server}/b.jpg")
    assert jpeg == "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()


@pytest.mark.parametrize(
    ("path", "kwargs", "reason"),
    [
        ("/missing.png", {}, "HTTP 404"),
        ("/big.png", {}, "1000000000 bytes is more than the 20971520-byte limit"),
        ("/chunked.png", {"max_bytes": 100_000}, "more than the 100000-byte limit"),
        ("/slow.png", {"timeout_s": 0.2}, "took longer than 0.2 s"),
        ("/text", {}, "is not a readable image"),
    ],
)
def test_fetch_failures_are_clear_client_errors(image_server: str, path: str, kwargs: dict, reason: str) -> None:
    where = "messages[2].content[0].image_url.url"
    with pytest.raises(InvalidRequestError, match=reason) as caught:
        images.fetch_image_url(f"{image_server}{path}", where=where, **kwargs)
    assert caught.value.param == where and caught.value.http_status == 400


def test_unreachable_host_is_a_client_error() -> None:
    with pytest.raises(InvalidRequestError, match="cannot fetch remote image"):
        images.fetch_image_url(closed_port_url(), timeout_s=5.0)


def test_compiler_trains_on_the_fetched_bytes(image_server: str, tiny_vlm_dir: Path, vlm_vision) -> None:
    compiler = ChatCompiler(load_tokenizer(tiny_vlm_dir), vision=vlm_vision)
    remote = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": f"{image_server}/a.png"}}]}]
    inline = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": data_url(56, 84, seed=1)}}]}]
    fetched = observation(compiler, remote, delta=False)
    expected = observation(compiler, inline, delta=False)
    # The engine's image_data and the training inputs carry the downloaded bytes, once.
    assert fetched.multimodal.image_urls == (data_url(56, 84, seed=1),)
    assert fetched.token_ids == expected.token_ids
    assert fetched.rollout_token_ids == expected.rollout_token_ids
    assert (fetched.multimodal.pixel_values == expected.multimodal.pixel_values).all()


def test_fetch_bounds_come_from_the_vision_processor(image_server: str, tiny_vlm_dir: Path) -> None:
    vision = VisionProcessor.from_pretrained(tiny_vlm_dir)
    vision.remote_image_max_bytes = 100
    compiler = ChatCompiler(load_tokenizer(tiny_vlm_dir), vision=vision)
    message = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"{image_server}/a.png"}}]}]
    with pytest.raises(InvalidRequestError, match="more than the 100-byte limit") as caught:
        observation(compiler, message, delta=True, message_offset=3)
    assert caught.value.param == "messages[3].content[0].image_url.url"
