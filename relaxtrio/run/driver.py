"""The training driver: one trio loop holding the API server, the rollout pipeline and the trainer.

Per step: run ``rollout_batch_size`` Groups through the user's agent → the estimator's advantages →
one policy update (torch, off the trio thread) → write the weights (version directory or shared
memory, :mod:`relaxtrio.run.inference`) → on every engine of the fleet: ``pause_generation(retract)``
→ ``update_weights_from_disk`` → check ``/model_info`` → ``continue_generation`` (generations
still in flight, as with fully async, continue on the new weights and record both versions) →
metrics line → optional eval → with ``--save``, a run checkpoint when due. At the end: a
checkpoint and a reward plot. ``--load`` resumes a checkpointed run (:mod:`relaxtrio.run.checkpoint`).

One step (rollout, update, push, files, eval) is :mod:`relaxtrio.run.step`; where the parts run
(cores, Ray, the agents' API URL) is :mod:`relaxtrio.run.placement`; this module starts the
engines and the agent API, loops over the steps and finishes the run.

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
docs/dashboard.md) shows the run's Groups, Sessions, forests and per-step plots live. With
``--otel-endpoint`` / ``--otel-file`` the run records OpenTelemetry spans (:mod:`relaxtrio.tracing`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from .._errors import BackendError
from .._serving import freeze_startup_heap
from ..api.app import create_app, start_api
from ..api.operator import start_operator
from ..chat.compiler import ChatCompiler
from ..config import AgentConfig, TrainRunConfig
from ..cpu_threads import ThreadSplit
from ..fleet.fleet import EngineFleet, FleetStatistics
from ..rollout.capacity import CapacityPlan, check_external_slots, plan_capacity
from ..rollout.dataset import PromptStream, load_prompts
from ..rollout.eval import EvalDataset
from ..rollout.metrics import MetricsLog, plot_rewards
from ..rollout.operator_view import RunView
from ..rollout.pipeline import open_rollout_pipeline
from ..rollout.turns import EngineTurnHandler
from ..sglang.client import context_token_limit
from ..tracing import current_tracing, trace_run
from ..train import Trainer
from ..train.ranks import RankGroup
from .checkpoint import RunCheckpointer
from .inference import LifecycleRegistry, open_inference
from .placement import (
    advertised_url,
    agent_config,
    engine_starter,
    fleet_config,
    thread_split,
    trainer_threads,
    with_engine_threads,
)
from .run_dirs import hold_run_dirs
from .step import StepOutputs, push_trainer_weights, train_step
from .summary import TrainSummary, summarize_run
from .trackers import Trackers

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


def _resolve_model(cfg: TrainRunConfig) -> Path:
    if cfg.hf_checkpoint is not None:
        return cfg.hf_checkpoint
    from ..models import ensure_smollm2

    return ensure_smollm2()




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
            async with trace_run("rollout" if cfg.rollout_only else "train",
                                 endpoint=cfg.tracing.endpoint, file=cfg.tracing.file):
                return await _run_training(cfg, trackers)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(trackers.close)


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
    outputs = StepOutputs.fresh(cfg, model_dir)

    async with AsyncExitStack() as stack:
        fleet = fleet_config(cfg, trainer)
        inference = await stack.enter_async_context(open_inference(
            fleet, model_dir=model_dir, run_dir=out, engine_args=cfg.engine_args,
            starter=await engine_starter(cfg, fleet)))
        client = inference.fleet
        engines_at_start = len(client.urls)
        if trainer is not None and checkpointer.weight_version is not None:  # resumed: its weights
            await push_trainer_weights(inference, trainer, checkpointer.weight_version)
        elif trainer is not None and not fleet.launches:
            await _warn_foreign_weights(client)
        max_context = cfg.generation.max_context_tokens
        if max_context is None:
            info = await client.server_info()
            max_context = context_token_limit(info)
        handler = EngineTurnHandler(client=client, compiler=compiler, config=cfg.generation)
        registry = LifecycleRegistry(on_end=client.session_ended)
        app = create_app(registry, handler, model_name=model_dir.name, config=cfg.api)
        freeze_startup_heap()  # start-up is done: full GC collections skip its heap from now on
        async with trio.open_nursery() as nursery:
            base_url = await _start_api(nursery, app, cfg)
            view = RunView(kind="rollout" if cfg.rollout_only else "train")
            if cfg.operator_port is not None:
                await start_operator(nursery, view, port=cfg.operator_port, announce=_announce)
            async with open_rollout_pipeline(
                config=cfg.rollout, agent=await agent_config(cfg, agent, stack), registry=registry,
                handler=handler,
                base_url=base_url, prompts=prompts, max_context_tokens=max_context,
                server_template_kwargs=dict(cfg.generation.template_kwargs),
                eval_concurrency=cfg.eval.agentic_eval_concurrency,
            ) as pipeline:
                view.attach(pipeline)
                pipeline.weights.restart(checkpointer.first_rollout_id)  # version = updates applied
                for rollout_id in range(checkpointer.first_rollout_id, cfg.num_rollout):
                    # A stop (Ctrl-C, SIGTERM) that came during the shielded checkpoint write
                    # takes effect here, before the next step starts any agent.
                    await trio.lowlevel.checkpoint()
                    with current_tracing().step_span(rollout_id):
                        row = await train_step(cfg, pipeline, trainer, inference, rollout_id,
                                               eval_sets, outputs, view, split)
                    checkpointer.note_step(rollout_id, row)
                    written = metrics.append(rollout_id, row)
                    view.note_metrics(written)  # the dashboard's step view shows this very row
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


async def _start_api(nursery: trio.Nursery, app: Any, cfg: TrainRunConfig) -> str:
    """Starts the agent API in ``nursery``; returns the base URL agents are given.

    Raises:
        ConfigError: the API cannot listen on ``--agentic-api-host`` / ``--agentic-api-port``.
    """
    d = cfg.distributed
    bound_url = await start_api(nursery, app, host=d.api_host, port=d.api_port, flag="--agentic-api-port")
    base_url = advertised_url(bound_url, d.api_advertise_url)
    log.info("agent API at %s (agents use %s)", bound_url, base_url)
    return base_url


def _warn_lost_engines(stats: FleetStatistics, engines_at_start: int) -> None:
    """Logs a warning when the run ends with fewer engines than it started with (a crash-looping
    engine left the fleet, or a worker stopped answering), naming each one and why."""
    if len(stats.workers) < engines_at_start:
        gone = "; ".join(f"{url}: {why}" for url, why in stats.removed.items())
        log.warning("finished with %d of %d engines (not back: %s)", len(stats.workers),
                    engines_at_start, gone or "unknown")


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
        EvalDataset(name=name, n_samples_per_prompt=size, prompts=tuple(load_prompts(path, **keys)),
                    max_context_tokens=cfg.eval.max_context_tokens)
        for name, path, size in cfg.eval.datasets
    )
    return prompts, eval_sets


async def _finish(out: Path, trainer: Trainer | RankGroup | None, model_dir: Path, metrics: MetricsLog,
                  outputs: StepOutputs, *, first_rollout_id: int = 0,
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
