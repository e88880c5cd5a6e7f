"""Each training tool's tiny drafter (``tool_writers``) served by a dartree engine on the
tiny target: the engine's drafter is ours with the layout the tool wrote, and its output
equals target-only's, as a chain and as a pruned tree; the rows the reader refuses are
refused by the engine with the same line, before any weight loads."""

from __future__ import annotations

import pytest
from test_tool_checkpoints import LOADS, REFUSED
from tool_writers import ROW, write

from vllm_dartree.checkpoint import DrafterLayout
from vllm_dartree.harness.engine import drafter_of, generate_ids, spec_decode_counters
from vllm_dartree.models.tiny import TargetSpec, random_prompts

pytestmark = pytest.mark.e2e

PROMPTS = random_prompts(8, TargetSpec().vocab_size, seed=56, min_len=2, max_len=40)
BATCH = {"max_num_seqs": 8}
# Not run here: DFlash2 (vLLM serves lattice drafters on its V2 runner only), and the
# sliding_window_non_causal row, whose layout is the plain full-attention row's.
ENGINE_ROWS = [name for name in LOADS
               if "dflash2" not in name and "sliding_window_non_causal" not in name]


def params():
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def baseline(engines, tiny_target):
    return generate_ids(engines.get(model=str(tiny_target), **BATCH), PROMPTS, params())


@pytest.mark.parametrize("tree", ["chain", "pruned"])
@pytest.mark.parametrize("name", ENGINE_ROWS)
def test_the_tools_drafter_decodes_as_the_target_alone(engines, tiny_target, baseline, name,
                                                       tree):
    folder = write(ROW[name])
    llm = engines.get(model=str(tiny_target), **BATCH, speculative_config={
        "method": "dartree", "model": str(folder), "tree": tree})
    model = drafter_of(llm).model
    assert type(model).__name__ == "DARTreeDraftModel"
    assert model.layout == DrafterLayout.from_dir(folder)
    if model.layout.confidence_head:
        assert model.has_confidence_head
    assert generate_ids(llm, PROMPTS, params()) == baseline
    assert spec_decode_counters(llm)["num_drafts"] > 0


@pytest.mark.parametrize("name", list(REFUSED))
def test_the_engine_refuses_what_the_reader_refuses(engines, tiny_target, name):
    with pytest.raises(ValueError) as refused:  # DrafterConfigError, or vLLM's wrapper
        engines.get(model=str(tiny_target), **BATCH, speculative_config={
            "method": "dartree", "model": str(write(ROW[name]))})
    assert REFUSED[name] in str(refused.value)
