"""The commands around training, on the same fleet code as ``train``: ``serve`` (the agent API
without a trainer), ``doctor`` (one agent run checked against the contract), ``replay`` (a
dumped step fed back through the trainer) and ``compare`` (runs' curves overlaid)."""
