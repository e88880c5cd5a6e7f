"""Test harness: process hygiene first, then a shared in-process engine cache."""

from __future__ import annotations

from vllm_dartree.harness.engine import prepare_process

prepare_process()  # before anything imports vLLM

import os  # noqa: E402

import pytest  # noqa: E402

# tests/v2 runs in a pytest process of its own, on vLLM's V2 runner (see the Makefile).
collect_ignore = [] if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1" else ["v2"]

from vllm_dartree.harness.engine import EngineCache  # noqa: E402
from vllm_dartree.models import tiny as tiny_models  # noqa: E402


@pytest.fixture(scope="session")
def engines():
    cache = EngineCache(max_alive=1)
    yield cache
    cache.close()


@pytest.fixture(scope="session")
def tiny_target():
    return tiny_models.write_target()


@pytest.fixture(scope="session")
def tiny_dflash():
    return tiny_models.write_drafter(tiny_models.DrafterSpec())


@pytest.fixture(scope="session")
def tiny_domino():
    return tiny_models.write_drafter(tiny_models.DrafterSpec(domino=True))


DSPARK = {"block_size": 7, "markov_rank": 16}  # DSpark's released block size


@pytest.fixture(scope="session")
def tiny_dspark():
    """A DSpark-format drafter: Markov head, confidence head, own embed_tokens / lm_head."""
    return tiny_models.write_drafter(tiny_models.DrafterSpec(**DSPARK))


# A hybrid target (Qwen3-Next: 3 GDN layers, then full attention) and drafters reading its
# first GDN layer and its attention layer.
HYBRID_DRAFTER = {"target": tiny_models.HybridTargetSpec(), "target_layer_ids": (0, 3)}


@pytest.fixture(scope="session")
def tiny_hybrid_target():
    return tiny_models.write_hybrid_target()


@pytest.fixture(scope="session")
def tiny_hybrid_domino():
    return tiny_models.write_drafter(tiny_models.DrafterSpec(**HYBRID_DRAFTER, domino=True))


@pytest.fixture(scope="session")
def tiny_hybrid_dspark():
    return tiny_models.write_drafter(tiny_models.DrafterSpec(**HYBRID_DRAFTER, **DSPARK))


@pytest.fixture(scope="session")
def tiny_hybrid_dflash():
    return tiny_models.write_drafter(tiny_models.DrafterSpec(**HYBRID_DRAFTER))


# The same targets with GDN head dim 32, for the Triton (CUDA-path) GDN layer
# (tests/v2/test_v2_cuda_path_hybrid.py), and drafters reading a GDN and an attention layer.
TRITON_HYBRID_DRAFTER = {"target": tiny_models.TRITON_HYBRID_TARGET, "target_layer_ids": (1, 3)}


@pytest.fixture(scope="session")
def tiny_triton_hybrid_target():
    return tiny_models.write_hybrid_target(tiny_models.TRITON_HYBRID_TARGET)


@pytest.fixture(scope="session")
def tiny_triton_hybrid_domino():
    return tiny_models.write_drafter(tiny_models.DrafterSpec(**TRITON_HYBRID_DRAFTER,
                                                             domino=True))


@pytest.fixture(scope="session")
def tiny_triton_hybrid_dspark():
    """Sharing the target's embed_tokens / lm_head, as an untrained drafter then drafts
    tokens the target also favours: some are accepted."""
    return tiny_models.write_drafter(tiny_models.DrafterSpec(**TRITON_HYBRID_DRAFTER, **DSPARK,
                                                             own_embeddings=False))


@pytest.fixture(scope="session")
def tiny_triton_qwen3_5_target():
    return tiny_models.write_qwen3_5_target(tiny_models.TRITON_HYBRID_TARGET)


@pytest.fixture(scope="session")
def tiny_triton_qwen3_5_domino():
    return tiny_models.write_drafter(tiny_models.DrafterSpec(
        **TRITON_HYBRID_DRAFTER, text_weight_prefix="model.language_model.", domino=True))


# Qwen3.5 in its released vision-language layout (M-RoPE; the Qwen3-Next layers' shapes, a
# dense MLP), with drafters naming their backbone by its text-model path.
QWEN3_5_DRAFTER = {**HYBRID_DRAFTER, "text_weight_prefix": "model.language_model."}


@pytest.fixture(scope="session")
def tiny_qwen3_5_target():
    return tiny_models.write_qwen3_5_target()


@pytest.fixture(scope="session")
def tiny_qwen3_5_domino():
    return tiny_models.write_drafter(tiny_models.DrafterSpec(**QWEN3_5_DRAFTER, domino=True))


@pytest.fixture(scope="session")
def tiny_qwen3_5_dflash():
    return tiny_models.write_drafter(tiny_models.DrafterSpec(**QWEN3_5_DRAFTER))


@pytest.fixture(scope="session")
def tiny_dspark_shared():
    """The same without its own embed_tokens / lm_head (vLLM shares the target's)."""
    return tiny_models.write_drafter(tiny_models.DrafterSpec(**DSPARK, own_embeddings=False))


@pytest.fixture(scope="session")
def tiny_dspark_reduced():
    """The same with a reduced draft vocabulary (300 of 512 ids, d2t / t2d)."""
    return tiny_models.write_drafter(tiny_models.DrafterSpec(**DSPARK, draft_vocab_size=300))



@pytest.fixture(scope="session")
def tiny_domino_reduced(tiny_domino, tiny_target, tmp_path_factory):
    """The Domino drafter with a reduced head (models/draft_vocab.py): the target's lm_head
    rows of the 300 lowest of 512 ids, so greedy outputs hold tokens it cannot draft."""
    import torch
    from safetensors.torch import load_file

    from vllm_dartree.models.draft_vocab import write_reduced_drafter

    lm_head = load_file(str(tiny_target / "model.safetensors"))["lm_head.weight"]
    return write_reduced_drafter(tiny_domino, lm_head, torch.arange(300),
                                 tmp_path_factory.mktemp("domino_reduced") / "drafter", {})


@pytest.fixture(scope="session")
def trained_tiny_dspark(tmp_path_factory):
    """(target dir, drafter dir): a DSpark-format drafter (Markov + confidence head, block 7)
    from a short ``train-drafter --head markov`` run on the tiny trained target."""
    from vllm_dartree.models.tiny_pair import TRAINED_TARGET
    from vllm_dartree.training.train import TrainConfig, train

    target = tiny_models.write_target(TRAINED_TARGET)
    cfg = TrainConfig(target=str(target), out=str(tmp_path_factory.mktemp("dspark_run")),
                      head="markov", markov_rank=8, confidence_head=True, block_size=7,
                      steps=30, batch_size=4, seq_len=48, num_sequences=16, threads=1,
                      target_layer_ids=(0, 1), stop_at_eos=False, progress=False)
    return target, train(cfg).drafter_dir


@pytest.fixture(scope="session")
def pair():
    """The tiny target and the drafter trained for it here: (target dir, drafter dir)."""
    from vllm_dartree.models.tiny_pair import trained_tiny_pair

    return trained_tiny_pair()


@pytest.fixture
def preemptions(monkeypatch):
    """The request ids vLLM's scheduler preempts while the test runs (in-process engines).
    vLLM's CPU worker sizes its KV cache from VLLM_CPU_KVCACHE_SPACE, whatever
    ``kv_cache_memory_bytes`` says: a test that needs preemption sets
    ``num_gpu_blocks_override`` and checks this list."""
    from vllm.v1.core.sched.scheduler import Scheduler

    preempted: list[str] = []
    preempt = Scheduler._preempt_request

    def counting(self, request, *args, **kwargs):
        preempted.append(request.request_id)
        return preempt(self, request, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "_preempt_request", counting)
    return preempted


@pytest.fixture(scope="module")
def one_core_per_rank():
    """vLLM-CPU refuses TP=2 on two cores unless each rank is bound to its own core."""
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    yield
    mp.undo()


# vLLM's lattice drafters (DFlash2, LiLiCorr), random, for the tiny target, in vLLM's own
# layouts (models/tiny_lattice.py): config and refusal tests (trained: tests/v2/conftest.py).
@pytest.fixture(scope="session")
def tiny_dflash2():
    from vllm_dartree.models.tiny_lattice import write_tiny_dflash2

    return write_tiny_dflash2(tiny_models.TargetSpec())


@pytest.fixture(scope="session")
def tiny_lilicorr():
    from vllm_dartree.models.tiny_lattice import write_tiny_lilicorr

    return write_tiny_lilicorr(tiny_models.TargetSpec())
