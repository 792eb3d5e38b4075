"""Starting the agent API: a port that cannot be bound is a flag error, not a traceback."""

from __future__ import annotations

import socket

import pytest
import trio
from quart_trio import QuartTrio

from relaxtrio._errors import ConfigError
from relaxtrio.api.app import start_api


async def test_a_port_in_use_is_a_config_error_naming_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with trio.open_nursery() as nursery:
            with pytest.raises(ConfigError, match=f"--port {port}: the agent API cannot listen on 127.0.0.1:{port}") as err:
                await start_api(nursery, QuartTrio(__name__), host="127.0.0.1", port=port, flag="--port")
            assert err.value.param == "--port"


async def test_a_free_port_gives_the_agents_base_url() -> None:
    async with trio.open_nursery() as nursery:
        url = await start_api(nursery, QuartTrio(__name__), host="127.0.0.1", port=0, flag="--port")
        assert url.startswith("http://127.0.0.1:") and url.endswith("/agentic_api/")
        nursery.cancel_scope.cancel()
