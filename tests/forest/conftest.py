"""Hypothesis profiles for the forest suite.

``forest-default`` (60 examples) runs by default; ``FAST=1`` selects ``forest-fast`` (15 examples);
``FOREST_HYPOTHESIS_PROFILE=forest-ci`` runs 300 derandomized examples. No example database is
kept (Hypothesis still caches constants under the git-ignored ``.hypothesis/``).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "database": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("forest-default", max_examples=60, **_COMMON)
settings.register_profile("forest-fast", max_examples=15, **_COMMON)
settings.register_profile("forest-ci", max_examples=300, derandomize=True, **_COMMON)
