"""speculators' DFlash2 drafter (``tests/tools/tool_writers.py``: speculators 0.9.0's own code,
every draft layer full attention), which vLLM serves on its V2 runner only: a dartree engine
reads its block size from the checkpoint's config.json (8: vLLM's conversion drops it), and
its output equals target-only's as a chain and as a pruned tree."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))

from tool_writers import ROW, write  # noqa: E402

from vllm_dartree.checkpoint import DrafterLayout  # noqa: E402
from vllm_dartree.config import carried_layout  # noqa: E402
from vllm_dartree.harness.engine import generate_ids, spec_decode_counters  # noqa: E402
from vllm_dartree.models.tiny import TargetSpec, random_prompts  # noqa: E402

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(4, TargetSpec().vocab_size, seed=56, min_len=2, max_len=24)
BATCH = {"max_num_seqs": 4, "max_num_batched_tokens": 512}
DRAFTER = "speculators-dflash2-full_attention=True"


def params():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def baseline(engines, tiny_target):
    return generate_ids(engines.get(model=str(tiny_target), **BATCH), PROMPTS, params())


@pytest.mark.parametrize("tree", ["chain", "pruned"])
def test_speculators_dflash2_decodes_as_the_target_alone(engines, tiny_target, baseline, tree):
    folder = write(ROW[DRAFTER])
    llm = engines.get(model=str(tiny_target), **BATCH, speculative_config={
        "method": "dartree", "model": str(folder), "tree": tree})
    layout = carried_layout(llm.llm_engine.vllm_config.speculative_config)
    assert layout == DrafterLayout.from_dir(folder)
    assert (layout.lattice, layout.block_size) == ("dflash2", 8)
    assert generate_ids(llm, PROMPTS, params()) == baseline
    assert spec_decode_counters(llm)["num_drafts"] > 0
