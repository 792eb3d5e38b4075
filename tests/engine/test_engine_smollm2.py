"""The embedded engine on the real SmolLM2-135M-Instruct (converted once into the user cache)."""

from __future__ import annotations

import httpx
import pytest
import torch
import trio

from relaxtrio.engine.server import EngineConfig, serve_engine
from relaxtrio.models import ensure_smollm2, load_model, load_tokenizer


@pytest.mark.slow
async def test_smollm2_answers_and_logprobs_match_a_full_forward(nursery: trio.Nursery) -> None:
    model_dir = await trio.to_thread.run_sync(ensure_smollm2)  # $RELAXTRIO_CACHE_DIR or ~/.cache
    tokenizer = load_tokenizer(model_dir)
    url = await nursery.start(serve_engine, EngineConfig(model_path=model_dir, max_running_requests=4))
    questions = ["What is the capital of France?", "Name a primary colour."]
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        for q in questions
    ]
    bodies: dict[int, dict] = {}

    async def ask(i: int, http: httpx.AsyncClient) -> None:
        sampling = {"max_new_tokens": 24, "temperature": 0.0 if i == 0 else 0.7, "sampling_seed": 5}
        r = await http.post("/generate", json={"input_ids": prompts[i], "return_logprob": True,
                                               "sampling_params": sampling})
        assert r.status_code == 200, r.text
        bodies[i] = r.json()

    with trio.fail_after(120):
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            async with trio.open_nursery() as inner:  # two rows decoded together
                for i in range(2):
                    inner.start_soon(ask, i, http)
    answer = bodies[0]
    assert "Paris" in answer["text"]
    assert answer["meta_info"]["finish_reason"] == {"type": "stop", "matched": tokenizer.eos_token_id}
    assert answer["output_ids"][-1] == tokenizer.eos_token_id

    model = load_model(model_dir)
    for i, temperature in ((0, 1.0), (1, 0.7)):
        ids = bodies[i]["output_ids"]
        served = torch.tensor([row[0] for row in bodies[i]["meta_info"]["output_token_logprobs"]])
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([prompts[i] + ids])).logits[0]  # (T, V)
        rows = torch.log_softmax(logits[len(prompts[i]) - 1 : -1] / temperature, dim=-1)  # (N, V)
        ref = rows.gather(1, torch.tensor(ids).unsqueeze(1)).squeeze(1)
        assert float((served - ref).abs().max()) < 1e-4
