"""The tree step's model state sits on the one vLLM chooses for the target: a hybrid target
(Gated-DeltaNet, Mamba) keeps vLLM's ``MambaHybridModelState`` underneath, whose recurrent-
state bookkeeping (``num_accepted_tokens`` for the GDN kernels) a plain default state would
drop without an error, and every hook either is vLLM's or calls vLLM's first."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from vllm_dartree.integration.v2.model_state import DARTreeModelState


def target_config(hybrid: bool) -> SimpleNamespace:
    """What ``resolve_model_state_cls`` reads of a VllmConfig: the model's kind and the
    layers registered for the forward (none here)."""
    return SimpleNamespace(
        model_config=SimpleNamespace(is_hybrid=hybrid, is_attention_free=False),
        compilation_config=SimpleNamespace(static_forward_context={}))


@pytest.mark.parametrize("hybrid", [False, True], ids=["attention", "hybrid"])
def test_the_model_state_is_vllms_own_underneath(hybrid):
    from vllm.v1.worker.gpu.model_states import resolve_model_state_cls
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState
    from vllm.v1.worker.gpu.model_states.mamba_hybrid import MambaHybridModelState

    from vllm_dartree.integration.v2.speculator import install_model_state

    config, model = target_config(hybrid), torch.nn.Linear(1, 1)
    stock = resolve_model_state_cls(config, model)
    assert stock is (MambaHybridModelState if hybrid else DefaultModelState)
    step = object()
    install_model_state(config, model, step)
    state_cls = resolve_model_state_cls(config, model)
    assert issubclass(state_cls, stock) and issubclass(state_cls, DARTreeModelState)
    assert state_cls.__mro__[1:3] == (DARTreeModelState, stock)  # ours first, then vLLM's
    # Every hook of vLLM's state resolves to vLLM's code, or to ours that calls it first.
    for name, hook in inspect.getmembers(stock, inspect.isfunction):
        if name.startswith("_") and name != "__init__":
            continue
        ours = getattr(state_cls, name)
        assert ours is hook or ("super()." + name) in inspect.getsource(ours), name
    if hybrid:
        assert state_cls.postprocess_state is MambaHybridModelState.postprocess_state
    # A second load of the same model (its getter is ours now) keeps the same class.
    install_model_state(config, model, step)
    assert resolve_model_state_cls(config, model) is state_cls
