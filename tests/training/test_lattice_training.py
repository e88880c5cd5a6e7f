"""z-lab (non-shift) backbone training, the DFlash2/LiLiCorr lattice heads on it, their
export in vLLM's layouts, and the twins against vLLM's own modules (no engine)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import vllm_dartree.models.tiny as tm
import vllm_dartree.models.tiny_lattice as tl
from vllm_dartree.checkpoint import DFLASH2, LILICORR, DrafterLayout
from vllm_dartree.models.tiny_pair import TRAINED_TARGET
from vllm_dartree.training.data import generate_responses
from vllm_dartree.training.lattice import (
    CandidateSelectorTwin,
    LatticeHeadConfig,
    LiLiCorrTwin,
    collect_examples,
    export_lattice,
    greedy_walk,
    lattice_scores,
    lilicorr_keys,
    load_lattice,
    new_head,
    teacher_rows,
    train_head,
)
from vllm_dartree.training.model import IGNORE_INDEX, BlockDrafter, block_labels
from vllm_dartree.training.train import (
    NO_HEAD,
    TrainConfig,
    load_drafter,
    target_tables,
    train,
)

BLOCK = 5


def zlab_spec(block_size: int = BLOCK) -> tm.DrafterSpec:
    return tm.DrafterSpec(target=TRAINED_TARGET, block_size=block_size)


def zlab_drafter(target, block_size: int = BLOCK, seed: int = 0) -> BlockDrafter:
    """A random head-less backbone in the layout tiny.py writes (the target's tables)."""
    model = BlockDrafter(tm.drafter_layout(zlab_spec(block_size)), *target_tables(target))
    model.reset_parameters(torch.Generator().manual_seed(seed))
    return model.eval()


def randomise(module: torch.nn.Module, seed: int, std: float = 0.3) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * std)
    return module


def lilicorr_config(**changes) -> LatticeHeadConfig:
    return LatticeHeadConfig(**({"kind": LILICORR, "lilicorr_hidden_size": 32,
                                 "lilicorr_factor_dim": 8} | changes))


# ------------------------------------------------------------------------ backbone
def test_non_shift_labels():
    tokens = torch.arange(10, 30).view(1, -1)
    labels = block_labels(tokens, torch.tensor([[4, 16]]), torch.tensor([19]), 4, shift=False)
    assert labels[0, 0].tolist() == [IGNORE_INDEX, 15, 16, 17]  # slot j: x_{p+j}
    assert labels[0, 1].tolist() == [IGNORE_INDEX, 27, 28, IGNORE_INDEX]  # length 19
    shifted = block_labels(tokens, torch.tensor([[4]]), torch.tensor([19]), 4)
    assert shifted[0, 0].tolist() == [15, 16, 17, 18]  # the shift layout is unchanged


def test_non_shift_trainer_learns_and_exports_zlab(target_dir, tmp_path):
    result = train(TrainConfig(
        target=str(target_dir), out=str(tmp_path), steps=40, head=NO_HEAD, block_size=BLOCK,
        target_layer_ids=(0, 1), lr=1e-2, batch_size=8, anchors_per_sequence=4, seq_len=48,
        num_sequences=24, prompt_max_len=12, stop_at_eos=False, progress=False, threads=1))
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < 0.8 * first, (first, last)
    config = json.loads((result.drafter_dir / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert "shift_label" not in config["dflash_config"]  # z-lab's layout: absent = False
    layout = DrafterLayout.from_config(config)
    assert (layout.head, layout.shift_label, layout.num_depths) == (None, False, BLOCK - 1)
    # z-lab's weight names (no head, no embed/lm_head), as tiny.py writes a DFlash drafter
    with safe_open(str(result.drafter_dir / "model.safetensors"), "pt") as f:
        exported = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    released = tm.drafter_weights(zlab_spec())
    assert exported == {k: tuple(v.shape) for k, v in released.items()}


def test_zlab_drafter_round_trip(target, tmp_path):
    from vllm_dartree.training.train import export_drafter

    model = zlab_drafter(target)
    out = export_drafter(model, tmp_path / "d")
    again = load_drafter(out, model.embed, model.lm_head).eval()
    assert again.arch == model.arch and again(*inputs(model)).corrected_logits is None
    torch.testing.assert_close(again(*inputs(model)).base_logits,
                               model(*inputs(model)).base_logits)
    # a released z-lab checkpoint loads as it is too
    loaded = load_drafter(tm.write_drafter(zlab_spec()), model.embed, model.lm_head)
    assert loaded.arch.head is None and not loaded.arch.shift_label


def inputs(model: BlockDrafter):
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, model.arch.vocab_size - 1, (2, 20), generator=gen)
    features = torch.randn(2, 20, 2 * model.arch.hidden_size, generator=gen)
    return features, tokens, torch.tensor([[3, 9], [5, 12]])


# ------------------------------------------------------------------------ heads
@pytest.fixture(scope="module")
def examples(target):
    model = zlab_drafter(target)
    prompts = tm.random_prompts(12, TRAINED_TARGET.vocab_size, seed=4, max_len=10)
    seqs = generate_responses(target, prompts, 24, stop_at_eos=False)
    return model, collect_examples(model, target, seqs.sequences, seqs.prompt_lens, 8, 4)


def test_examples_follow_vllm_layout(examples):
    model, ex = examples
    n = BLOCK - 1
    assert ex.hidden.shape[1:] == (n, model.arch.hidden_size)
    assert ex.candidates.shape[1:] == ex.logits.shape[1:] == (n, 4)
    # candidates: the top-K of the target lm_head over the backbone's slot 1..N states
    logits = ex.hidden @ model.lm_head.T
    torch.testing.assert_close(ex.logits, logits.topk(4).values)
    torch.testing.assert_close(ex.log_probs, ex.logits - logits.logsumexp(-1, keepdim=True))


@pytest.mark.parametrize("kind", [DFLASH2, LILICORR])
def test_lattice_head_learns(examples, kind):
    model, ex = examples
    cfg = (LatticeHeadConfig(kind=DFLASH2, selector_rank=8) if kind == DFLASH2
           else lilicorr_config())
    cfg = replace(cfg, steps=60, batch_size=32, lr=1e-2, holdout=0.0)
    result = train_head(cfg, ex, model.arch, model.embed)
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < 0.8 * first, (first, last)
    assert 0.0 <= result.stats["row_acc"] <= 1.0 and result.stats["tau_walk"] >= 1.0


def test_selector_teacher_rows_are_lattice_rows(examples):
    """Where the target's previous token is a candidate, its teacher-forced row is that
    candidate's row of the lattice (depth 1: every row, the root's)."""
    model, ex = examples
    head = randomise(new_head(LatticeHeadConfig(selector_rank=8), model.arch), 1)
    rows, _ = teacher_rows(head, ex, model.embed)
    scores = lattice_scores(head, ex, model.embed)
    torch.testing.assert_close(rows[:, 0], scores[:, 0, 0])
    prev = ex.label_index()[:, :-1]
    m, d = torch.nonzero(prev >= 0, as_tuple=True)
    torch.testing.assert_close(rows[m, d + 1], scores[m, d + 1, prev[m, d]])


def test_greedy_walk_follows_rows():
    scores = torch.zeros(1, 3, 2, 2)
    scores[0, 0, :, 1] = 1  # depth 1: candidate 1
    scores[0, 1, 1, 0] = 1  # from candidate 1: candidate 0
    scores[0, 1, 0, 1] = 5  # (row 0 is not the one walked)
    scores[0, 2, 0, 1] = 1  # from candidate 0: candidate 1
    candidates = torch.tensor([[[10, 11], [20, 21], [30, 31]]])
    assert greedy_walk(scores, candidates).tolist() == [[11, 20, 31]]


# ------------------------------------------------------------------------ export
@pytest.mark.parametrize("kind", [DFLASH2, LILICORR])
def test_export_is_vllms_layout(target, tmp_path, kind):
    """The trained export's weight names and shapes equal the random fixtures' (vLLM's
    loader names) and its config is theirs; the export loads back to the same lattice."""
    model = zlab_drafter(target)
    cfg = LatticeHeadConfig(kind=DFLASH2) if kind == DFLASH2 else lilicorr_config()
    head = randomise(new_head(cfg, model.arch), 2)
    out = export_lattice(model, head, cfg, tmp_path / kind)
    spec = tl.LatticeSpec(backbone=zlab_spec(), head=cfg)  # the random fixtures' writer
    config = json.loads((out / "config.json").read_text())
    assert config == tl.lattice_config(spec)
    layout = DrafterLayout.from_config(config)
    assert (layout.lattice, layout.lattice_top_k, layout.shift_label) == (kind, 4, False)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        exported = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert exported == {k: tuple(v.shape) for k, v in tl.lattice_weights(spec).items()}
    again, head_again, cfg_again = load_lattice(out, model.embed, model.lm_head)
    assert cfg_again == cfg
    ex = collect_examples(model, target, [torch.arange(1, 30) % 30], [5], 4, cfg.top_k)
    torch.testing.assert_close(lattice_scores(head_again, ex, model.embed),
                               lattice_scores(head, ex, model.embed))


def test_identity_conv_is_exported_for_dflash2(target, tmp_path):
    model = zlab_drafter(target)
    cfg = LatticeHeadConfig(kind=DFLASH2, conv_kernel_size=3, conv_group_size=32)
    out = export_lattice(model, new_head(cfg, model.arch), cfg, tmp_path / "d")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        base = f.get_tensor("layers.0.attention_conv.base_kernel")
        proj = f.get_tensor("layers.0.mlp_conv.kernel_projection.weight")
    assert base.shape == (2, 3, 64) and proj.shape == (2 * 3 * 2, 64)
    assert torch.equal(base[:, 0], torch.ones(2, 64)) and not base[:, 1:].any()
    assert not proj.any()


# ------------------------------------------------------------------------ vLLM twins
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed")


@needs_vllm
def test_selector_twin_matches_vllm_score_edges():
    from vllm.model_executor.models.qwen3_dflash2 import _score_edges

    gen = torch.Generator().manual_seed(0)
    twin = randomise(CandidateSelectorTwin(hidden_size=16, vocab_size=20, rank=6, top_k=3), 0)
    candidates = torch.randint(0, 20, (4, 5, 3), generator=gen)
    unary = torch.randn(4, 5, 3, generator=gen)
    hidden = torch.randn(4, 5, 16, generator=gen)
    roots = torch.randint(0, 20, (4,), generator=gen)
    with torch.no_grad():
        ours = twin(candidates, unary, hidden, roots)
        theirs = _score_edges(twin.predecessor_codebook, twin.successor_codebook, candidates,
                              unary, twin.hidden_projection(hidden), roots, 3)
        rows = twin.edge_rows(candidates[:, 1:], unary[:, 1:], hidden[:, 1:],
                              candidates[:, :-1, 2])
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(rows, ours[:, 1:, 2])  # row of candidate 2 of the depth before


VLLM_LILICORR_SCRIPT = textwrap.dedent("""
    import tempfile, sys
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config
    from vllm.config.compilation import CompilationMode
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.models.lilicorr import LiLiCorrHead
    from vllm_dartree.training.lattice import LiLiCorrTwin, lilicorr_keys, LatticeHeadConfig

    config = VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.NONE))
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method="file://" + tempfile.mktemp())
        initialize_model_parallel(1, 1)
    failures = []
    for hidden in (32, 64):
        keys = lilicorr_keys(LatticeHeadConfig(kind="lilicorr", lilicorr_hidden_size=hidden,
                                               lilicorr_factor_dim=8, lilicorr_num_layers=2))
        kwargs = dict(model_hidden_size=64, block_size=9, rms_norm_eps=1e-6, config=keys)
        with set_current_vllm_config(config):
            theirs = LiLiCorrHead(**kwargs)
        ours = LiLiCorrTwin(**kwargs)
        gen = torch.Generator().manual_seed(hidden)
        with torch.no_grad():
            for p in ours.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        names = {n for n, _ in theirs.named_parameters()}
        if names != set(ours.state_dict()):
            failures.append(f"names differ: {sorted(names ^ set(ours.state_dict()))}")
            continue
        theirs.load_state_dict(ours.state_dict())
        for m in theirs.modules():
            if isinstance(m, LinearBase):
                m.cpu_linear = F.linear  # what process_weights_after_loading sets on CPU
        theirs.materialize_inference_buffers(torch.device("cpu"), torch.float32)
        for slots in (8, 5):
            b, k = 3, 4
            args = (torch.randn(b, slots, k, 64, generator=gen),
                    torch.randn(b, slots, k, generator=gen).log_softmax(-1),
                    torch.randn(b, slots, 64, generator=gen), torch.randn(b, 64, generator=gen),
                    torch.tensor([True, False, True]))
            with torch.no_grad(), set_current_vllm_config(config):
                want = theirs(*args)
                got = ours(*args)
            err = (want - got).abs().max().item() if want.shape == got.shape else None
            close = want.shape == got.shape and torch.allclose(want, got, rtol=1e-4, atol=1e-4)
            if not (close and torch.isfinite(want).all() and want.std() > 0.1):
                failures.append(f"hidden {hidden} slots {slots}: {tuple(want.shape)} vs "
                                f"{tuple(got.shape)}, max error {err}")
    print("FAILURES:", failures)
    sys.exit(1 if failures else 0)
""")


@needs_vllm
def test_lilicorr_twin_matches_vllm_head():
    """vLLM's LiLiCorrHead built outside an engine (a world of one, compilation off) on the
    twin's random weights: same parameter names, same scores (also for a shorter draft,
    an invalid anchor, token_proj present or the identity). In a subprocess: it sets up
    vLLM's process-global distributed state."""
    run = subprocess.run([sys.executable, "-c", VLLM_LILICORR_SCRIPT], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]


def test_lilicorr_twin_shapes():
    head = LiLiCorrTwin(model_hidden_size=64, block_size=BLOCK, rms_norm_eps=1e-6,
                        config=lilicorr_keys(lilicorr_config()))
    head.reset_parameters(torch.Generator().manual_seed(0))
    assert isinstance(head.token_proj, torch.nn.Linear)
    scores = head(torch.randn(2, 3, 4, 64), torch.randn(2, 3, 4).log_softmax(-1),
                  torch.randn(2, 3, 64), torch.randn(2, 64), torch.ones(2, dtype=torch.bool))
    assert scores.shape == (2, 3, 4, 4)
    torch.testing.assert_close(scores[:, 0, 0], scores[:, 0, 3])  # depth 1: the start row


def test_non_shift_backbone_matches_the_independent_reference(target, target_dir, tmp_path):
    """The trainer's z-lab drafter drafts what tests/integration's independent DFlash
    reference drafts for the first block after a prefill (slots 1..N, each its own
    position)."""
    from vllm_dartree.training.data import target_features
    from vllm_dartree.training.lattice import backbone_view
    from vllm_dartree.training.train import export_drafter

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
    import dflash_reference as ref

    model = zlab_drafter(target, block_size=9)
    reference = ref.load_drafter(export_drafter(model, tmp_path / "d"))
    prompt, root = [5, 9, 3, 17, 2, 8, 11], 13
    block = ref.draft_block(reference, ref.prefill_target(target_dir, prompt), len(prompt), root)
    tokens = torch.tensor([prompt + [root]])
    features = target_features(target, tokens, model.arch.target_layer_ids)
    ex = backbone_view(model, features, tokens, torch.tensor([[len(prompt)]]),
                       torch.tensor([len(prompt) + 1]), top_k=4)
    torch.testing.assert_close(ex.hidden[0], block.hidden, rtol=1e-4, atol=1e-4)
    assert ex.roots.tolist() == [root]


def test_trained_tiny_lattice_pair_pipeline(tmp_path, monkeypatch):
    """The cached pair, on a few steps in a private cache: both formats written, read back
    as vLLM's layouts, cached (a second call trains nothing), and the proxy runs."""
    from vllm_dartree.models.tiny_lattice_pair import (
        TrainedBackboneSpec,
        acceptance_proxy,
        lattice_spec,
        trained_tiny_lattice_pair,
    )

    monkeypatch.setenv("VLLM_DARTREE_CACHE", str(tmp_path))
    backbone = TrainedBackboneSpec(steps=6, num_sequences=12, seq_len=40, batch_size=4,
                                   anchors_per_sequence=4)
    for kind in (DFLASH2, LILICORR):
        spec = replace(lattice_spec(kind, steps=4, batch_size=8, anchors_per_sequence=4),
                       backbone=backbone)
        target, drafter = trained_tiny_lattice_pair(kind, spec)
        assert drafter.parent == tmp_path / "models" / "tiny"
        layout = DrafterLayout.from_dir(drafter)
        assert (layout.lattice, layout.block_size, layout.num_hidden_layers) == (kind, 9, 2)
        stamp = (drafter / "model.safetensors").stat().st_mtime_ns
        assert trained_tiny_lattice_pair(kind, spec) == (target, drafter)
        assert (drafter / "model.safetensors").stat().st_mtime_ns == stamp
        proxy = acceptance_proxy(target, drafter, num_prompts=2, max_new_tokens=8)
        assert proxy["tau_walk"] >= 1.0 and proxy["tau_chain"] >= 1.0
    assert len(list((tmp_path / "models" / "tiny").glob("trained-zlab-*"))) == 1
