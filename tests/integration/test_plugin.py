"""The plugin as vLLM sees it: entry point, inertness, version refusal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import vllm_dartree
from vllm_dartree.integration import activation, gate
from vllm_dartree.integration.patching import AppliedAt, Runner, check_vllm_version


def test_entry_point_is_visible_to_vllm():
    from importlib.metadata import entry_points

    (plugin,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "dartree"]
    assert plugin.value == "vllm_dartree.plugin:register"
    from vllm_dartree.plugin import register

    assert plugin.load() is register


def test_import_is_light():
    """Importing the package pulls in neither torch nor vLLM (it loads in every process)."""
    code = (
        "import sys, vllm_dartree, vllm_dartree.plugin, vllm_dartree.config; "
        "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("version", ["0.31.2", "0.35.0", "1.0.0", "garbage"])
def test_unsupported_vllm_is_refused_with_the_supported_range(version):
    with pytest.raises(RuntimeError, match=r"supports vLLM 0\.32\.x .*, 0\.33\.x and 0\.34\.x") as err:
        check_vllm_version(version)
    assert version in str(err.value)


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.33.0", "0.33.1", "0.34.0"])
def test_supported_vllm_is_accepted(version):
    check_vllm_version(version)


def test_dartree_request_on_unsupported_vllm_fails_before_loading(monkeypatch, tiny_target):
    import vllm

    from vllm_dartree.plugin import register

    register_was_applied = activation.SpeculativeConfigGate.is_applied()
    if not register_was_applied:
        register()
    monkeypatch.setattr(vllm, "__version__", "0.30.1")
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(tiny_target), skip_tokenizer_init=True,
        speculative_config={"method": "dartree", "model": str(tiny_target)},
    )
    with pytest.raises(RuntimeError, match="this environment has vLLM 0.30.1"):
        args.create_engine_config()


def test_only_the_gate_is_installed_at_load():
    """In a fresh process, loading the plugin replaces exactly the declared load-time
    touch-points (the request gate and the --spec-method choice)."""
    code = textwrap.dedent(
        """
        import vllm.engine.arg_utils as a, vllm.config as c
        before = dict(vars(a.EngineArgs)), dict(vars(c.SpeculativeConfig))
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        after = dict(vars(a.EngineArgs)), dict(vars(c.SpeculativeConfig))
        changed = [k for i in (0, 1) for k in after[i] if after[i][k] is not before[i].get(k)]
        import os
        print(changed, os.environ.get("VLLM_DARTREE_ACTIVE"))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={k: v for k, v in os.environ.items() if k != "VLLM_DARTREE_ACTIVE"},
    )
    # (MethodRegistration, the third, applies on 0.34+ only: vLLM's registry.)
    declared = sorted(t.attribute for t in activation.patches_at(AppliedAt.PLUGIN_LOAD)
                      if t.applies_here())
    assert declared == ["add_cli_args", "create_speculative_config"]
    assert out.stdout.strip().splitlines()[-1] == f"{declared} None"


NGRAM_PROBE = textwrap.dedent(
    """
    import json, logging, sys
    from vllm_dartree.harness.engine import prepare_process
    prepare_process()
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append((record.name, record.levelname, str(record.msg)))
    logging.getLogger("vllm").addHandler(Keep(level=logging.INFO))
    from vllm import SamplingParams
    from vllm_dartree.harness.engine import build_llm, generate_ids, spec_decode_counters
    llm = build_llm(model=sys.argv[1], speculative_config={
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
    prompts = [[837 % 500, 894 % 500, 837 % 500, 837 % 500, 894 % 500, 837 % 500] * 3, [5, 9, 5, 9, 5]]
    out = generate_ids(llm, prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    import vllm.engine.arg_utils as a
    print("RESULT" + json.dumps({
        "out": out, "counters": spec_decode_counters(llm), "logs": sorted(set(records)),
        "gate": hasattr(a.EngineArgs.create_speculative_config, "__dartree_patch__")}))
    """
)


def _run_ngram_probe(model, plugins: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_DARTREE_ACTIVE"}
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins
    out = subprocess.run(
        [sys.executable, "-c", NGRAM_PROBE, str(model)], capture_output=True, text=True, env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    return json.loads(line.removeprefix("RESULT"))


@pytest.mark.e2e
def test_stock_method_runs_and_logs_as_without_the_plugin(tiny_target):
    with_plugin = _run_ngram_probe(tiny_target, plugins=None)
    without_plugin = _run_ngram_probe(tiny_target, plugins="none-but-stock")
    assert with_plugin["gate"] and not without_plugin["gate"]
    assert with_plugin["out"] == without_plugin["out"]
    assert with_plugin["counters"] == without_plugin["counters"]
    assert with_plugin["counters"]["num_drafts"] > 0
    # Same log statements (templates, so timings and pids do not matter).
    differing = set(map(tuple, with_plugin["logs"])) ^ set(map(tuple, without_plugin["logs"]))
    assert not differing, differing


def test_on_vllm_0_34_dartree_is_a_registered_method_and_no_v1_glue_applies(monkeypatch):
    """0.34 (no V1 runner, a custom-speculator registry): activation registers "dartree"
    through vLLM's API, applies no V1 touch-point and no init_speculator patch, and the
    gate hands vLLM the registered method. (0.34 cannot run here: a stand-in registry
    module records the call; the compat test checks the real API's signature.)"""
    import ast
    import types

    import vllm

    import vllm_dartree.integration.v2.speculator as speculator

    calls = []
    registry = types.ModuleType("stand_in_registry")
    registry._CUSTOM_CONFIGS = {}
    registry.register_speculative_method = lambda name, config_cls: calls.append(
        (name, config_cls))
    monkeypatch.setitem(sys.modules, "stand_in_registry", registry)
    monkeypatch.setattr(gate.MethodRegistration, "registry", "stand_in_registry")
    monkeypatch.setattr(vllm, "__version__", "0.34.0")
    assert gate.MethodRegistration.applies_here()
    gate.MethodRegistration.apply()
    try:
        assert calls == [("dartree", gate.MethodRegistration.config_path)]
    finally:
        gate.MethodRegistration.revert()
    patches = activation.patches_at(AppliedAt.DARTREE_REQUESTED)
    assert {t.__name__ for t in patches} == {
        "ActiveInEngineProcesses", "DrafterArchitecture", "DSparkDrafterArchitecture",
        "SpecForgeDominoArchitecture", "SpecForgeDominoDrafterArchitecture",
        "SpecForgeDSparkDrafterArchitecture", "CpuTreeAttention", "TritonTreeAttention",
        "SpecConvGlobal", "SpecRecurrenceGlobal", "TreeRowsInTritonGdn", "NoFusedChainKernel",
        "DraftCountsKept", "DraftCountsHandedOver", "DraftsKeptByScheduler",
        "DraftsWithoutRpc", "DraftsWithAsyncOutput", "SpecDecodeSamplingCheck",
        "PenaltiesOnTreePaths"}
    assert not any(t.runner is Runner.V1 for t in patches)
    assert [t.__name__ for t in activation.patches_at(AppliedAt.PLUGIN_LOAD)] == [
        "SpeculativeConfigGate", "SpecMethodChoice", "MethodRegistration"]
    # The registered config names our V2 speculator (read as text: it imports 0.34 only).
    module, _, cls = gate.MethodRegistration.config_path.rpartition(".")
    source = Path(vllm_dartree.__file__).parent.joinpath(
        *module.split(".")[1:]).with_suffix(".py").read_text()
    (config,) = [n for n in ast.walk(ast.parse(source))
                 if isinstance(n, ast.ClassDef) and n.name == cls]
    (path,) = [n.value.value for n in config.body if isinstance(n, ast.Assign)
               and n.targets[0].id == "speculator_class"]
    assert path == f"{speculator.__name__}.{speculator.DARTreeSpeculator.__name__}"
