"""relaxtrio.engine."""
