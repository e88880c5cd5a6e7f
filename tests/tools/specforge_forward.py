"""SpecForge 0.2.0's own drafter forward, run in a subprocess of
``test_tool_drafter_equivalence.py`` (SpecForge is never imported beside a vLLM engine).

``python specforge_forward.py DRAFTER TARGET INPUTS OUT``: INPUTS (safetensors) holds the
context features a vLLM engine fed its drafter (``context`` [L, n*H]), the block's token ids
(``block`` [root, mask x (B - 1)]) and the chain the engine drafted (``chain``). OUT gets the
draft model's outputs at every block slot (``hidden`` [B, H], from SpecForge's
``DFlashDraftModel.forward`` as its ``spec_generate`` calls it, non-causal) and, for a head,
the logits SpecForge's own head gives each drafted position when the previous tokens are the
engine's chain (``corrected`` [D, V]: Domino's ``apply_logits_head`` with the chain's
embeddings, DSpark's Markov bias of the previous token), over the target's ``lm_head``.
"""

from __future__ import annotations

import sys

import torch
from safetensors.torch import load_file, save_file


def main(drafter: str, target: str, inputs_path: str, out_path: str) -> None:
    from specforge.modeling.draft import DFlashDraftModel, DominoDraftModel
    from specforge.modeling.draft.dspark import DSparkDraftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(1)
    inputs = load_file(inputs_path)
    arch = AutoConfig.from_pretrained(drafter).architectures[0]
    cls = {"DFlashDraftModel": DFlashDraftModel, "DominoDraftModel": DominoDraftModel,
           "DSparkDraftModel": DSparkDraftModel}[arch]
    model = cls.from_pretrained(drafter, dtype=torch.float32).eval()
    lm = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    context, block, chain = inputs["context"], inputs["block"], inputs["chain"]
    length, size = context.shape[0], block.shape[0]
    with torch.no_grad():
        hidden = model(position_ids=torch.arange(length + size).unsqueeze(0),
                       noise_embedding=lm.model.embed_tokens(block).unsqueeze(0),
                       target_hidden=context.unsqueeze(0), is_causal=False)[0]
        out = {"hidden": hidden.contiguous()}
        base = lm.lm_head(hidden)  # [B, V]
        if arch == "DominoDraftModel":
            assert model.shift_label  # the rows written here: the released b16 layout
            ids = torch.cat([block[:1], chain[: size - 1]])  # [root, d1 .. d_{B-1}]
            corrected = model.apply_logits_head(
                base[None, None], hidden_states=hidden[None, None],
                prev_token_embeddings=lm.model.embed_tokens(ids)[None, None])[0, 0]
            out["corrected"] = corrected[: chain.shape[0]].contiguous()
        elif arch == "DSparkDraftModel":  # shift layout: slot j, previous token = chain[j-1]
            previous = torch.cat([block[:1], chain[: size - 1]])
            corrected = model.apply_logits_head(base[None], prev_token_ids=previous[None],
                                                hidden_states=hidden[None])[0]
            out["corrected"] = corrected[: chain.shape[0]].contiguous()
    save_file(out, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:])
