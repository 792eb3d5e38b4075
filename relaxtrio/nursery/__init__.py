"""relaxtrio.nursery."""
