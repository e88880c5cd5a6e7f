"""How much the GDN layers decide the tiny hybrid fixtures' output, and how many prompts keep
clear margins (float32 transformers, CPU; no vLLM).

    .venv/bin/python benchmarks/hybrid_gdn_share.py

For the default Qwen3-Next (``write_hybrid_target``) and Qwen3.5 (``write_qwen3_5_target``)
fixtures, and their GDN-head-dim-32 versions for the Triton path (``TRITON_HYBRID_TARGET``): greedy decoding of 24 tokens for tests/v2/test_v2_hybrid.py's 48 candidate prompts,
once as written and once with every GDN layer's ``out_proj`` zeroed. The GDN share is the
fraction of generated tokens (position-wise) that differ: a fixture whose output the
attention/MLP layers alone decide would let a broken GDN state (wrong slot, shifted conv
window) pass the hybrid tests. The clear-margin counts are the prompts whose greedy top-1
minus top-2 logit margin stays >= 0.15 (the tests' MIN_MARGIN) and >= 0.25 at every token:
only on those do the tests compare bfloat16 engines with float32 greedy decoding.
"""

from __future__ import annotations

import time

import torch

from vllm_dartree.models import tiny

MAX_TOKENS = 24
MARGINS = (0.15, 0.25)


def greedy(model: torch.nn.Module, prompt: list[int]) -> tuple[list[int], float]:
    """(tokens, smallest top-1 - top-2 logit margin), decoded as the tests do (no cache)."""
    ids, tokens, margin = torch.tensor([prompt]), [], float("inf")
    for _ in range(MAX_TOKENS):
        logits = model(ids).logits[0, -1].float()
        top = logits.topk(2).values
        margin = min(margin, float(top[0] - top[1]))
        tokens.append(int(logits.argmax()))
        ids = torch.cat([ids, ids.new_tensor([[tokens[-1]]])], dim=1)
    return tokens, margin


def zero_gdn_outputs(model: torch.nn.Module) -> None:
    for name, weight in model.named_parameters():
        if name.endswith("linear_attn.out_proj.weight"):
            weight.zero_()


def measure(model: torch.nn.Module, prompts: list[list[int]]) -> dict[str, float]:
    """GDN share and clear-margin prompt counts of ``model`` (float32, modified in place)."""
    start = time.perf_counter()
    full = [greedy(model, prompt) for prompt in prompts]
    seconds = time.perf_counter() - start
    zero_gdn_outputs(model)
    ablated = [greedy(model, prompt)[0] for prompt in prompts]
    differ = sum(a != b for (tokens, _), other in zip(full, ablated)
                 for a, b in zip(tokens, other))
    return {"gdn_share": differ / (len(prompts) * MAX_TOKENS),
            **{f"clear@{m}": sum(margin >= m for _, margin in full) for m in MARGINS},
            "greedy_pass_s": seconds}


def load(kind: str, spec: tiny.HybridTargetSpec) -> torch.nn.Module:
    if kind == "qwen3_next":
        from transformers import Qwen3NextForCausalLM as cls
        path = tiny.write_hybrid_target(spec)
    else:
        from transformers import Qwen3_5ForConditionalGeneration as cls
        path = tiny.write_qwen3_5_target(spec)
    return cls.from_pretrained(str(path), torch_dtype=torch.float32).eval()


def main() -> None:
    import transformers

    torch.set_num_threads(1)  # a tiny model: one thread is as fast and spares shared cores
    transformers.logging.set_verbosity_error()  # the GDN kernels' fallback notice
    transformers.utils.logging.disable_progress_bar()
    cpu, triton = tiny.HybridTargetSpec(), tiny.TRITON_HYBRID_TARGET
    prompts = tiny.random_prompts(48, cpu.vocab_size, seed=21, min_len=2, max_len=40)
    with torch.no_grad():
        for kind, spec in (("qwen3_next", cpu), ("qwen3_5", cpu), ("qwen3_next (head 32)", triton),
                           ("qwen3_5 (head 32)", triton)):
            result = measure(load(kind.split()[0], spec), prompts)
            print(f"{kind}: GDN share {result['gdn_share']:.3f}, clear-margin prompts "
                  + ", ".join(f">= {m}: {result[f'clear@{m}']}/48" for m in MARGINS)
                  + f" (one float32 greedy pass: {result['greedy_pass_s']:.1f} s)")


if __name__ == "__main__":
    main()
