"""relaxtrio.api."""
