"""A fleet of one engine, as the commands open for a single engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from relaxtrio.config import FleetConfig
from relaxtrio.fleet.fleet import EngineFleet, open_engine_fleet


@asynccontextmanager
async def open_fleet_of_one(url: str) -> AsyncIterator[EngineFleet]:
    """The fleet (default settings) of the engine at ``url``: what a turn handler generates with."""
    async with open_engine_fleet(FleetConfig(), worker_urls=[url]) as fleet:
        yield fleet
