"""Write tiny models, from a seed, in the exact on-disk formats users load.

- a Qwen3 target (``Qwen3ForCausalLM``, safetensors, untied embeddings);
- a z-lab-style DFlash drafter (``DFlashDraftModel``, non-shift layout, no embed/lm_head);
- a Domino drafter (the same backbone plus ``prefix_gru`` and ``embed_proj``, shift layout);
- a hybrid Qwen3-Next target (``Qwen3NextForCausalLM``: three Gated-DeltaNet layers per full
  attention layer as released, GDN weights large enough to decide most tokens, a small MoE,
  bfloat16 as vLLM's CPU GDN requires), the released Qwen3.5 family's text layers (Qwen3.5
  itself does not import here: see the README);
- a DSpark drafter (``Qwen3DSparkModel``: the same backbone plus ``markov_head`` and, as the
  releases ship them, ``confidence_head``, its own ``embed_tokens``/``lm_head`` copies and,
  for a reduced draft vocabulary, ``d2t``/``t2d``; anchor-first block).

Every writer is deterministic in its arguments and caches its output under
``.cache/models/tiny/`` keyed by those arguments, so a test session writes each model once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from vllm_dartree.checkpoint import HEAD_PREFIXES, DrafterLayout
from vllm_dartree.env import cache_dir

TINY_ROPE_THETA = 10000.0
# CPU attention supports only these head sizes.
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class TargetSpec:
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    # Large init and untied embeddings give varied greedy output (std 0.02 repeats a token).
    init_std: float = 0.5
    max_position_embeddings: int = 2048
    seed: int = 0
    with_tokenizer: bool = False


@dataclass(frozen=True)
class DrafterSpec:
    target: TargetSpec = field(default_factory=TargetSpec)
    num_hidden_layers: int = 1
    block_size: int = 16
    target_layer_ids: tuple[int, ...] = (0, 1)
    domino: bool = False
    gru_hidden_dim: int = 64
    emb_dim: int = 32
    pure_draft_prefix_len: int = 1
    markov_rank: int = 0  # > 0: a DSpark drafter with a Markov head of this rank
    confidence_head: bool = True  # DSpark only, fed the Markov embedding as in the release
    draft_vocab_size: int | None = None  # DSpark only: a reduced output vocabulary
    # DSpark only: ship own embed_tokens / lm_head copies (DeepSpec's export); without them
    # vLLM shares the target's.
    own_embeddings: bool = True
    # Prefix of the backbone's weight names: "model.language_model." as in drafters trained
    # beside a vision-language target (Qwen3.5/3.6), "" as in z-lab's DFlash.
    text_weight_prefix: str = ""
    init_std: float = 0.1
    seed: int = 1

    @property
    def dspark(self) -> bool:
        return self.markov_rank > 0

    @property
    def kind(self) -> str:
        return "dspark" if self.dspark else "domino" if self.domino else "dflash"

    @property
    def mask_token_id(self) -> int:
        # Like Qwen3's <|MASK|>: a row of the embedding the tokenizer never produces.
        return self.target.vocab_size - 1


TINY_VOCAB_TARGET = TargetSpec(vocab_size=48, seed=3)


def _cached_dir(kind: str, spec: object, write) -> Path:
    """Return the cache folder for ``spec``; write it atomically if absent."""
    payload = json.dumps({"kind": kind, **asdict(spec)}, sort_keys=True, default=str)
    digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
    out = cache_dir() / "models" / "tiny" / f"{kind}-{digest}"
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=out.parent))
    try:
        write(tmp)
        (tmp / "spec.json").write_text(payload)
        shutil.rmtree(out, ignore_errors=True)  # an incomplete earlier write
        os.replace(tmp, out)
    except OSError:
        if not (out / "config.json").exists():  # lost a race only if the winner finished
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _normal(gen: torch.Generator, std: float, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen) * std


def _attention_and_mlp(
    gen: torch.Generator, prefix: str, hidden: int, inter: int, heads: int, kv: int, hd: int,
    std: float,
) -> dict[str, torch.Tensor]:
    """Weights of one Qwen3 decoder layer, by their Hugging Face names."""
    scale = std / max(1.0, (hidden / 64) ** 0.5)
    return {
        f"{prefix}.self_attn.q_proj.weight": _normal(gen, scale, heads * hd, hidden),
        f"{prefix}.self_attn.k_proj.weight": _normal(gen, scale, kv * hd, hidden),
        f"{prefix}.self_attn.v_proj.weight": _normal(gen, scale, kv * hd, hidden),
        f"{prefix}.self_attn.o_proj.weight": _normal(gen, scale, hidden, heads * hd),
        f"{prefix}.self_attn.q_norm.weight": torch.ones(hd),
        f"{prefix}.self_attn.k_norm.weight": torch.ones(hd),
        f"{prefix}.mlp.gate_proj.weight": _normal(gen, scale, inter, hidden),
        f"{prefix}.mlp.up_proj.weight": _normal(gen, scale, inter, hidden),
        f"{prefix}.mlp.down_proj.weight": _normal(gen, scale, hidden, inter),
        f"{prefix}.input_layernorm.weight": torch.ones(hidden),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(hidden),
    }


def _qwen3_config(spec: TargetSpec) -> dict:
    if spec.head_dim not in CPU_HEAD_DIMS:
        raise ValueError(f"head_dim={spec.head_dim} is not one of CPU attention's {CPU_HEAD_DIMS}")
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": TINY_ROPE_THETA,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "torch_dtype": "float32",
    }


def write_target(spec: TargetSpec = TargetSpec()) -> Path:
    """A random Qwen3 causal LM checkpoint (``config.json`` + ``model.safetensors``)."""

    def write(out: Path) -> None:
        gen = torch.Generator().manual_seed(spec.seed)
        weights = {
            "model.embed_tokens.weight": _normal(gen, 1.0, spec.vocab_size, spec.hidden_size),
            "model.norm.weight": torch.ones(spec.hidden_size),
            "lm_head.weight": _normal(gen, spec.init_std, spec.vocab_size, spec.hidden_size),
        }
        for i in range(spec.num_hidden_layers):
            weights |= _attention_and_mlp(
                gen, f"model.layers.{i}", spec.hidden_size, spec.intermediate_size,
                spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim, spec.init_std,
            )
        save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps(_qwen3_config(spec), indent=2))
        if spec.with_tokenizer:
            write_tiny_tokenizer(out, spec.vocab_size)

    return _cached_dir("qwen3", spec, write)


@dataclass(frozen=True)
class HybridTargetSpec(TargetSpec):
    """A Qwen3-Next target laid out as the released Qwen3-Next/Qwen3.5: three GDN layers, then
    one full-attention layer, twice (``full_attention_interval`` 4, 8 layers). The attention
    fields above are the full-attention layers' (a drafter reads them); GDN head dim 128 is
    the smallest vLLM's CPU GDN op takes.

    Tuned with benchmarks/hybrid_gdn_share.py (float32 transformers, the hybrid tests' 48
    candidate prompts, 24 greedy tokens). With every matrix at ``layer_std`` the GDN layers
    decide about 0.3 of the tokens (the share that changes when their ``out_proj`` is
    zeroed); at ``gdn_std`` 0.06 they decide 0.57 (Qwen3-Next) and 0.62 (Qwen3.5). The
    logits are near Gaussian (std 5.7), so about 6% of greedy steps have a top-1 minus top-2
    margin under 0.15, and how many prompts keep 0.15 at all 24 tokens is a draw: 8 of 48 on
    average, 0 to 19, over 56 seeds (Qwen3-Next); ``seed`` 25 keeps 19 and 12 (Qwen3.5)
    (14 and 8 at 0.25). In bfloat16 transformers (all of it bfloat16, harsher than vLLM) none
    of these flips; flips elsewhere come at fp32 margins up to 0.16 and 0.11 (seed 0 with
    every matrix at ``layer_std``: 0.16 and 0.19)."""

    num_hidden_layers: int = 8
    full_attention_interval: int = 4  # layer i is full attention when (i + 1) % 4 == 0
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_head_dim: int = 128
    num_experts: int = 4
    moe_intermediate_size: int = 64
    # lm_head (the embedding: 1.0). Not raised to widen margins: bfloat16 rounding reaches
    # the logits through lm_head too, so margins and flips would grow alike.
    init_std: float = 0.5
    # The attention and MLP matrices: small, so that they add a modest part to the residual
    # stream and bfloat16 rounding cannot grow through them into argmax flips (a gain above
    # 1 per matrix makes a random net chaotic: the target's own one-row and multi-row GDN
    # paths then disagree at near-ties).
    layer_std: float = 0.04
    # The GDN layers' matrices (in_proj_*, out_proj): larger, so that the GDN layers decide
    # most tokens (a wrong GDN state or conv window shows only in tokens they decide). Their
    # output stays small (rms 0.02 a layer; the embedding's is 1): after transformers' conv1d
    # init (std 0.02) the core output's variance (3e-9) is far under the gated RMSNorm's eps
    # (1e-6), so the norm scales rather than normalises and the output grows about as
    # gdn_std^3 (seed 0: share 0.3 at 0.04, 0.65 at 0.06, 0.86 at 0.08).
    gdn_std: float = 0.06
    seed: int = 25  # see above: the prompts' margins

    @property
    def layer_types(self) -> list[str]:
        return ["full_attention" if (i + 1) % self.full_attention_interval == 0
                else "linear_attention" for i in range(self.num_hidden_layers)]


# The same layout for the Triton (CUDA-path) GDN layer, which takes any head dim: 32 keeps the
# interpreted kernels of tests/v2/test_v2_cuda_path_hybrid.py four times cheaper than 128.
TRITON_HYBRID_TARGET = HybridTargetSpec(linear_head_dim=32)


def qwen3_next_config(spec: HybridTargetSpec) -> dict:
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "layer_types": spec.layer_types,
        "full_attention_interval": spec.full_attention_interval,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "linear_num_key_heads": spec.linear_num_key_heads,
        "linear_num_value_heads": spec.linear_num_value_heads,
        "linear_key_head_dim": spec.linear_head_dim,
        "linear_value_head_dim": spec.linear_head_dim,
        "linear_conv_kernel_dim": 4,
        "num_experts": spec.num_experts,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": spec.moe_intermediate_size,
        "shared_expert_intermediate_size": spec.moe_intermediate_size,
        "decoder_sparse_step": 1,
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": TINY_ROPE_THETA,
        "partial_rotary_factor": 0.25,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "torch_dtype": "bfloat16",
    }


def write_hybrid_target(spec: HybridTargetSpec = HybridTargetSpec()) -> Path:
    """A random Qwen3-Next checkpoint (transformers' own layout and names, bfloat16): the
    embedding N(0, 1), lm_head N(0, init_std^2), the GDN layers' matrices N(0, gdn_std^2),
    every other matrix N(0, layer_std^2); the GDN gates (A_log, dt_bias), convs, norms and
    the MoE experts (one 3-D tensor each in transformers 5) as transformers initialises them
    (convs and experts N(0, 0.02^2))."""

    def write(out: Path) -> None:
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        config = qwen3_next_config(spec)
        torch.manual_seed(spec.seed)
        model = Qwen3NextForCausalLM(Qwen3NextConfig(**config))
        _save_hybrid(model, spec, config, out)

    return _cached_dir("qwen3next", spec, write)


def _save_hybrid(model: torch.nn.Module, spec: HybridTargetSpec, config: dict,
                 out: Path) -> None:
    """Redraw the 2-D matrices (embedding N(0, 1), lm_head N(0, init_std^2), the GDN layers'
    N(0, gdn_std^2), every other one N(0, layer_std^2)) and save in bfloat16 with ``config``."""
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, weight in sorted(model.named_parameters()):
            if weight.dim() == 2:
                weight.copy_(_normal(gen, _matrix_std(spec, name), *weight.shape))
    model.to(torch.bfloat16).save_pretrained(out)
    (out / "config.json").write_text(json.dumps(config, indent=2))


def _matrix_std(spec: HybridTargetSpec, name: str) -> float:
    if name.endswith("embed_tokens.weight"):
        return 1.0
    if name == "lm_head.weight":
        return spec.init_std
    return spec.gdn_std if ".linear_attn." in name else spec.layer_std


def qwen3_5_config(spec: HybridTargetSpec) -> dict:
    """Qwen3.5 as released (``Qwen3_5ForConditionalGeneration``: a text model with Qwen3-Next's
    GDN and attention layers, a dense MLP, M-RoPE over 3 axes; a vision tower, one tiny
    block here). Text rows' axes are equal, so text requests decode as with 1-D RoPE."""
    text = {key: value for key, value in qwen3_next_config(spec).items() if key in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "layer_types",
        "full_attention_interval",
        "num_attention_heads", "num_key_value_heads", "head_dim", "linear_num_key_heads",
        "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
        "linear_conv_kernel_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
        "tie_word_embeddings", "bos_token_id", "eos_token_id")}
    rotary_half = int(spec.head_dim * 0.25) // 2  # M-RoPE sections split the rotary half
    text["rope_parameters"] = {
        "rope_type": "default", "rope_theta": TINY_ROPE_THETA, "partial_rotary_factor": 0.25,
        "mrope_section": [rotary_half - 2 * (rotary_half // 4)] + [rotary_half // 4] * 2,
        "mrope_interleaved": True}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
              "out_hidden_size": spec.hidden_size, "patch_size": 16, "spatial_merge_size": 2,
              "temporal_patch_size": 2, "num_position_embeddings": 64}
    # Vision token ids past the vocabulary: no text token is one (a vision-start id in a
    # random prompt would make M-RoPE look for an image there).
    top = spec.vocab_size
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {**text, "model_type": "qwen3_5_text"},
        "vision_config": {**vision, "model_type": "qwen3_5_vision"},
        "image_token_id": top, "video_token_id": top + 1, "vision_start_token_id": top + 2,
        "vision_end_token_id": top + 3, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def write_qwen3_5_target(spec: HybridTargetSpec = HybridTargetSpec()) -> Path:
    """A random Qwen3.5 checkpoint in the released vision-language layout (text weights
    under ``model.language_model.``, bfloat16), its matrices drawn as
    :func:`write_hybrid_target` draws them (``spec``'s MoE fields are unused: dense MLP).
    Serve it with ``language_model_only=True`` (no image processor here)."""

    def write(out: Path) -> None:
        from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

        config = qwen3_5_config(spec)
        torch.manual_seed(spec.seed)
        model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(**{
            key: value for key, value in config.items()
            if key not in ("architectures", "model_type", "torch_dtype")}))
        _save_hybrid(model, spec, config, out)

    return _cached_dir("qwen3_5", spec, write)


def drafter_layout(spec: DrafterSpec) -> DrafterLayout:
    """The layout of a DFlash (z-lab), Domino or DSpark drafter for ``spec.target``."""
    t = spec.target
    if spec.dspark:
        return DrafterLayout(
            vocab_size=t.vocab_size, hidden_size=t.hidden_size,
            intermediate_size=t.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
            num_attention_heads=t.num_attention_heads,
            num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim,
            target_layer_ids=spec.target_layer_ids, mask_token_id=spec.mask_token_id,
            num_target_layers=t.num_hidden_layers, block_size=spec.block_size,
            shift_label=True, head="markov", markov_rank=spec.markov_rank,
            confidence_head=spec.confidence_head,
            confidence_head_with_markov=spec.confidence_head,
            draft_vocab_size=spec.draft_vocab_size, rope_theta=TINY_ROPE_THETA,
            max_position_embeddings=t.max_position_embeddings,
        )
    return DrafterLayout(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads,
        head_dim=t.head_dim, target_layer_ids=spec.target_layer_ids,
        mask_token_id=spec.mask_token_id, num_target_layers=t.num_hidden_layers,
        block_size=spec.block_size, shift_label=spec.domino,
        head="domino" if spec.domino else None,
        gru_hidden_dim=spec.gru_hidden_dim if spec.domino else None,
        emb_dim=spec.emb_dim if spec.domino else None,
        pure_draft_prefix_len=spec.pure_draft_prefix_len if spec.domino else 0,
        rope_theta=TINY_ROPE_THETA, max_position_embeddings=t.max_position_embeddings,
    )


def drafter_config(spec: DrafterSpec) -> dict:
    """config.json of a DFlash (z-lab), Domino or DSpark drafter for ``spec.target``."""
    return drafter_layout(spec).to_config()


def drafter_weights(spec: DrafterSpec) -> dict[str, torch.Tensor]:
    """Random drafter weights under the released checkpoints' names (DFlash and Domino: no
    embed, no lm_head; DSpark: see :func:`dspark_weights`)."""
    t = spec.target
    hidden = t.hidden_size
    gen = torch.Generator().manual_seed(spec.seed)
    weights = {
        "fc.weight": _normal(gen, spec.init_std, hidden, hidden * len(spec.target_layer_ids)),
        "hidden_norm.weight": torch.ones(hidden),
        "norm.weight": torch.ones(hidden),
    }
    for i in range(spec.num_hidden_layers):
        weights |= _attention_and_mlp(
            gen, f"layers.{i}", hidden, t.intermediate_size, t.num_attention_heads,
            t.num_key_value_heads, t.head_dim, spec.init_std,
        )
    if spec.domino:
        g, e = spec.gru_hidden_dim, spec.emb_dim
        weights |= {
            "prefix_gru.weight_ih_l0": _normal(gen, spec.init_std, 3 * g, hidden),
            "prefix_gru.weight_hh_l0": _normal(gen, spec.init_std, 3 * g, g),
            "embed_proj.0.weight": _normal(gen, spec.init_std, e, hidden + g),
            "embed_proj.2.weight": _normal(gen, spec.init_std, t.vocab_size, e),
        }
    if spec.dspark:
        weights |= dspark_weights(spec, gen)
    top_level = (*HEAD_PREFIXES, "lm_head.", "d2t", "t2d")
    return {name if name.startswith(top_level) else spec.text_weight_prefix + name: tensor
            for name, tensor in weights.items()}


def dspark_kept_target_ids(spec: DrafterSpec) -> torch.Tensor:
    """The target ids of a reduced draft vocabulary, ascending (every other id, then the
    rest from the top, so that d2t offsets vary)."""
    vocab = spec.target.vocab_size
    order = [*range(0, vocab, 2), *range(1, vocab, 2)[::-1]]
    return torch.tensor(sorted(order[: spec.draft_vocab_size]))


def dspark_weights(spec: DrafterSpec, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """DSpark's heads by vLLM's loader names (qwen3_dspark.py: markov_head.markov_w1 [V, r],
    markov_head.markov_w2 [V', r], confidence_head.proj [1, H (+ r)] with bias), plus the
    own embed_tokens / lm_head copies DeepSpec exports (unless ``own_embeddings`` is off)
    and, for V' < V, d2t (draft id i -> target id i + d2t[i]) and t2d (a [V] bool mask,
    training-only: vLLM skips it)."""
    t, rank = spec.target, spec.markov_rank
    layout = drafter_layout(spec)
    # Markov biases (std 2) of the base logits' scale (std ~2), so that they change drafts.
    weights = {
        "markov_head.markov_w1.weight": _normal(gen, 1.0, t.vocab_size, rank),
        "markov_head.markov_w2.weight": _normal(gen, 2.0 / rank**0.5,
                                                layout.output_vocab_size, rank),
        "embed_tokens.weight": _normal(gen, 1.0, t.vocab_size, t.hidden_size),
    }
    lm_head = _normal(gen, 0.2, t.vocab_size, t.hidden_size)
    if layout.has_reduced_vocab:
        kept = dspark_kept_target_ids(spec)
        weights["d2t"] = kept - torch.arange(len(kept))
        weights["t2d"] = torch.zeros(t.vocab_size, dtype=torch.bool).index_fill(0, kept, True)
        lm_head = lm_head[kept]
    weights["lm_head.weight"] = lm_head
    if not spec.own_embeddings:
        del weights["embed_tokens.weight"], weights["lm_head.weight"]
    if spec.confidence_head:
        weights["confidence_head.proj.weight"] = _normal(gen, spec.init_std, 1,
                                                         t.hidden_size + rank)
        weights["confidence_head.proj.bias"] = torch.zeros(1)
    return weights


def write_drafter(spec: DrafterSpec) -> Path:
    """A random DFlash, Domino or DSpark drafter checkpoint for ``spec.target``."""

    def write(out: Path) -> None:
        save_file(drafter_weights(spec), out / "model.safetensors", metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps(drafter_config(spec), indent=2))

    return _cached_dir(spec.kind, spec, write)


CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_tokenizer(out: Path, vocab_size: int) -> None:
    """A byte-level BPE of ``vocab_size`` entries trained on Python's own stdlib sources."""
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:40]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 1,  # the last id is the drafters' mask token
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def random_prompts(
    n: int, vocab_size: int, seed: int = 0, min_len: int = 3, max_len: int = 40
) -> list[list[int]]:
    """Deterministic token-id prompts of varied length; never id 0 (eos) or the mask id."""
    import random

    rng = random.Random(seed)
    return [
        [rng.randrange(1, vocab_size - 1) for _ in range(rng.randint(min_len, max_len))]
        for _ in range(n)
    ]


WORDS = (
    "the a cat dog runs sees big small red blue and then over under tree house river moon sun "
    "eats sleeps fast slow happy old new user assistant"
).split()
WORD_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|> {{ message['role'] }} {{ message['content'] }} "
    "<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def write_word_tokenizer(out: Path, vocab_size: int) -> None:
    """A word-level tokenizer for tiny-vocabulary targets: ids decode to readable words.

    Ids 0-2 are the chat specials, the last id is the drafters' mask token, the rest words.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    words = (WORDS * (1 + vocab_size // len(WORDS)))[: vocab_size - len(specials) - 1]
    words = [w if words.index(w) == i else f"{w}{i}" for i, w in enumerate(words)]
    vocab = {w: i for i, w in enumerate([*specials, *words, "<|mask|>"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<|mask|>"])
    fast.chat_template = WORD_CHAT_TEMPLATE
    fast.save_pretrained(str(out))


@dataclass(frozen=True)
class LoraSpec:
    """A PEFT LoRA adapter for a tiny target: rank ``rank`` on the attention projections and
    the MLP of every layer, large enough that every adapter changes greedy tokens."""

    target: TargetSpec = field(default_factory=TargetSpec)
    rank: int = 8
    alpha: int = 16
    std: float = 0.3
    modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                "up_proj", "down_proj")
    seed: int = 11


def write_lora_adapter(spec: LoraSpec) -> Path:
    """``adapter_config.json`` + ``adapter_model.safetensors`` as PEFT writes them (the
    format vLLM's ``LoRARequest`` loads)."""
    t = spec.target
    attention = {"q_proj": (t.num_attention_heads * t.head_dim, t.hidden_size),
                 "k_proj": (t.num_key_value_heads * t.head_dim, t.hidden_size),
                 "v_proj": (t.num_key_value_heads * t.head_dim, t.hidden_size),
                 "o_proj": (t.hidden_size, t.num_attention_heads * t.head_dim)}
    mlp = {"gate_proj": (t.intermediate_size, t.hidden_size),
           "up_proj": (t.intermediate_size, t.hidden_size),
           "down_proj": (t.hidden_size, t.intermediate_size)}

    def write(out: Path) -> None:
        gen = torch.Generator().manual_seed(spec.seed)
        weights = {}
        for i in range(t.num_hidden_layers):
            for module in spec.modules:
                group = "self_attn" if module in attention else "mlp"
                out_dim, in_dim = (attention | mlp)[module]
                name = f"base_model.model.model.layers.{i}.{group}.{module}"
                weights[f"{name}.lora_A.weight"] = _normal(gen, spec.std, spec.rank, in_dim)
                weights[f"{name}.lora_B.weight"] = _normal(gen, spec.std, out_dim, spec.rank)
        save_file(weights, out / "adapter_model.safetensors", metadata={"format": "pt"})
        (out / "config.json").write_text("{}")  # the cache's completeness marker
        (out / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec.rank,
            "lora_alpha": spec.alpha, "lora_dropout": 0.0, "bias": "none",
            "target_modules": list(spec.modules), "base_model_name_or_path": None,
            "fan_in_fan_out": False, "modules_to_save": None, "use_rslora": False,
        }, indent=2))

    return _cached_dir("lora", spec, write)
