"""Tiny drafter checkpoints written by the training tools' own code, for the tiny Qwen3 target.

Each row of :data:`ROWS` is one checkpoint as a user of that tool gets it:

- SpecForge 0.2.0 (installed ``--no-deps``): its draft classes (``DFlashDraftModel``,
  ``DominoDraftModel``, ``DSparkDraftModel``) built from a Qwen3 config and saved with
  ``save_pretrained``, which is what its ``export/to_hf.py`` does;
- Model-Optimizer 0.47.0: ``modelopt.torch.speculative.convert(target, [("dflash", cfg)])``
  on the tiny target loaded by transformers, then the model's own exporter
  (``get_exporter().export``: ``DFlashExporter``, ``DominoExporter``, ``DSparkExporter``);
- speculators 0.9.0: ``create_transformer_layer_config`` (its training CLI's decoder config
  from the verifier, with its ``--full-attention-indices`` and ``--sliding-window``), the
  model's ``from_training_args`` and ``save_pretrained``.

The tools are imported in a subprocess (:func:`write`), never in the test process that runs
vLLM engines. Each checkpoint is written once and cached under ``.cache/models/tools/``,
keyed by the row and the tool's version.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vllm_dartree.env import cache_dir
from vllm_dartree.models.tiny import TargetSpec, write_target

TOOL_VERSIONS = {"specforge": "0.2.0", "nvidia-modelopt": "0.47.0", "speculators": "0.9.0"}
TARGET = TargetSpec()  # vocab 512, hidden 128, 2 layers, 4 heads / 2 KV heads of 32
MASK = TARGET.vocab_size - 1
BLOCK = 16  # SpecForge and Model-Optimizer rows (speculators: its defaults)
WRITER_REVISION = 6  # part of each row's cache key: bump when a writer changes


@dataclass(frozen=True)
class Row:
    tool: str  # a key of TOOL_VERSIONS
    kind: str  # dflash, domino, dspark, dflash2
    options: dict = field(default_factory=dict)  # what the user chose beyond the defaults

    @property
    def name(self) -> str:
        extra = "-".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        tool = {"nvidia-modelopt": "modelopt"}.get(self.tool, self.tool)
        return f"{tool}-{self.kind}" + (f"-{extra}" if extra else "")


FULL = {"full_attention": True}  # speculators: --full-attention-indices 0 1
ROWS = [
    Row("specforge", "dflash"), Row("specforge", "domino"), Row("specforge", "dspark"),
    Row("nvidia-modelopt", "dflash"), Row("nvidia-modelopt", "domino"),
    Row("nvidia-modelopt", "dspark"),
    Row("nvidia-modelopt", "dflash", {"dflash_draft_attention": "causal"}),
    Row("nvidia-modelopt", "dflash", {"dflash_swa_window_size": 32}),
    Row("speculators", "dflash"), Row("speculators", "dflash2"), Row("speculators", "dspark"),
    Row("speculators", "dflash", FULL), Row("speculators", "dflash2", FULL),
    Row("speculators", "dspark", FULL),
    Row("speculators", "dflash", {**FULL, "sample_from_anchor": True}),
    Row("speculators", "dflash", {**FULL, "sliding_window_non_causal": True}),
    Row("speculators", "dflash2", {**FULL, "sample_from_anchor": True}),
    Row("speculators", "dspark", {**FULL, "sample_from_anchor": False}),
]
ROW = {row.name: row for row in ROWS}


def _payload(row: Row) -> str:
    try:
        version = importlib.metadata.version(row.tool)
    except importlib.metadata.PackageNotFoundError as missing:
        raise RuntimeError(f"{row.tool} is not installed (make setup installs "
                           f"{row.tool}=={TOOL_VERSIONS[row.tool]})") from missing
    if version != TOOL_VERSIONS[row.tool]:
        raise RuntimeError(f"{row.tool} {version} is installed; these rows are pinned to "
                           f"{TOOL_VERSIONS[row.tool]} (make setup installs it)")
    return json.dumps({**asdict(row), "version": version, "target": asdict(TARGET),
                       "writer": WRITER_REVISION}, sort_keys=True)


def folder(row: Row) -> Path:
    digest = hashlib.sha256(_payload(row).encode()).hexdigest()[:12]
    return cache_dir() / "models" / "tools" / f"{row.name}-{digest}"


def write(row: Row) -> Path:
    """The checkpoint folder of ``row``. On a miss, one subprocess of the tool writes every
    missing row of that tool (the tools take seconds to import)."""
    out = folder(row)
    if (out / "config.json").exists():
        return out
    missing = [r for r in ROWS if r.tool == row.tool and not (folder(r) / "config.json").exists()]
    target = write_target(TARGET)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{row.tool}-", dir=out.parent))
    jobs = [(asdict(r), str(tmp / r.name)) for r in missing]
    try:
        subprocess.run([sys.executable, __file__, json.dumps(jobs), str(target)], check=True,
                       capture_output=True, text=True, timeout=900)
        for r in missing:
            (tmp / r.name / "written-by.json").write_text(_payload(r))
            if (folder(r) / "config.json").exists():  # written meanwhile by another process
                continue
            shutil.rmtree(folder(r), ignore_errors=True)  # an incomplete earlier write
            try:
                (tmp / r.name).replace(folder(r))
            except OSError:  # the V2 suite's process wrote it at the same time: keep theirs
                if not (folder(r) / "config.json").exists():
                    raise
    except subprocess.CalledProcessError as error:
        raise RuntimeError(f"{row.tool} could not write {[r.name for r in missing]}:\n"
                           f"{error.stderr[-3000:]}") from error
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ---------------------------------------------------------------- in the subprocess only
def _specforge(row: Row, target: Path, out: Path) -> None:
    import torch
    from specforge.modeling.draft import DFlashDraftModel, DominoDraftModel
    from specforge.modeling.draft.dspark import DSparkDraftModel
    from transformers import Qwen3Config

    heads = {
        "dflash": (DFlashDraftModel, {}),
        # Domino's released b16 settings (shift layout, depth 1 uncorrected).
        "domino": (DominoDraftModel, {"projector_type": "domino", "gru_hidden_dim": 64,
                                      "emb_dim": 32, "shift_label": True,
                                      "pure_draft_prefix_len": 1}),
        "dspark": (DSparkDraftModel, {"markov_rank": 16, "enable_confidence_head": True,
                                      "confidence_head_with_markov": True}),
    }
    cls, extra = heads[row.kind]
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=TARGET.vocab_size, hidden_size=TARGET.hidden_size,
        intermediate_size=TARGET.intermediate_size, num_hidden_layers=1,
        num_attention_heads=TARGET.num_attention_heads,
        num_key_value_heads=TARGET.num_key_value_heads, head_dim=TARGET.head_dim,
        max_position_embeddings=TARGET.max_position_embeddings, rope_theta=10000.0,
        tie_word_embeddings=False, block_size=BLOCK,
        num_target_layers=TARGET.num_hidden_layers, architectures=[cls.__name__],
        dflash_config={"mask_token_id": MASK, "target_layer_ids": [0, 1], **extra})
    model = cls(config)
    _enlarge_heads(model)
    model.save_pretrained(out)


def _enlarge_heads(model) -> None:
    """Untrained heads at the tools' init (std 0.02) change no argmax; larger weights make
    the head decide tokens, so reading it wrong changes the draft (weights are what training
    changes; the format stays the tool's)."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1 and any(part in name for part in HEAD_PARTS):
                param.normal_(0.0, 3.0 if "markov_w1" in name else 8.0 / param.shape[-1] ** 0.5)


HEAD_PARTS = ("prefix_gru.", "embed_proj.", "markov_head.", "markov_w", "confidence_")


def modelopt_model(row: Row, target: Path):
    """The tiny target converted by Model-Optimizer for ``row`` (its draft module at the
    tool's init, heads enlarged as above)."""
    import modelopt.torch.speculative as mtsp
    import torch
    from transformers import AutoModelForCausalLM

    heads = {"dflash": {},
             "domino": {"projector_type": "domino", "gru_hidden_dim": 64, "emb_dim": 32},
             "dspark": {"projector_type": "dspark", "markov_rank": 16,
                        "use_confidence_head": True}}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    mtsp.convert(model, [("dflash", {
        "dflash_block_size": BLOCK, "dflash_mask_token_id": MASK,
        "dflash_architecture_config": {"num_hidden_layers": 2, "target_layer_ids": [0, 1],
                                       **heads[row.kind]}, **row.options})])
    _enlarge_heads(model.dflash_module)
    return model


def _modelopt(row: Row, target: Path, out: Path) -> None:
    modelopt_model(row, target).get_exporter().export(out)


def _speculators(row: Row, target: Path, out: Path) -> None:
    import torch
    from speculators.models.dflash.core import DFlashDraftModel
    from speculators.models.dflash2.core import DFlash2DraftModel
    from speculators.models.dspark.core import DSparkDraftModel
    from speculators.train.cli import create_transformer_layer_config

    options = dict(row.options)
    full = [0, 1] if options.pop("full_attention", False) else []
    torch.manual_seed(0)
    # The training CLI's defaults: --sliding-window 2048, no --full-attention-indices.
    layer_config = create_transformer_layer_config(str(target), 2, "qwen3", None, 2048, full)
    cls, extra = {"dflash": (DFlashDraftModel, {}),
                  "dflash2": (DFlash2DraftModel, {"selector_top_k": 4, "selector_rank": 8}),
                  "dspark": (DSparkDraftModel, {"markov_rank": 16})}[row.kind]
    model = cls.from_training_args(
        verifier_config=layer_config, verifier_name_or_path=str(target),
        draft_vocab_size=TARGET.vocab_size, target_layer_ids=[1, 2], mask_token_id=MASK,
        draft_attn_impl="sdpa", **extra, **options)
    _enlarge_heads(model)
    model.save_pretrained(out)


if __name__ == "__main__":
    all_jobs, target_dir = sys.argv[1:]
    for spec, out_dir in json.loads(all_jobs):
        the_row = Row(**spec)
        writer = {"specforge": _specforge, "nvidia-modelopt": _modelopt,
                  "speculators": _speculators}[the_row.tool]
        writer(the_row, Path(target_dir), Path(out_dir))
