"""``train-drafter`` CLI: arguments reach the trainer, prompt files, the overlap guard."""

from __future__ import annotations

import json

import pytest

from vllm_dartree.training.cli import build_parser, config_from_args, main, read_prompts
from vllm_dartree.training.data import PromptOverlapError

SMALL_RUN = ["--steps", "2", "--gru-hidden-dim", "8", "--emb-dim", "8", "--batch-size", "2",
             "--seq-len", "24", "--num-sequences", "4", "--threads", "1", "--no-progress",
             "--ignore-eos"]


def test_arguments_map_to_the_config():
    args = build_parser().parse_args(
        ["--target", "t", "--out", "o", "--target-layer-ids", "1", "9", "--freeze-backbone",
         "--init-from", "d", "--export-dtype", "bfloat16", "--resume", "--lr", "0.01",
         "--autocast", "bfloat16"])
    cfg = config_from_args(args)
    assert cfg.autocast == "bfloat16"
    assert cfg.target_layer_ids == (1, 9) and cfg.freeze_backbone and cfg.resume
    assert cfg.init_from == "d" and cfg.export_dtype == "bfloat16" and cfg.lr == 0.01


def test_read_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a b"}\n{"ids": [1, 2]}\n"quoted"\nplain text\n\n')
    assert read_prompts(path) == ["a b", [1, 2], "quoted", "plain text"]


def test_main_trains_and_exports(target_dir, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"ids": [i, i + 1, i + 2]}) for i in range(1, 5)))
    main(["--target", str(target_dir), "--out", str(tmp_path / "run"),
          "--prompts", str(prompts), "--target-layer-ids", "0", "1", *SMALL_RUN])
    drafter = tmp_path / "run" / "drafter"
    assert (drafter / "model.safetensors").exists()
    assert json.loads((drafter / "config.json").read_text())["dflash_config"][
        "projector_type"] == "domino"
    assert "drafter written" in capsys.readouterr().out


def test_benchmark_overlap_aborts(target_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"ids": [1, 2, 3]}\n')
    bench = tmp_path / "b.jsonl"
    bench.write_text('{"ids": [1, 2, 3]}\n')
    with pytest.raises(PromptOverlapError):
        main(["--target", str(target_dir), "--out", str(tmp_path / "run"), "--prompts",
              str(prompts), "--benchmark-prompts", str(bench), *SMALL_RUN])
