"""Shared test helpers (not tests): scripted engine, tiny models, agent scripts."""
