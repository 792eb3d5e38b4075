"""The TRL side of benchmarks/learning.py: TRL's ``GRPOTrainer`` (trl==1.16.0, the ``bench``
extra) trains the same SmolLM2-135M-Instruct weights on the single-turn variant of
examples/stock_lookup, with the settings learning.py uses, and evaluates the same held-out split.

Why single-turn: the stock-lookup agent's second turn is a user message that depends on the
first reply (feedback). TRL 1.16 expresses multi-turn rollouts as model-initiated tool calls
(``tools`` / ``environment_factory``, which need a tool-calling chat template SmolLM2 lacks) or
as an experimental ``rollout_func``; neither runs the agent unchanged, so both systems train the
one-turn variant (``learning.py --variant single``) for the comparison.

Matched settings: the prompts (train.jsonl as chat messages, the model's own chat template),
``num_generations`` = group size, prompts per optimizer step, lr (AdamW, constant), KL 0
(``beta=0``), clipping 0.2 / 0.28 (``epsilon``, ``epsilon_high``), token-mean loss (``dapo``),
GRPO group normalisation, one optimizer step per generation batch, max tokens, temperature.
TRL generates with transformers' ``generate`` on the CPU, as its docs do without vLLM.

The eval (every ``--eval-every`` steps and before training): each of the 200 held-out prompts
sampled once at the training temperature with the same token limit, graded by the same
``stock.is_correct``; pass@1 with its 95% Wilson interval. Eval and start-up time are excluded
from ``wall_s``.

    python benchmarks/learning_trl.py --seeds 1 2 --steps 16 --eval-every 4 --lr 2e-5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import TASK, add_common_flags, emit, eval_record, plot, settings

sys.path.insert(0, str(TASK))
from stock import is_correct


def _rows(split: str) -> list[dict[str, Any]]:
    path = TASK / "data" / f"{split}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [{"prompt": [{"role": "user", "content": r["input"]}], "answer": r["metadata"]["answer"],
             "others": r["metadata"]["others"]} for r in rows]


def stock_reward(completions: list[list[dict[str, str]]], answer: list[str], others: list[list[str]],
                 **_: Any) -> list[float]:
    """TRL reward function: 1.0 per completion that ``stock.is_correct`` accepts, else 0.0."""
    return [float(is_correct(c[-1]["content"], a, o)) for c, a, o in zip(completions, answer, others, strict=True)]


def evaluate(model: Any, tokenizer: Any, rows: list[dict[str, Any]], args: argparse.Namespace) -> float:
    """pass@1 over ``rows``: one sampled reply each (batches of 50, left-padded)."""
    import torch

    was_training = model.training
    model.eval()
    solved = 0
    tokenizer.padding_side = "left"
    for start in range(0, len(rows), 50):
        batch = rows[start:start + 50]
        texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in batch]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=args.max_tokens, do_sample=True,
                                 temperature=args.temperature, top_p=1.0, top_k=0,
                                 pad_token_id=tokenizer.pad_token_id)
        for row, ids in zip(batch, out, strict=True):
            reply = tokenizer.decode(ids[enc.input_ids.shape[1]:], skip_special_tokens=True)
            solved += is_correct(reply, row["answer"], row["others"])
    model.train(was_training)
    return solved / len(rows)


def run_seed(args: argparse.Namespace, seed: int, sink: Path) -> None:
    """Loads the weights, evaluates them, trains ``args.steps`` steps with an eval every
    ``args.eval_every``; one JSON line per eval into ``sink``."""
    import torch
    from datasets import Dataset
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        TrainerCallback,
        set_seed,
    )
    from trl import GRPOConfig, GRPOTrainer

    from relaxtrio.models import ensure_smollm2

    set_seed(seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = ensure_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    eval_rows = _rows("eval")
    common = {"system": "trl", "variant": "single", "seed": seed}
    clock = {"start": 0.0, "eval_s": 0.0, "diff": [], "clip": []}

    def run_eval(step: int, reward_mean: float | None = None) -> None:
        t0 = time.monotonic()
        pass1 = evaluate(model, tokenizer, eval_rows, args)
        spent = time.monotonic() - t0
        wall = 0.0 if step == 0 else t0 - clock["start"] - clock["eval_s"]
        clock["eval_s"] += spent
        emit(eval_record(pass1, len(eval_rows), **common, step=step, wall_s=round(wall, 1),
                         samples=step * args.prompts_per_step * args.group_size, eval_s=round(spent, 1),
                         reward_mean=reward_mean, clip_fraction=_mean(clock["clip"])), sink)
        clock["clip"] = []

    class EvalEvery(TrainerCallback):
        last_reward: float | None = None

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            clock["start"] = time.monotonic()
            clock["eval_s"] = 0.0  # the base eval ran before the clock started: not training time

        def on_log(self, _args: Any, _state: Any, _control: Any, logs: dict | None = None, **__: Any) -> None:
            logs = logs or {}
            self.last_reward = logs.get("reward", self.last_reward)
            clip = [v for k, v in logs.items() if k.startswith("clip_ratio/region_mean")]
            if clip:
                clock["clip"].append(clip[0])

        def on_step_end(self, _args: Any, state: Any, _control: Any, **__: Any) -> None:
            if state.global_step % args.eval_every == 0:
                run_eval(state.global_step, self.last_reward)

    config = GRPOConfig(
        output_dir=str(args.work / f"trl_seed{seed}"), seed=seed, data_seed=seed, use_cpu=True, bf16=False,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        per_device_train_batch_size=args.group_size, gradient_accumulation_steps=args.prompts_per_step,
        num_generations=args.group_size, max_steps=args.steps, max_completion_length=args.max_tokens,
        temperature=args.temperature, top_p=1.0, top_k=0, beta=0.0, epsilon=0.2, epsilon_high=0.28,
        loss_type="dapo", scale_rewards="group", num_iterations=1, logging_steps=1, save_strategy="no",
        report_to=[], disable_tqdm=True, dataloader_num_workers=0,
        gradient_checkpointing=False,  # TRL turns it on by default to save memory; relaxtrio does not recompute
    )
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[stock_reward],
                          args=config, train_dataset=Dataset.from_list(_rows("train")), callbacks=[EvalEvery()])
    run_eval(0)  # after the trainer is built, so that a bad setting fails before the long eval
    trainer.train()


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 5) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_flags(parser)
    parser.add_argument("--work", type=Path, default=Path("/tmp/relaxtrio-learning"))
    args = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"settings": settings(args), "system": "trl", "variant": "single"}), flush=True)
    for seed in args.seeds:
        sink = args.out / f"trl_single_seed{seed}{args.tag}.jsonl"
        sink.write_text("")
        run_seed(args, seed, sink)
    print(f"curve: {plot(args.out)}")


if __name__ == "__main__":
    main()
