"""CorrectionGraphs with capture off (the padded fixed-shape path a GPU would capture) against
the plain head.

Padding adds rows to the head's matrix products, and BLAS picks its kernels by row count:
rows left over from its tiles are summed in another order, so the last bit of a score can
change with the number of rows (it changes with the batch size without padding too). What
padding must not do is let the padding rows reach the real ones; that is checked bit for
bit. The trees (tokens, parents, depths) are compared exactly, the scores to float32
rounding, and bit for bit where the batch is already a bucket size (same shapes).
"""

import pytest
import torch

from vllm_dartree.tree import DominoHead, build_tree
from vllm_dartree.tree.graphs import CorrectionGraphs, bucket_size

HIDDEN, STATE, PROJ, VOCAB, DEPTHS = 16, 12, 8, 96, 6


def make_inputs(seed: int, num_requests: int, *, with_table: bool):
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(num_requests, DEPTHS, VOCAB, generator=gen) * 2
    hidden = torch.randn(num_requests, DEPTHS, HIDDEN, generator=gen)
    root = torch.randint(0, VOCAB, (num_requests,), generator=gen)
    head = DominoHead.random(VOCAB, HIDDEN, STATE, PROJ, generator=gen, scale=2.0)
    return base, hidden, root, head.with_input_gate_table() if with_table else head


def assert_same_tree(got, expected, *, bitwise: bool):
    for name in ("tokens", "parents", "depths", "num_nodes", "valid"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    if bitwise:
        assert torch.equal(got.scores, expected.scores)
    else:
        torch.testing.assert_close(got.scores, expected.scores, rtol=1e-6, atol=1e-6)


def test_bucket_sizes():
    assert [bucket_size(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 33)] == [1, 1, 2, 4, 4, 8, 8, 16, 64]


@pytest.mark.parametrize("variant", ["pruned", "fixed", "chain"])
@pytest.mark.parametrize("num_requests", [1, 3, 4, 5, 11])
def test_padded_path_equals_plain_head(variant, num_requests):
    base, hidden, root, head = make_inputs(num_requests, num_requests,
                                           with_table=num_requests % 2 == 1)
    options = dict(budget=24, top_k=10, **({"width": 5} if variant == "pruned" else {}))
    graphs = CorrectionGraphs(head, capture=False)
    expected = build_tree(variant, base, hidden, root, head, **options)
    got = build_tree(variant, base, hidden, root, head, graphs=graphs, **options)
    assert_same_tree(got, expected, bitwise=bucket_size(num_requests) == num_requests)
    assert graphs.num_captured() == 0  # CPU: nothing is captured, the padded path runs


def test_one_graphs_object_serves_changing_batch_sizes():
    """Buffers are reused across calls of one bucket: a smaller batch after a larger one must
    not see the larger batch's rows."""
    _, _, _, head = make_inputs(0, 1, with_table=True)
    graphs = CorrectionGraphs(head, capture=False)
    for num_requests in (7, 5, 8, 6):
        base, hidden, root, _ = make_inputs(num_requests, num_requests, with_table=False)
        expected = build_tree("pruned", base, hidden, root, head, budget=20, top_k=8, width=4)
        got = build_tree("pruned", base, hidden, root, head, budget=20, top_k=8, width=4,
                         graphs=graphs)
        assert_same_tree(got, expected, bitwise=num_requests == 8)
    assert {key[1] for key in graphs._steps} == {8}  # one bucket served all four batches


def test_graphs_must_wrap_the_head():
    base, hidden, root, head = make_inputs(0, 2, with_table=False)
    other = CorrectionGraphs(make_inputs(1, 2, with_table=False)[3])
    with pytest.raises(ValueError, match="graphs must wrap the head"):
        build_tree("pruned", base, hidden, root, head, budget=8, top_k=4, width=2, graphs=other)


@pytest.mark.parametrize("with_table", [False, True])
def test_padding_rows_never_reach_real_rows(with_table):
    """Same padded shape, different padding content: the real rows are bit-identical."""
    _, _, _, head = make_inputs(2, 1, with_table=with_table)
    gen = torch.Generator().manual_seed(3)
    real, pad, nodes, k = 3, 5, 4, 10

    def rows(*shape, noise=1.0):
        return torch.randn(*shape, generator=gen) * noise

    states, z_proj = rows(real, nodes, STATE), rows(real, PROJ)
    weights, base = rows(real, k, PROJ), rows(real, k)
    tokens = torch.randint(0, VOCAB, (real, nodes), generator=gen)
    results = []
    for noise in (0.0, 1e3):  # zero padding, then large junk in the padding rows
        padded = [torch.cat([x, rows(pad, *x.shape[1:], noise=noise)])
                  for x in (base, z_proj, weights, states)]
        junk_tokens = torch.randint(0, VOCAB, (pad, nodes), generator=gen)
        results.append((head.corrected_logprobs(*padded)[:real],
                        head.advance(padded[3], torch.cat([tokens, junk_tokens]))[:real]))
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("max_requests", [1, 5, 8])
def test_every_shape_a_build_uses_is_prepared_at_load(max_requests):
    """capture_all_shapes makes (on CUDA: captures) every per-depth head call shape; serving
    any batch of 1..max_requests requests afterwards prepares nothing new."""
    from vllm_dartree.tree.build import capture_all_shapes

    _, _, _, head = make_inputs(7, 1, with_table=True)
    settings = dict(budget=12, top_k=8, width=3)
    graphs = CorrectionGraphs(head, max_bucket=bucket_size(max_requests))
    capture_all_shapes(graphs, {"pruned", "fixed", "chain"}, max_requests, DEPTHS,
                       settings["budget"], settings["top_k"], settings["width"])
    prepared = set(graphs._steps)
    assert prepared
    for requests in range(1, max_requests + 1):
        base, hidden, root, _ = make_inputs(requests, requests, with_table=True)
        for variant in ("pruned", "fixed", "chain"):
            build_tree(variant, base, hidden, root, head, graphs=graphs, **settings)
    assert set(graphs._steps) == prepared
