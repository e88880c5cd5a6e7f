"""Every invalid dartree configuration fails fast, with a message naming key, value, rule."""

from __future__ import annotations

import json
import shutil

import pytest

from vllm_dartree.config import (
    DARTreeConfig,
    DARTreeConfigError,
    carried_settings,
    parse_speculative_config,
)

BASE = {"method": "dartree", "model": "some/drafter"}

PARSE_ERRORS = [
    ({"method": "dartree"}, r"'model' is required"),
    (BASE | {"tree": "heap"}, r"'tree' = 'heap' is invalid: .*'pruned', 'fixed', 'ddtree' or 'chain'"),
    (BASE | {"num_speculative_tokens": 0}, r"'num_speculative_tokens' = 0 .* between 1 and 127"),
    (BASE | {"num_speculative_tokens": 500}, r"'num_speculative_tokens' = 500 .* between 1 and 127"),
    (BASE | {"width": 0}, r"'width' = 0 is invalid: must be >= 1"),
    (BASE | {"top_k": -3}, r"'top_k' = -3 is invalid: must be >= 1"),
    (BASE | {"depth_bonus": 0.5}, r"'depth_bonus' = 0.5 is not allowed for tree 'pruned': it must be <= 0"),
    (BASE | {"tree": "fixed", "depth_bonus": -0.2}, r"'depth_bonus' = -0.2 .* tree 'fixed': it must be 0"),
    (BASE | {"tree": "ddtree", "width": 4}, r"'width' does not apply to tree 'ddtree'"),
    (BASE | {"tree": "ddtree", "correction": True}, r"'correction' does not apply to tree 'ddtree'"),
    (BASE | {"tree": "chain", "depth_bonus": -0.1}, r"'depth_bonus' does not apply to tree 'chain'"),
    (BASE | {"width": 80, "num_speculative_tokens": 32}, r"'width' = 80 exceeds 'num_speculative_tokens' = 32"),
    (BASE | {"beam": 3}, r"key 'beam' \(value 3\) is not supported .* allowed keys: "),
    (BASE | {"width": "wide"}, r"'width' = 'wide' is invalid: .*valid integer"),
    (BASE | {"budget_policy": "auto"}, r"'budget_policy' = 'auto' is invalid: .*'fixed' or 'adaptive'"),
    (BASE | {"width": "auto"}, r"'width' = 'auto' needs 'budget_policy' = 'adaptive'.* 'fixed'"),
    (BASE | {"width": "narrow", "budget_policy": "adaptive"}, r"'width' = 'narrow' is invalid: .*'auto'"),
]


@pytest.mark.parametrize(("raw", "message"), PARSE_ERRORS)
def test_invalid_config_is_rejected_with_a_clear_message(raw, message):
    with pytest.raises(DARTreeConfigError, match=message):
        parse_speculative_config(raw)


def test_defaults_are_the_papers():
    config = parse_speculative_config(BASE)
    assert (config.num_speculative_tokens, config.width, config.top_k, config.depth_bonus, config.tree) == (
        64, 12, 64, -0.2, "pruned")
    assert config.correction is None  # decided by the drafter (head present or not)
    assert parse_speculative_config(BASE | {"tree": "fixed"}).effective_depth_bonus == 0.0


def test_dashes_and_vllm_keys_pass_through():
    config = parse_speculative_config(BASE | {"num-speculative-tokens": 16, "revision": "main"})
    assert config.num_speculative_tokens == 16 and config.vllm_options == {"revision": "main"}
    assert isinstance(config, DARTreeConfig)


def _requested_by(model, *argv: str) -> dict | None:
    """What ``vllm serve MODEL *argv`` asks dartree for: vLLM's own parser (with the plugin's
    --spec-method choice) and engine args, read by the request gate."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.plugins import load_general_plugins
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_dartree.integration.gate import requested_config

    load_general_plugins()
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    # A local folder for the model: offline, vLLM resolves a hub id to a cached snapshot.
    args = parser.parse_args(["--model", str(model), *argv])
    return requested_config(EngineArgs.from_cli_args(args))


def test_every_spelling_of_a_request_asks_for_the_same_settings(tmp_path):
    """The JSON form, vLLM 0.34's ``speculator_options`` nesting and the shortcut flags give
    the same request (one server serves it: tests/e2e/test_server_e2e.py, V2's
    tests/v2/test_v2_server.py); the same key twice is refused."""
    expected = {"method": "dartree", "model": "d", "tree": "fixed", "num_speculative_tokens": 16}
    nested = {"method": "dartree", "model": "d",
              "speculator_options": {"tree": "fixed", "num_speculative_tokens": 16}}
    assert _requested_by(tmp_path, "--speculative-config", json.dumps(expected)) == expected
    assert _requested_by(tmp_path, "--speculative-config", json.dumps(nested)) == expected
    flags = ("--spec-method", "dartree", "--spec-model", "d", "--spec-tokens", "16")
    assert _requested_by(tmp_path, *flags, "--speculative-config",
                         json.dumps({"tree": "fixed"})) == expected
    assert _requested_by(tmp_path, "--speculative-config", json.dumps(
        {"method": "ngram", "num_speculative_tokens": 4})) is None  # not dartree: left alone
    with pytest.raises(ValueError, match="--spec-tokens and --speculative-config"):
        _requested_by(tmp_path, "--spec-method", "dartree", "--spec-tokens", "16",
                      "--speculative-config", json.dumps({"num_speculative_tokens": 8}))
    with pytest.raises(ValueError, match="'tree' is given both"):
        _requested_by(tmp_path, "--speculative-config", json.dumps(
            nested | {"tree": "pruned"}))


def _drafter_copy(tmp_path, source, edit):
    out = tmp_path / "drafter"
    shutil.copytree(source, out)
    config = json.loads((out / "config.json").read_text())
    edit(config)
    (out / "config.json").write_text(json.dumps(config))
    return out


def _engine_config(target, speculative_config):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(target), skip_tokenizer_init=True, dtype="float32",
                      max_model_len=256, speculative_config=speculative_config
                      ).create_engine_config()


def _set(path, value):
    def edit(config):
        node = config
        *parents, leaf = path
        for key in parents:
            node = node[key]
        if value is None:
            node.pop(leaf)
        else:
            node[leaf] = value
    return edit


ENGINE_ERRORS = [
    (_set(["hidden_size"], 96), r"hidden_size = 96 does not match the target's 128"),
    (_set(["vocab_size"], 300), r"vocab_size = 300 does not match the target's 512"),
    (_set(["dflash_config", "target_layer_ids"], [0, 5]), r"target_layer_ids = \[0, 5\] has \[5\] outside"),
    (_set(["dflash_config", "mask_token_id"], None), r"missing dflash_config.mask_token_id"),
    (_set(["dflash_config", "projector_type"], "markov"), r"projector_type = 'markov' is not supported"),
    (_set(["dflash_config", "gru_hidden_dim"], None), r"needs dflash_config.gru_hidden_dim"),
]


@pytest.mark.parametrize(("edit", "message"), ENGINE_ERRORS)
def test_drafter_mismatch_fails_before_loading(tmp_path, tiny_target, tiny_domino, edit, message):
    drafter = _drafter_copy(tmp_path, tiny_domino, edit)
    with pytest.raises(ValueError, match=message):
        _engine_config(tiny_target, {"method": "dartree", "model": str(drafter)})


def test_correction_needs_a_correction_head(tiny_target, tiny_dflash):
    with pytest.raises(DARTreeConfigError, match=r"'correction' = True needs a drafter with a "
                                                 r"correction head \(Domino or DSpark\)"):
        _engine_config(tiny_target, {"method": "dartree", "model": str(tiny_dflash),
                                     "correction": True})


def test_vllm_refuses_lattice_drafters_on_its_v1_runner(tiny_target, tiny_dflash2):
    """DFlash2 / LiLiCorr run on vLLM's V2 runner only; vLLM refuses them on V1 itself, at
    config time (tests/v2/test_v2_lattice.py: the V2 gate)."""
    with pytest.raises(ValueError, match="V1 does not support: DFlash candidate-head drafts"):
        _engine_config(tiny_target, {"method": "dartree", "model": str(tiny_dflash2)})


def test_explicit_top_k_must_fit_the_vocabulary(tiny_target, tiny_domino):
    with pytest.raises(DARTreeConfigError, match=r"'top_k' = 600 exceeds the vocabulary size 512"):
        _engine_config(tiny_target, {"method": "dartree", "model": str(tiny_domino), "top_k": 600})


def test_valid_request_builds_a_config_carrying_the_settings(tiny_target, tiny_domino):
    config = _engine_config(tiny_target, {"method": "dartree", "model": str(tiny_domino),
                                          "tree": "fixed", "num_speculative_tokens": 32})
    spec = config.speculative_config
    assert spec.method == "dflash" and spec.num_speculative_tokens == 32
    settings = carried_settings(spec)
    assert settings.tree == "fixed" and settings.num_speculative_tokens == 32


def test_cpu_defaults_fill_only_keys_the_variant_uses():
    from vllm_dartree.config import CPU_DEFAULTS

    pruned = parse_speculative_config(BASE, on_cpu=True)
    assert (pruned.num_speculative_tokens, pruned.width, pruned.top_k) == (
        CPU_DEFAULTS["num_speculative_tokens"], CPU_DEFAULTS["width"], CPU_DEFAULTS["top_k"])
    fixed = parse_speculative_config(BASE | {"tree": "fixed"}, on_cpu=True)  # no width there
    assert (fixed.num_speculative_tokens, fixed.top_k) == (CPU_DEFAULTS["num_speculative_tokens"],
                                           CPU_DEFAULTS["top_k"])
    ddtree = parse_speculative_config(BASE | {"tree": "ddtree"}, on_cpu=True)
    assert ddtree.num_speculative_tokens == CPU_DEFAULTS["num_speculative_tokens"]
    given = parse_speculative_config(BASE | {"num_speculative_tokens": 32}, on_cpu=True)
    assert (given.num_speculative_tokens, given.width) == (32, CPU_DEFAULTS["width"])
    small = parse_speculative_config(BASE | {"num_speculative_tokens": 3}, on_cpu=True)
    assert small.width == 3  # a default width never exceeds the budget the user chose
    assert small.user_set("num_speculative_tokens") and not small.user_set("top_k")
    gpu = parse_speculative_config(BASE)  # the paper's defaults
    assert (gpu.num_speculative_tokens, gpu.width, gpu.top_k) == (64, 12, 64)


def test_an_auto_width_stays_within_the_width_that_would_apply_otherwise():
    from vllm_dartree.config import CPU_DEFAULTS

    auto = BASE | {"budget_policy": "adaptive", "width": "auto"}
    gpu = parse_speculative_config(auto)
    assert (gpu.auto_width, gpu.max_width) == (True, 12)
    cpu = parse_speculative_config(auto, on_cpu=True)
    assert (cpu.num_speculative_tokens, cpu.max_width) == (CPU_DEFAULTS["num_speculative_tokens"],
                                           CPU_DEFAULTS["width"])
    small = parse_speculative_config(auto | {"num_speculative_tokens": 3})
    assert small.max_width == 3  # never wider than the budget
    fixed = parse_speculative_config(BASE | {"width": 5})
    assert (fixed.auto_width, fixed.max_width) == (False, 5)
