"""The command line: ``python -m relaxtrio train | rollout | serve | doctor | replay``.

Each subcommand's flags (grouped as ``train --help`` shows them) become a typed configuration
from :mod:`relaxtrio.config`; :func:`main` dispatches to the training job (:mod:`relaxtrio.run`)
or to a tool (:mod:`relaxtrio.tools`). Nothing below this package imports it.
"""

from .main import main as main

__all__ = ["main"]
