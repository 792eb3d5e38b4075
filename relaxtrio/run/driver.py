"""The training driver: one trio loop holding the API server, the rollout pipeline and the trainer.

Per step: run ``rollout_batch_size`` Groups through the user's agent → the estimator's advantages →
one policy update (torch, off the trio thread) → write the weights (version directory or shared
memory, :mod:`relaxtrio.run.inference`) → on every engine of the fleet: ``pause_generation(retract)``
→ ``update_weights_from_disk`` → check ``/model_info`` → ``continue_generation`` (generations
still in flight, as with fully async, continue on the new weights and record both versions) →
metrics line → optional eval → with ``--save``, a run checkpoint when due. At the end: a
checkpoint and a reward plot. ``--load`` resumes a checkpointed run (:mod:`relaxtrio.run.checkpoint`).

Rollout only (``TrainRunConfig.rollout_only``): no trainer is loaded, nothing is pushed or
checkpointed; each step's samples are appended to a JSONL file instead.

What a run leaves in its directory besides metrics and checkpoints: ``run.log`` (the log lines
of the run, as the console shows them), ``engine.log`` (the embedded engine), ``agent_logs/``
(the whole log of every agent whose Session failed; logs of Sessions that completed are
removed), and with ``--use-tensorboard`` / ``--use-wandb`` the trackers' files
(:mod:`relaxtrio.run.trackers`). Either way, with
``debug_rollout_data`` every step also writes a debug dump (:mod:`relaxtrio.rollout.dumps`,
docs/dumps.md) after its update, so the dump holds the trainer's statistics next to the samples
it trained on. With ``operator_port`` the operator listener (``/debug_state``, ``/dashboard``,
docs/dashboard.md) shows the run's Groups, Sessions, forests and per-step plots live.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from .._errors import BackendError, ConfigError
from .._serving import freeze_startup_heap
from ..api.app import create_app, serve_api
from ..api.operator import start_operator
from ..chat.compiler import ChatCompiler
from ..config import AgentConfig, FleetConfig, TrainRunConfig
from ..cpu_threads import ThreadSplit, available_cpus, split_cpu_threads
from .inference import Inference, LifecycleRegistry, open_inference
from ..rollout.capacity import CapacityPlan, check_external_slots, plan_capacity
from ..rollout.dataset import PromptStream, load_prompts
from ..rollout.dumps import (
    append_samples,
    dump_path,
    step_dump,
    step_samples,
    write_dump,
)
from ..rollout.eval import EvalDataset, run_eval
from ..rollout.metrics import MetricsLog, plot_rewards
from ..rollout.operator_view import RunView
from ..rollout.pipeline import RolloutPipeline, open_rollout_pipeline
from ..rollout.step import StepResult, group_metrics
from ..rollout.turns import EngineTurnHandler
from .checkpoint import RunCheckpointer, hold_run_dirs, weight_version_name
from .summary import TrainSummary, summarize_run
from ..sglang.client import context_token_limit
from ..fleet.fleet import EngineFleet, FleetStatistics
from ..fleet.launch_fleet import detect_engine_kind
from ..fleet.starter import EngineStarter
from .trackers import Trackers
from ..train import Trainer, TrainStats
from ..train.ranks import RankGroup

log = logging.getLogger(__name__)


def check_capacity(cfg: TrainRunConfig) -> CapacityPlan:
    """Evaluates the capacity formula and refuses a run the external executor cannot hold.

    Logs nothing: :func:`run_training` logs the plan once (the command line checks it before
    starting the run too, so a logging check printed the line twice).

    Returns:
        The capacity plan.

    Raises:
        ConfigError: ``agent_external_slots`` is below the required slots (unless
            ``skip_capacity_check``).
    """
    r = cfg.rollout
    plan = plan_capacity(
        agentic_concurrency=r.concurrency,
        n_samples_per_prompt=r.n_samples_per_prompt,
        eval_group_sizes=[(name, size) for name, _, size in cfg.eval.datasets],
        agentic_eval_concurrency=cfg.eval.agentic_eval_concurrency,
        prelaunch=r.prelaunch, partial_rollout=r.partial_rollout, fully_async=r.fully_async,
    )
    if not cfg.skip_capacity_check:
        check_external_slots(plan, cfg.agent_external_slots)
    return plan


def _log_capacity(cfg: TrainRunConfig, plan: CapacityPlan) -> None:
    log.info("agent capacity: %s", plan.describe())
    if cfg.skip_capacity_check and cfg.agent_external_slots is not None \
            and cfg.agent_external_slots < plan.required:
        log.warning("capacity check skipped although %d slots < %d required; the barrier "
                    "watchdog will report stuck Groups", cfg.agent_external_slots, plan.required)


RUN_LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextmanager
def record_run_log(path: Path) -> Iterator[Path]:
    """Copies relaxtrio's log lines (at the level the console shows) to ``path`` while inside.

    The file is appended to, so a resumed run keeps the interrupted run's lines before its own.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(RUN_LOG_FORMAT))
    logger = logging.getLogger("relaxtrio")
    logger.addHandler(handler)
    try:
        yield path
    finally:
        logger.removeHandler(handler)
        handler.close()


def _announce(line: str) -> None:
    """Prints a start-up line for the operator (stdout, not the log: it carries the token)."""
    print(line, flush=True)


_OPTIONAL_TRAIN_METRICS = (
    "kl_loss", "reward_shaping_kl", "dual_clip_fraction", "tis_weight_mean", "tis_clip_fraction",
    "icepop_masked_fraction", "opsm_masked_fraction", "advantage_mean", "advantage_std",
)


def optional_train_metrics(stats: TrainStats) -> dict[str, float]:
    """The step's metrics that only some configurations produce (finite values only).

    The three meanings of KL stay apart: ``ppo_kl`` (old/current ratio, always logged),
    ``kl_loss`` (``--use-kl-loss``) and ``reward_shaping_kl`` (``--kl-coef``).
    """
    out = {name: getattr(stats, name) for name in _OPTIONAL_TRAIN_METRICS
           if math.isfinite(getattr(stats, name))}
    if stats.offpolicy_masked_tokens:
        out["offpolicy_masked_tokens"] = float(stats.offpolicy_masked_tokens)
    return out


def _resolve_model(cfg: TrainRunConfig) -> Path:
    if cfg.hf_checkpoint is not None:
        return cfg.hf_checkpoint
    from ..models import ensure_smollm2

    return ensure_smollm2()


async def push_weights(client: EngineFleet, weights_dir: Path, version: str) -> None:
    """Loads new weights into every engine without losing in-flight generations.

    Cancellation:
        Shielded: once started, the pause/update/continue sequence completes (or fails) so the
        engines are never left paused.
    """
    with trio.CancelScope(shield=True):
        await client.pause_generation("retract")
        try:
            await client.update_weights_from_disk(str(weights_dir), weight_version=version)
        finally:
            await client.continue_generation()


@attrs.frozen(kw_only=True)
class _StepOutputs:
    """Where a step's samples and dumps go (see :class:`TrainRunConfig`)."""

    model_dir: Path
    samples_path: Path | None
    dump_template: str | None

    @classmethod
    def fresh(cls, cfg: TrainRunConfig, model_dir: Path) -> _StepOutputs:
        """The run's outputs; a rollout-only samples file starts empty."""
        samples_path = cfg.rollout_samples_path if cfg.rollout_only else None
        if samples_path is not None:
            samples_path.parent.mkdir(parents=True, exist_ok=True)
            samples_path.write_text("", encoding="utf-8")
        return cls(model_dir=model_dir, samples_path=samples_path, dump_template=cfg.debug_rollout_data)

    def write(self, cfg: TrainRunConfig, result: StepResult, trainer: Trainer | RankGroup | None,
              stats: Any) -> None:
        """Appends the rollout-only samples and writes the step's debug dump (blocking I/O)."""
        if self.samples_path is not None:
            append_samples(self.samples_path, result.rollout_id, step_samples(result))
        if self.dump_template is None:
            return
        path = write_dump(dump_path(self.dump_template, result.rollout_id), step_dump(
            result,
            model_dir=str(self.model_dir),
            generation=attrs.asdict(cfg.generation),
            rollout_config={"n_samples_per_prompt": cfg.rollout.n_samples_per_prompt,
                            "reward_key": cfg.rollout.reward_key,
                            "custom_advantage": cfg.rollout.custom_advantage is not None,
                            "advantage_estimator": cfg.rollout.advantage_estimator,
                            "grpo_std_normalization": cfg.rollout.grpo_std_normalization},
            trainer_config=None if trainer is None else attrs.asdict(trainer.config),
            train=None if stats is None else attrs.asdict(stats),
        ))
        log.info("rollout %d debug dump: %s", result.rollout_id, path)


async def _train_step(
    cfg: TrainRunConfig,
    pipeline: RolloutPipeline,
    trainer: Trainer | RankGroup | None,
    inference: Inference,
    rollout_id: int,
    eval_sets: tuple[EvalDataset, ...],
    outputs: _StepOutputs,
    view: RunView,
    split: ThreadSplit,
) -> dict[str, Any]:
    """One rollout step, one update (none when ``trainer`` is None: rollout only), the weight
    push, the step's samples/dump files and the optional eval; returns metrics (and shows the
    step on the operator dashboard).

    Timings in the row (wall seconds): ``rollout_s``; ``train_s`` from the update's start to the
    engines running the new weights, split into ``update_s`` (``Trainer.train_step``) and
    ``weight_sync_s`` (writing the weights, then pause, reload and continue on every worker);
    ``eval_s``; ``step_s`` for all of it. A CPU trainer in this process trains with its share of
    the cores while train Groups use the CPU, and with ``split.trainer_solo_threads`` once none
    does (none resident, or only prelaunched ones whose agents all wait for their lease:
    ``RolloutPipeline.groups_use_cpu``; :mod:`relaxtrio.cpu_threads`)."""
    step_start = time.monotonic()
    last = rollout_id == cfg.num_rollout - 1
    result = await pipeline.run_step(rollout_id, last=last, steps_left=cfg.num_rollout - 1 - rollout_id)
    if cfg.rollout.fully_async and not last:  # the next step generates while this one trains
        pipeline.backfill(rollout_id + 1)
    row: dict[str, Any] = dict(group_metrics(result, cfg.rollout))
    stats = None
    if result.samples and trainer is not None:
        train_start = time.monotonic()
        if isinstance(trainer, Trainer):
            threads = split.update_threads(busy=lambda: pipeline.groups_use_cpu)
            update = functools.partial(trainer.train_step, threads=threads)
        else:
            update = trainer.train_step
        stats = await trio.to_thread.run_sync(update, result.samples, result.advantages)
        push_start = time.monotonic()
        row["weight_sync_s"] = await _push(inference, trainer, weight_version_name(rollout_id))
        push_end = time.monotonic()
        row.update(
            loss=stats.loss, clip_fraction=stats.clip_fraction, ppo_kl=stats.ppo_kl,
            grad_norm=stats.grad_norm, entropy=stats.entropy,
            rollout_logprob_abs_diff=stats.rollout_logprob_abs_diff,
            train_tokens=stats.num_tokens, train_s=push_end - train_start,
            update_s=push_start - train_start,
        )
        row.update(optional_train_metrics(stats))
    elif not result.samples:
        log.warning("rollout %d produced no samples; skipping the update", rollout_id)
    await trio.to_thread.run_sync(outputs.write, cfg, result, trainer, stats)
    if eval_sets and cfg.eval.interval and (rollout_id + 1) % cfg.eval.interval == 0:
        eval_start = time.monotonic()
        row.update(await run_eval(pipeline, eval_sets))
        row["eval_s"] = time.monotonic() - eval_start
    row["step_s"] = time.monotonic() - step_start
    view.note_step(result, step_s=row["step_s"])
    return row


async def run_training(cfg: TrainRunConfig) -> TrainSummary:
    """Runs the whole training job.

    Raises:
        BackendError: the engine failed to start or to take new weights.
        ConfigError: bad prompt data, or too few external agent slots.

    Cancellation:
        Cancelling (e.g. Ctrl-C) terminates every agent process group and the embedded engine
        before returning; the ranks of a sharded trainer are ended too (shielded).
    """
    plan = check_capacity(cfg)
    out = cfg.output_dir
    out.mkdir(parents=True, exist_ok=True)
    with record_run_log(out / "run.log"):
        _log_capacity(cfg, plan)
        trackers = await trio.to_thread.run_sync(Trackers.open, cfg.trackers, _tracker_run_config(cfg))
        try:
            return await _run_training(cfg, trackers)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(trackers.close)


def thread_split(cfg: TrainRunConfig) -> ThreadSplit:
    """The run's split of the cores between the driver's trainer and the embedded engines it
    launches here (:mod:`relaxtrio.cpu_threads`; looks for SGLang and GPUs)."""
    d = cfg.distributed
    trainer_here = (not cfg.rollout_only and d.world_size == 1 and d.ray_address is None
                    and cfg.train.device == "cpu")
    local = cfg.fleet.launches and d.ray_address is None and detect_engine_kind() == "embedded"
    return split_cpu_threads(cpus=available_cpus(), num_local_engines=cfg.fleet.num_engines if local else 0,
                             trainer_here=trainer_here, trainer_threads=cfg.trainer_num_threads,
                             engine_threads=cfg.engine_num_threads)


@contextmanager
def trainer_threads(split: ThreadSplit) -> Iterator[None]:
    """Inside, this process's torch threads are the trainer's share (restored on the way out:
    the setting is process-wide)."""
    log.info("%s", split.describe())
    if not split.trainer_threads:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(split.trainer_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def with_engine_threads(cfg: TrainRunConfig, split: ThreadSplit) -> TrainRunConfig:
    """``cfg`` with the engines' share of the cores in their flags (``--num-threads``)."""
    if not split.engine_threads:
        return cfg
    return attrs.evolve(cfg, engine_args=(*cfg.engine_args, "--num-threads", str(split.engine_threads)))


def _tracker_run_config(cfg: TrainRunConfig) -> dict[str, Any]:
    """The run settings a tracker records (W&B's run config)."""
    r = cfg.rollout
    return {"num_rollout": cfg.num_rollout, "n_samples_per_prompt": r.n_samples_per_prompt,
            "rollout_batch_size": r.rollout_batch_size, "prompt_data": str(cfg.prompt_data),
            "output_dir": str(cfg.output_dir), "rollout_only": cfg.rollout_only,
            "generation": attrs.asdict(cfg.generation), "train": attrs.asdict(cfg.train)}


async def _run_training(cfg: TrainRunConfig, trackers: Trackers) -> TrainSummary:
    """The body of :func:`run_training`, inside its run log and trackers.

    Cancellation:
        As :func:`run_training`.
    """
    split = await trio.to_thread.run_sync(thread_split, cfg)
    with trainer_threads(split):
        return await _run_split(with_engine_threads(cfg, split), trackers, split)


async def _run_split(cfg: TrainRunConfig, trackers: Trackers, split: ThreadSplit) -> TrainSummary:
    """:func:`_run_training` once the cores are split (:mod:`relaxtrio.cpu_threads`)."""
    with hold_run_dirs(cfg.output_dir, cfg.save_dir):  # one run per directory
        return await _run_held(cfg, trackers, split)


async def _run_held(cfg: TrainRunConfig, trackers: Trackers, split: ThreadSplit) -> TrainSummary:
    """:func:`_run_split` while this process holds its run directories."""
    out = cfg.output_dir
    agent = attrs.evolve(cfg.agent, failed_log_dir=out / "agent_logs")
    checkpointer = RunCheckpointer.open(cfg)
    metrics = checkpointer.open_metrics(out / "metrics.jsonl")
    model_dir = await trio.to_thread.run_sync(_resolve_model, cfg)
    compiler = await trio.to_thread.run_sync(ChatCompiler.from_pretrained, model_dir)
    prompts, eval_sets = _load_datasets(cfg)
    checkpointer.restore_prompts(prompts)
    trainer: Trainer | RankGroup | None = None
    if not cfg.rollout_only:
        log.info("loading trainer model from %s", model_dir if checkpointer.resume is None
                 else f"the checkpoint {checkpointer.resume.checkpoint_dir} (base model {model_dir})")
        trainer = await trio.to_thread.run_sync(checkpointer.load_trainer, model_dir)
    try:
        return await _run_loaded(cfg, checkpointer, metrics, model_dir, compiler, prompts, eval_sets,
                                 trainer, agent=agent, trackers=trackers, split=split)
    finally:
        if isinstance(trainer, RankGroup):  # sharded: end every rank (and its Ray actor)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(trainer.close)


async def _run_loaded(
    cfg: TrainRunConfig,
    checkpointer: RunCheckpointer,
    metrics: MetricsLog,
    model_dir: Path,
    compiler: ChatCompiler,
    prompts: PromptStream,
    eval_sets: tuple[EvalDataset, ...],
    trainer: Trainer | RankGroup | None,
    *,
    agent: AgentConfig,
    trackers: Trackers,
    split: ThreadSplit,
) -> TrainSummary:
    """The engines, the agent API and the step loop, once the trainer (if any) is loaded."""
    out = cfg.output_dir
    outputs = _StepOutputs.fresh(cfg, model_dir)

    async with AsyncExitStack() as stack:
        fleet_config = _fleet_config(cfg, trainer)
        inference = await stack.enter_async_context(open_inference(
            fleet_config, model_dir=model_dir, run_dir=out, engine_args=cfg.engine_args,
            starter=await _engine_starter(cfg, fleet_config)))
        client = inference.fleet
        engines_at_start = len(client.urls)
        if trainer is not None and checkpointer.weight_version is not None:  # resumed: its weights
            await _push(inference, trainer, checkpointer.weight_version)
        elif trainer is not None and not fleet_config.launches:
            await _warn_foreign_weights(client)
        max_context = cfg.generation.max_context_tokens
        if max_context is None:
            info = await client.server_info()
            max_context = context_token_limit(info)
        handler = EngineTurnHandler(client=client, compiler=compiler, config=cfg.generation)
        registry = LifecycleRegistry(on_end=client.session_ended)
        app = create_app(registry, handler, model_name=model_dir.name)
        freeze_startup_heap()  # start-up is done: full GC collections skip its heap from now on
        async with trio.open_nursery() as nursery:
            d = cfg.distributed
            try:
                bound_url = await nursery.start(functools.partial(serve_api, app, host=d.api_host, port=d.api_port))
            except OSError as exc:  # raised by the bind, before the API started
                raise ConfigError(f"--agentic-api-port {d.api_port}: the agent API cannot listen on "
                                  f"{d.api_host}:{d.api_port} ({exc.strerror or exc})",
                                  param="--agentic-api-port") from exc
            base_url = advertised_url(bound_url, d.api_advertise_url)
            log.info("agent API at %s (agents use %s)", bound_url, base_url)
            view = RunView(kind="rollout" if cfg.rollout_only else "train")
            if cfg.operator_port is not None:
                await start_operator(nursery, view, port=cfg.operator_port, announce=_announce)
            async with open_rollout_pipeline(
                config=cfg.rollout, agent=await _agent_config(cfg, agent, stack), registry=registry,
                handler=handler,
                base_url=base_url, prompts=prompts, max_context_tokens=max_context,
                server_template_kwargs=dict(cfg.generation.template_kwargs),
                eval_concurrency=cfg.eval.agentic_eval_concurrency,
            ) as pipeline:
                view.attach(pipeline)
                for rollout_id in range(checkpointer.first_rollout_id, cfg.num_rollout):
                    # A stop (Ctrl-C, SIGTERM) that came during the shielded checkpoint write
                    # takes effect here, before the next step starts any agent.
                    await trio.lowlevel.checkpoint()
                    row = await _train_step(cfg, pipeline, trainer, inference, rollout_id,
                                            eval_sets, outputs, view, split)
                    checkpointer.note_step(rollout_id, row)
                    written = metrics.append(rollout_id, row)
                    await trio.to_thread.run_sync(trackers.log, rollout_id, written)
                    log.info("step %d metrics %s", rollout_id,
                             json.dumps(metrics.rows[-1], sort_keys=True))
                    if trainer is not None and checkpointer.save_due(rollout_id):
                        await checkpointer.save(rollout_id, trainer=trainer, pipeline=pipeline,
                                                metrics=metrics, tokenizer_dir=model_dir)
            _warn_lost_engines(client.statistics(), engines_at_start)
            nursery.cancel_scope.cancel()
    return await _finish(out, trainer, model_dir, metrics, outputs,
                         first_rollout_id=checkpointer.first_rollout_id,
                         saved_groups=checkpointer.saved_groups)


def _warn_lost_engines(stats: FleetStatistics, engines_at_start: int) -> None:
    """Logs a warning when the run ends with fewer engines than it started with (a crash-looping
    engine left the fleet, or a worker stopped answering), naming each one and why."""
    if len(stats.workers) < engines_at_start:
        gone = "; ".join(f"{url}: {why}" for url, why in stats.removed.items())
        log.warning("finished with %d of %d engines (not back: %s)", len(stats.workers),
                    engines_at_start, gone or "unknown")


def _fleet_config(cfg: TrainRunConfig, trainer: Trainer | RankGroup | None) -> FleetConfig:
    """The fleet settings; a sharded trainer's rank 0 writes each version to disk, so
    ``--weight-sync auto`` means ``disk`` there.

    Raises:
        ConfigError: ``--weight-sync shm`` with a sharded trainer.
    """
    if not isinstance(trainer, RankGroup) or cfg.fleet.weight_sync == "disk":
        return cfg.fleet
    if cfg.fleet.weight_sync == "shm":
        raise ConfigError("--weight-sync shm needs a one-process trainer (the ranks of a sharded "
                          "trainer write their gathered weights to disk)", param="--weight-sync")
    return attrs.evolve(cfg.fleet, weight_sync="disk")


async def _engine_starter(cfg: TrainRunConfig, fleet: FleetConfig) -> EngineStarter | None:
    """Where launched engines run: Ray actors with ``--ray-address`` (connects to Ray), else
    None (processes here).

    Raises:
        ConfigError: no Ray cluster at ``--ray-address``.
    """
    d = cfg.distributed
    if d.ray_address is None or not fleet.launches:
        return None
    from ..cluster.engines import RayEngineStarter

    return await trio.to_thread.run_sync(
        functools.partial(RayEngineStarter.connect, d.ray_address, num_cpus=d.engine_num_cpus))


INITIAL_WEIGHT_VERSION: Final = "default"
"""The version label of the weights before any update (what SGLang and the embedded engine report
at start-up)."""


async def _warn_foreign_weights(fleet: EngineFleet) -> None:
    """Warns about connected engines that report another version than
    :data:`INITIAL_WEIGHT_VERSION` at the start of a fresh run: they were updated before (by an
    earlier run, say), so step 0 samples with those weights, not ``--hf-checkpoint``'s."""
    for url in fleet.urls:
        try:
            version = (await fleet.model_info(url)).get("weight_version")
        except BackendError:
            continue
        if version not in (None, INITIAL_WEIGHT_VERSION):
            log.warning("the engine at %s holds weight version %r, not the initial %r: it was "
                        "updated before (by an earlier run?), so step 0 samples with those "
                        "weights rather than --hf-checkpoint's; restart it for a clean start",
                        url, version, INITIAL_WEIGHT_VERSION)


async def _push(inference: Inference, trainer: Trainer | RankGroup, version: str) -> float:
    """Push the trainer's current weights to every worker as ``version``; returns seconds."""
    if isinstance(trainer, RankGroup):
        return await inference.push_saved(trainer.save_weights, version)
    model, state_dict = trainer.engine_weights()  # LoRA: the base model and the merged weights
    return await inference.push(model, version, state_dict=state_dict)


def advertised_url(bound_url: str, advertise_url: str | None) -> str:
    """The ``RELAX_BASE_URL`` agents get: ``advertise_url`` (with the bound port when it names
    none, and the bound path when it has none), or the bound URL itself."""
    if advertise_url is None:
        return bound_url
    want, bound = urllib.parse.urlsplit(advertise_url), urllib.parse.urlsplit(bound_url)
    netloc = want.netloc if want.port is not None else f"{want.hostname}:{bound.port}"
    path = want.path if want.path not in ("", "/") else bound.path
    return urllib.parse.urlunsplit((want.scheme or "http", netloc, path, "", ""))


async def _agent_config(cfg: TrainRunConfig, agent: AgentConfig, stack: AsyncExitStack) -> AgentConfig:
    """``agent``, with the Ray agent pool as its launcher for ``--agent-executor ray`` (connects
    to Ray; the pool is entered into ``stack``, which kills every agent actor on the way out).

    Raises:
        ConfigError: no Ray cluster at ``--ray-address``.
    """
    d = cfg.distributed
    if d.agent_executor != "ray":
        return agent
    from ..cluster.agents import open_ray_agent_pool
    from ..cluster.runtime import connect

    assert d.ray_address is not None  # DistributedConfig checks it
    await trio.to_thread.run_sync(connect, d.ray_address, abandon_on_cancel=True)  # SIGTERM still ends the run
    if d.api_host in ("127.0.0.1", "localhost") and d.api_advertise_url is None:
        log.warning("--agent-executor ray with the agent API on loopback: agents placed on other "
                    "nodes cannot reach it (set --agentic-api-host and --agentic-api-advertise-url)")
    pool = await stack.enter_async_context(open_ray_agent_pool(d.agent_num_cpus))
    return attrs.evolve(agent, launcher=pool.run_agent)


def _load_datasets(cfg: TrainRunConfig) -> tuple[PromptStream, tuple[EvalDataset, ...]]:
    """The train prompt stream and the eval datasets.

    Raises:
        InvalidRequestError: bad prompt data.
    """
    keys: dict[str, Any] = {"input_key": cfg.input_key, "metadata_key": cfg.metadata_key}
    if cfg.multimodal_keys:
        keys["multimodal_keys"] = cfg.multimodal_keys
    prompts = PromptStream(
        prompts=load_prompts(cfg.prompt_data, **keys),
        shuffle=cfg.rollout_shuffle,
        seed=cfg.seed,
    )
    eval_sets = tuple(
        EvalDataset(name=name, n_samples_per_prompt=size, prompts=tuple(load_prompts(path, **keys)))
        for name, path, size in cfg.eval.datasets
    )
    return prompts, eval_sets


async def _finish(out: Path, trainer: Trainer | RankGroup | None, model_dir: Path, metrics: MetricsLog,
                  outputs: _StepOutputs, *, first_rollout_id: int = 0,
                  saved_groups: int = 0) -> TrainSummary:
    """Writes the final checkpoint (none for rollout only) and the reward plot (the weight store
    removed its files), and logs the run's totals (this process's too when it resumed at
    ``first_rollout_id``; ``saved_groups``: the run-end Groups the end-of-run ``--save``
    checkpoint saved for an extension).

    Cancellation:
        A checkpoint while the checkpoint is written in a worker thread (the write completes).
    """
    checkpoint_dir = None
    if trainer is not None:
        checkpoint_dir = out / "checkpoint"
        await trio.to_thread.run_sync(trainer.save_checkpoint, checkpoint_dir, model_dir)
    plot_path = plot_rewards(metrics.rows, out / "reward.png")
    return summarize_run(metrics.path, metrics.rows, plot_path=plot_path, checkpoint_dir=checkpoint_dir,
                         first_rollout_id=first_rollout_id, samples_path=outputs.samples_path,
                         saved_groups=saved_groups)
