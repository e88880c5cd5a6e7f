"""The test site's own speed-ups of Triton's interpreter (``site/sitecustomize.py``) build
the objects Triton's own code builds."""

from __future__ import annotations

import pytest

CASES = [("fp32", [4, 8]), ("fp16 pointer", [16]), ("int1", [2, 2, 2]),
         ("const int32 pointer", [4]), ("bf16", [1, 32])]


def element(name: str):
    import triton.language as tl

    kinds = {"fp32": tl.float32, "int1": tl.int1, "bf16": tl.bfloat16,
             "fp16 pointer": tl.pointer_type(tl.float16),
             "const int32 pointer": tl.pointer_type(tl.int32, const=True)}
    return kinds[name]


@pytest.mark.parametrize(("name", "shape"), CASES, ids=[c[0] for c in CASES])
def test_cached_type_facts_equal_tritons_own(name, shape):
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    for _ in range(2):  # the first call fills the cache, the second reads it
        block = tl.block_type(element(name), shape)
        stock = object.__new__(tl.block_type)
        tl.block_type.__init__.stock(stock, element(name), shape)
        assert vars(block) == vars(stock)
        for of in (block, element(name)):
            value = tl.tensor(None, of)
            expected = object.__new__(tl.tensor)
            tl.tensor.__init__.stock(expected, None, of)
            assert [s.value for s in value.shape] == [s.value for s in expected.shape]
            assert value.numel.value == expected.numel.value
            assert (value.type, value.dtype) == (expected.type, expected.dtype)
            assert interpreter._get_np_dtype(of) == interpreter._get_np_dtype.stock(of)


def test_a_shape_triton_refuses_is_still_refused():
    import triton.language as tl

    tl.block_type(tl.float32, [4])
    with pytest.raises(ValueError):
        tl.block_type(tl.float32, [3])
