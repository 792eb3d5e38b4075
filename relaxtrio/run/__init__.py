"""The training job: the driver loop, the run's inference side and its weight pushes, run
checkpoints, the run summary and the trackers (:mod:`relaxtrio.run.driver` is where a step is
sequenced: rollout, update, push, metrics, eval, checkpoint)."""
