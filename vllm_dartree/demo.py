"""`make demo`: a self-contained run on tiny local models (no hub, CPU is enough).

Until the dartree engine path lands this is the plugin's smoke demo: it shows the plugin as
vLLM sees it, validates the default dartree configuration, and runs vLLM's in-tree DFlash
method on a tiny target/drafter pair next to target-only decoding.
"""

from __future__ import annotations

import time

from vllm_dartree.testing.engine import prepare_process


def main(argv: list[str] | None = None) -> None:
    prepare_process()
    from importlib.metadata import entry_points

    from vllm_dartree.config import parse_speculative_config
    from vllm_dartree.testing import tiny_models as tm

    plugins = [e.name for e in entry_points(group="vllm.general_plugins")]
    print(f"vLLM general plugins in this environment: {plugins}")
    target = tm.write_target(tm.TargetSpec(with_tokenizer=True))
    drafter = tm.write_drafter(tm.DrafterSpec())
    config = parse_speculative_config({"method": "dartree", "model": str(drafter)})
    print("dartree defaults:", config.model_dump(exclude={"model", "vllm_options"}))

    from vllm import SamplingParams

    from vllm_dartree.testing.engine import build_llm, shutdown_llm, spec_decode_counters

    prompts = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def push("]
    params = SamplingParams(temperature=0.0, max_tokens=32)
    results = {}
    for name, spec in [("target only", None),
                       ("dflash", {"method": "dflash", "model": str(drafter),
                                   "num_speculative_tokens": 15})]:
        start = time.perf_counter()
        llm = build_llm(model=str(target), skip_tokenizer_init=False, speculative_config=spec)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        results[name] = [o.outputs[0].text for o in outputs]
        counters = spec_decode_counters(llm) if spec else {}
        shutdown_llm(llm)
        print(f"\n== {name} ({time.perf_counter() - start:.1f} s)")
        for prompt, text in zip(prompts, results[name]):
            print(f"  {prompt!r} -> {text!r}")
        if counters.get("num_drafts"):
            mean = 1 + counters["num_accepted_tokens"] / counters["num_drafts"]
            print(f"  mean acceptance length (bonus included): {mean:.2f}")
    same = results["target only"] == results["dflash"]
    print(f"\nDFlash output identical to target-only output: {same}")
    print("(random tiny weights: the text is noise; equality is what matters)")
