"""The training tools' drafters (``tests/tools/tool_writers.py``: SpecForge, Model-Optimizer and
speculators, each written by its own code) on vLLM's V2 runner, the runner of vLLM 0.33 and
0.34: every row that loads decodes as the target alone as a pruned tree, speculators'
DFlash2 (which vLLM serves on V2 only) as a chain too, with its block size 8 read from the
checkpoint's config.json (vLLM's conversion drops it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))

from test_tool_checkpoints import LOADS  # noqa: E402
from tool_writers import ROW, write  # noqa: E402

from vllm_dartree.checkpoint import DrafterLayout  # noqa: E402
from vllm_dartree.config import carried_layout  # noqa: E402
from vllm_dartree.harness.engine import (  # noqa: E402
    drafter_of,
    generate_ids,
    spec_decode_counters,
)
from vllm_dartree.models.tiny import TargetSpec, random_prompts  # noqa: E402

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(4, TargetSpec().vocab_size, seed=56, min_len=2, max_len=24)
BATCH = {"max_num_seqs": 4, "max_num_batched_tokens": 512}
DFLASH2 = "speculators-dflash2-full_attention=True"
# the sliding_window_non_causal row reads as the plain full-attention row (tests/tools)
CASES = [(name, "pruned") for name in LOADS if "sliding_window_non_causal" not in name]
CASES.append((DFLASH2, "chain"))


def params():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def baseline(engines, tiny_target):
    return generate_ids(engines.get(model=str(tiny_target), **BATCH), PROMPTS, params())


@pytest.mark.parametrize(("name", "tree"), CASES, ids=[f"{n}-{t}" for n, t in CASES])
def test_the_tools_drafter_decodes_as_the_target_alone_on_v2(engines, tiny_target, baseline,
                                                             name, tree):
    folder = write(ROW[name])
    llm = engines.get(model=str(tiny_target), **BATCH, speculative_config={
        "method": "dartree", "model": str(folder), "tree": tree})
    assert type(drafter_of(llm)).__name__.startswith("DARTree")  # V2 speculator: ours
    assert carried_layout(llm.llm_engine.vllm_config.speculative_config) == \
        DrafterLayout.from_dir(folder)
    assert generate_ids(llm, PROMPTS, params()) == baseline
    assert spec_decode_counters(llm)["num_drafts"] > 0
    if name == DFLASH2:
        assert LOADS[name][1:3] == ("dflash2", 8)
