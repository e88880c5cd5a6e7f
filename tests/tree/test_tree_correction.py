"""DominoHead: GRU semantics against torch.nn.GRU, candidate bias against the full bias."""

import pytest
import torch

from vllm_dartree.tree.correction import DominoHead

VOCAB, HIDDEN, STATE, PROJ = 40, 12, 6, 5


@pytest.fixture
def head() -> DominoHead:
    return DominoHead.random(VOCAB, HIDDEN, STATE, PROJ, generator=torch.Generator().manual_seed(0))


def reference_gru(head: DominoHead) -> torch.nn.GRU:
    gru = torch.nn.GRU(HIDDEN, STATE, num_layers=1, batch_first=True, bias=False)
    with torch.no_grad():
        gru.weight_ih_l0.copy_(head.gru_ih)
        gru.weight_hh_l0.copy_(head.gru_hh)
    return gru


def test_gru_step_matches_torch_gru_over_a_sequence(head):
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (3, 7), generator=gen)
    expected, _ = reference_gru(head)(head.embed[tokens])  # zero initial state
    state = head.root_state(tokens[:, 0])
    states = [state]
    for step in range(1, 7):
        state = head.advance(state.unsqueeze(1), tokens[:, step : step + 1]).squeeze(1)
        states.append(state)
    torch.testing.assert_close(torch.stack(states, dim=1), expected.detach(), rtol=1e-5,
                               atol=1e-5)


def test_gru_step_with_nonzero_state(head):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, HIDDEN, generator=gen)
    h = torch.randn(4, STATE, generator=gen)
    _, expected = reference_gru(head)(x.unsqueeze(1), h.unsqueeze(0))
    torch.testing.assert_close(head.gru_step(x, h), expected[0].detach(), rtol=1e-5, atol=1e-5)


def test_candidate_bias_equals_full_bias_at_candidates(head):
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(2, HIDDEN, generator=gen)
    h = torch.randn(2, 3, STATE, generator=gen)
    cand = torch.randint(0, VOCAB, (2, 9), generator=gen)
    bias = head.candidate_bias(z, h, cand)
    full = head.full_bias(z.unsqueeze(1).expand(2, 3, HIDDEN), h)  # [2, 3, V]
    expected = full.gather(2, cand.unsqueeze(1).expand(2, 3, 9))
    assert bias.shape == (2, 3, 9)
    torch.testing.assert_close(bias, expected, rtol=1e-5, atol=1e-5)


def test_input_gate_table_gives_the_same_states(head):
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, VOCAB, (2, 5), generator=gen)
    h = torch.randn(2, 5, STATE, generator=gen)
    fast = head.with_input_gate_table(chunk=7)
    assert fast.input_gate_table.shape == (VOCAB, 3 * STATE)
    torch.testing.assert_close(fast.advance(h, tokens), head.advance(h, tokens))
    torch.testing.assert_close(fast.root_state(tokens[:, 0]), head.root_state(tokens[:, 0]))
    with pytest.raises(ValueError, match="input_gate_table"):
        DominoHead(head.embed, head.gru_ih, head.gru_hh, head.proj0, head.proj2, 1,
                   input_gate_table=fast.input_gate_table[:, 1:])


def test_corrects_depth_follows_pure_draft_prefix_len(head):
    assert not head.corrects_depth(1) and head.corrects_depth(2)
    head.pure_draft_prefix_len = 0
    assert head.corrects_depth(1)


def test_shape_validation():
    good = DominoHead.random(VOCAB, HIDDEN, STATE, PROJ)
    with pytest.raises(ValueError, match="gru_ih"):
        DominoHead(good.embed, good.gru_ih[:-1], good.gru_hh, good.proj0, good.proj2, 1)
    with pytest.raises(ValueError, match="proj0"):
        DominoHead(good.embed, good.gru_ih, good.gru_hh, good.proj0[:, :-1], good.proj2, 1)
    with pytest.raises(ValueError, match="proj2"):
        DominoHead(good.embed, good.gru_ih, good.gru_hh, good.proj0, good.proj2[:, :-1], 1)
    with pytest.raises(ValueError, match="pure_draft_prefix_len"):
        DominoHead(good.embed, good.gru_ih, good.gru_hh, good.proj0, good.proj2, -1)
