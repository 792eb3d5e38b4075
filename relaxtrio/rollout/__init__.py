"""relaxtrio.rollout."""
