"""C++ kernels over vLLM's CPU KV pages, read and written in place: tree verification
attention (:func:`tree_attention`) and KV compaction (:func:`move_slots`).

Their torch twins live in ``integration.cpu_attention``: ``tree_attention_by_blocks``
copies each request's K/V blocks and runs three batched kernels per layer (with 7-17 rows
per tree most of its time is copies and dispatch, not arithmetic), and ``copy_kv_slots``
moves slots layer by layer through eight small tensor ops each.

Layout (vLLM's CPU backend, float32, the ISAs whose cache write stores keys transposed):
``kv_cache [num_blocks, kv_heads, block, 2 * D]``; one (block, kv head) holds ``K^T``
``[D, block]`` then ``V [block, D]``. Request t's key position p lives in block
``blocks[t, p // block]`` at offset ``p % block``.

One task per (request, kv head, tile of R row slots), holding that kv head's G query heads
(R = 2 when G <= 3, else 1: R x G x 16 accumulators fit AVX2's registers): scores over
positions ``0 .. L-1`` (the prefix and the tree rows; ``bias [T, Q, L]`` is 0 where visible
and -inf where hidden) as ``sum_d q[d] K^T[d, o]`` 16 keys at a time (the keys of a block
are contiguous per d), softmax (a vectorised exp polynomial, relative error about 1e-7),
then ``sum_o p[o] V[o, :]`` 16 dims at a time; every key and value vector loaded serves all
R x G query vectors. Tasks are split over torch's intra-op threads. Only slots with
``write[t, q]`` store their row ``rows[t, q]`` of ``output``. Block and head sizes must be
multiples of 16 (vLLM's CPU backend uses multiples of 32) and G at most 8; :func:`supports`
checks.

:func:`move_slots` takes every layer's pages in one call and moves whole slots (key
column and value row in each kv head) as bytes, so it serves any dtype.

Built on first use with the machine's C++ compiler (``torch.utils.cpp_extension``, cached
under the project's ``.cache``; ``-march=native``, so the build is keyed by the CPU's
flags). Where it cannot be built, :func:`load` returns None and callers use the twin.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

constexpr int64_t LANES = 16;  // one AVX-512 register of floats (two AVX2 ones)

// exp(x) for x <= 0 (a score minus its row's max), vectorisable: x = n ln2 + r with
// |r| <= ln2 / 2, exp(r) by its degree-6 Taylor polynomial (relative error about 1e-7),
// times 2^n built in the exponent bits. Below -87 (a hidden key's -inf included) it is 0.
static inline float exp_nonpositive(float x) {
  const float clamped = std::max(x, -87.f);
  const float n = std::floor(clamped * 1.44269504f + 0.5f);
  const float r = (clamped - n * 0.693145751953125f) - n * 1.428606765330187e-6f;
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return x < -87.f ? 0.f : p * two_n;
}

// The largest of x[0 .. n-1], 16 lanes at a time (a plain max reduction stays scalar:
// the compiler keeps its NaN order).
static inline float row_max(const float* x, int64_t n) {
  float lanes[LANES];
  for (int64_t i = 0; i < LANES; ++i) lanes[i] = -std::numeric_limits<float>::infinity();
  int64_t p = 0;
  for (; p + LANES <= n; p += LANES)
#pragma omp simd
    for (int64_t i = 0; i < LANES; ++i) lanes[i] = lanes[i] > x[p + i] ? lanes[i] : x[p + i];
  for (; p < n; ++p) lanes[0] = lanes[0] > x[p] ? lanes[0] : x[p];
  float best = lanes[0];
  for (int64_t i = 1; i < LANES; ++i) best = best > lanes[i] ? best : lanes[i];
  return best;
}

// R verify rows x the G query heads of one kv head: scores [R * G, length] over the pages,
// softmax, then out[r, g] = sum_o p[r, g, o] V[o]. R and G are template parameters so the
// R x G x 16 accumulators stay in registers and each key / value vector loaded serves all
// R * G query vectors.
template <int G, int R>
void row_tile(const float* const* q, const float* kv, const int64_t* blk, int64_t nblk,
              int64_t page, int64_t block, int64_t dim, int64_t length,
              const float* const* mask, float scale, float* scores, float* const* out) {
  for (int64_t j = 0; j < nblk && j * block < length; ++j) {
    const float* keys_t = kv + blk[j] * page;  // K^T [dim, block]
    const int64_t count = std::min(block, length - j * block);
    for (int64_t o0 = 0; o0 < count; o0 += LANES) {
      float acc[R][G][LANES] = {};
      for (int64_t d = 0; d < dim; ++d) {
        const float* k = keys_t + d * block + o0;
        for (int r = 0; r < R; ++r)
          for (int g = 0; g < G; ++g) {
            const float qd = q[r * G + g][d];
#pragma omp simd
            for (int64_t i = 0; i < LANES; ++i) acc[r][g][i] += qd * k[i];
          }
      }
      const int64_t valid = std::min(LANES, count - o0);
      for (int r = 0; r < R; ++r) {
        const float* m = mask[r] + j * block + o0;
        for (int g = 0; g < G; ++g) {
          float* sc = scores + (r * G + g) * length + j * block + o0;
          // A hidden key's score is -inf whatever its slot holds (padding, stale).
          for (int64_t i = 0; i < valid; ++i)
            sc[i] = std::isinf(m[i]) ? m[i] : acc[r][g][i] * scale + m[i];
        }
      }
    }
  }
  float inv[R * G];
  for (int rg = 0; rg < R * G; ++rg) {
    float* sc = scores + rg * length;
    const float best = row_max(sc, length);
    float total = 0.f;
#pragma omp simd reduction(+ : total)
    for (int64_t p = 0; p < length; ++p) {
      sc[p] = exp_nonpositive(sc[p] - best);
      total += sc[p];
    }
    inv[rg] = 1.f / total;
  }
  for (int64_t d0 = 0; d0 < dim; d0 += LANES) {
    float acc[R][G][LANES] = {};
    for (int64_t j = 0; j < nblk && j * block < length; ++j) {
      const float* values = kv + blk[j] * page + block * dim;  // V [block, dim]
      const int64_t count = std::min(block, length - j * block);
      for (int64_t o = 0; o < count; ++o) {
        const float* v = values + o * dim + d0;
        for (int r = 0; r < R; ++r)
          for (int g = 0; g < G; ++g) {
            const float w = scores[(r * G + g) * length + j * block + o];
#pragma omp simd
            for (int64_t i = 0; i < LANES; ++i) acc[r][g][i] += w * v[i];
          }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g)
        for (int64_t i = 0; i < LANES; ++i)
          out[r * G + g][d0 + i] = acc[r][g][i] * inv[r * G + g];
  }
}

using TileFn = void (*)(const float* const*, const float*, const int64_t*, int64_t, int64_t,
                        int64_t, int64_t, int64_t, const float* const*, float, float*,
                        float* const*);

// Rows per tile: as many as keep R * G * 16 accumulators within about 12 vector registers
// of 8 lanes (AVX2; AVX-512 has room to spare).
template <int G>
constexpr int rows_per_tile() { return G <= 3 ? 2 : 1; }

template <int G>
TileFn tile_fn_for(int64_t group) {
  if constexpr (G > 8) {
    return nullptr;
  } else {
    return group == G ? &row_tile<G, rows_per_tile<G>()> : tile_fn_for<G + 1>(group);
  }
}

template <int G>
int rows_for(int64_t group) {
  if constexpr (G > 8) {
    return 1;
  } else {
    return group == G ? rows_per_tile<G>() : rows_for<G + 1>(group);
  }
}

void tree_attention(const torch::Tensor& query, const torch::Tensor& kv_cache,
                    const torch::Tensor& blocks, const torch::Tensor& rows,
                    const torch::Tensor& write, const torch::Tensor& bias, double scale,
                    torch::Tensor& output) {
  TORCH_CHECK(query.scalar_type() == at::kFloat && kv_cache.scalar_type() == at::kFloat &&
              output.scalar_type() == at::kFloat && bias.scalar_type() == at::kFloat,
              "float32 query, kv_cache, bias and output");
  TORCH_CHECK(blocks.scalar_type() == at::kLong && rows.scalar_type() == at::kLong &&
              write.scalar_type() == at::kBool, "int64 blocks and rows, bool write");
  TORCH_CHECK(kv_cache.is_contiguous() && blocks.is_contiguous() && rows.is_contiguous() &&
              write.is_contiguous() && bias.is_contiguous(), "contiguous pages and plan");
  TORCH_CHECK(query.stride(2) == 1 && output.stride(2) == 1, "rows of contiguous floats");
  const int64_t num_req = rows.size(0), num_slots = rows.size(1);
  const int64_t heads = query.size(1), dim = query.size(2);
  const int64_t kv_heads = kv_cache.size(1), block = kv_cache.size(2);
  const int64_t group = heads / kv_heads, length = bias.size(2), nblk = blocks.size(1);
  TORCH_CHECK(block % LANES == 0 && dim % LANES == 0, "block and head size multiples of 16");
  const TileFn tile_fn = tile_fn_for<1>(group);
  TORCH_CHECK(tile_fn != nullptr, "at most 8 query heads per kv head");
  const int64_t tile = rows_for<1>(group), num_tiles = (num_slots + tile - 1) / tile;
  const float* q_base = query.data_ptr<float>();
  const float* kv = kv_cache.data_ptr<float>();
  const int64_t* blk = blocks.data_ptr<int64_t>();
  const int64_t* row = rows.data_ptr<int64_t>();
  const bool* wr = write.data_ptr<bool>();
  const float* bias_base = bias.data_ptr<float>();
  float* out_base = output.data_ptr<float>();
  const int64_t page = block * 2 * dim;  // one (block, kv head)
  at::parallel_for(0, num_req * kv_heads * num_tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(tile * group * length);
    std::vector<float> discard(group * dim);  // where a tile's missing rows are written
    std::vector<const float*> q(tile * group), mask(tile);
    std::vector<float*> out(tile * group);
    std::vector<int64_t> head_blocks(nblk);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / (kv_heads * num_tiles);
      const int64_t kvh = (task / num_tiles) % kv_heads;
      const int64_t first = (task % num_tiles) * tile;
      bool any = false;
      for (int64_t r = 0; r < tile; ++r) {
        // The tail tile repeats its last slot; unwritten slots compute into `discard`.
        const int64_t s = std::min(first + r, num_slots - 1);
        const bool keep = first + r < num_slots && wr[t * num_slots + s];
        any = any || keep;
        const int64_t q_row = row[t * num_slots + s];
        mask[r] = bias_base + (t * num_slots + s) * length;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t h = kvh * group + g;
          q[r * group + g] = q_base + q_row * query.stride(0) + h * query.stride(1);
          out[r * group + g] = keep ? out_base + q_row * output.stride(0) + h * output.stride(1)
                                    : discard.data() + g * dim;
        }
      }
      if (!any) continue;
      for (int64_t j = 0; j < nblk; ++j) head_blocks[j] = blk[t * nblk + j] * kv_heads + kvh;
      tile_fn(q.data(), kv, head_blocks.data(), nblk, page, block, dim, length, mask.data(),
              static_cast<float>(scale), scores.data(), out.data());
    }
  });
}

// KV compaction: in every layer's pages, slot dst[i] takes the keys and values of slot
// src[i]. All pairs are read before any is written (a path's moves can chain: one pair's
// source is another's destination). Any dtype: elements are moved as bytes.
void move_slots(const std::vector<torch::Tensor>& caches, const torch::Tensor& src,
                const torch::Tensor& dst) {
  TORCH_CHECK(src.scalar_type() == at::kLong && dst.scalar_type() == at::kLong &&
              src.is_contiguous() && dst.is_contiguous() && src.numel() == dst.numel(),
              "src and dst: contiguous int64 slots of equal count");
  const int64_t count = src.numel();
  const int64_t* from = src.data_ptr<int64_t>();
  const int64_t* to = dst.data_ptr<int64_t>();
  std::vector<uint8_t> held;
  for (const torch::Tensor& cache : caches) {
    TORCH_CHECK(cache.dim() == 4 && cache.is_contiguous(),
                "contiguous pages [blocks, kv_heads, block, 2 * head]");
    const int64_t kv_heads = cache.size(1), block = cache.size(2), dim = cache.size(3) / 2;
    const int64_t bytes = cache.element_size(), slots = cache.size(0) * block;
    const int64_t page = block * 2 * dim * bytes;  // one (block, kv head)
    const int64_t slot_bytes = 2 * dim * bytes;  // one slot's key and value
    uint8_t* base = static_cast<uint8_t*>(cache.data_ptr());
    held.resize(count * kv_heads * slot_bytes);
    for (int pass = 0; pass < 2; ++pass) {
      const bool reading = pass == 0;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t slot = reading ? from[i] : to[i];
        TORCH_CHECK(slot >= 0 && slot < slots, "slot ", slot, " outside the pages");
        for (int64_t h = 0; h < kv_heads; ++h) {
          uint8_t* kv_page = base + ((slot / block) * kv_heads + h) * page;
          const int64_t o = slot % block;
          uint8_t* buffer = held.data() + (i * kv_heads + h) * slot_bytes;
          for (int64_t d = 0; d < dim; ++d) {  // K^T [dim, block]: column o
            uint8_t* key = kv_page + (d * block + o) * bytes;
            std::memcpy(reading ? buffer + d * bytes : key, reading ? key : buffer + d * bytes,
                        bytes);
          }
          uint8_t* value = kv_page + (block * dim + o * dim) * bytes;  // V [block, dim]: row o
          std::memcpy(reading ? buffer + dim * bytes : value,
                      reading ? value : buffer + dim * bytes, dim * bytes);
        }
      }
    }
  }
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tree_attention", &tree_attention, "tree attention over vLLM CPU KV pages");
  m.def("move_slots", &move_slots, "move KV slots in every layer's CPU pages");
}
"""


# -fopenmp: at::parallel_for splits tasks over threads only when OpenMP is compiled in.
# 512-bit vectors: gcc prefers 256 on some AVX-512 CPUs; the 16-lane loops want one register.
# -fno-trapping-math: without it gcc keeps every loop with a compare-and-select (the mask,
# the softmax's exp) scalar, as if a compare could trap; that doubled the kernel's time.
CFLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fno-math-errno",
          "-fno-trapping-math", "-fopenmp"]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


@functools.lru_cache(maxsize=1)
def load():
    """The compiled module, or None where this machine cannot build it (logged once)."""
    from torch.utils import cpp_extension

    from vllm_dartree.env import cache_dir

    key = hashlib.sha256(" ".join([SOURCE, *CFLAGS, _cpu_flags(), torch.__version__]).encode()
                         ).hexdigest()
    name = f"dartree_cpu_kv_pages_{key[:12]}"
    build = cache_dir() / "torch_extensions" / name
    build.mkdir(parents=True, exist_ok=True)
    try:
        return cpp_extension.load_inline(
            name, cpp_sources=[SOURCE], extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"],
            build_directory=str(build), verbose=False)
    except Exception as error:  # no compiler, headers or ninja: the torch twin serves
        logger.warning("dartree: the C++ kernels for CPU KV pages (tree attention, KV "
                       "compaction) could not be built (%s); using their torch twins", error)
        return None


def supports(query: torch.Tensor, kv_cache: torch.Tensor, output: torch.Tensor) -> bool:
    """The kernel's preconditions: float32 throughout, contiguous pages and rows, block and
    head sizes multiples of 16, at most 8 query heads per kv head."""
    heads, kv_heads = query.shape[1], kv_cache.shape[1]
    return (query.dtype == kv_cache.dtype == output.dtype == torch.float32
            and kv_cache.is_contiguous() and query.stride(2) == 1 and output.stride(2) == 1
            and kv_cache.shape[2] % 16 == 0 and query.shape[2] % 16 == 0
            and heads % kv_heads == 0 and heads // kv_heads <= 8)


def move_slots(caches: list[torch.Tensor], src: torch.Tensor, dst: torch.Tensor) -> None:
    """In every cache of ``caches`` (contiguous transposed-key pages of any dtype), slot
    ``dst[i]`` takes slot ``src[i]``'s keys and values, all read before any is written;
    ``load()`` must have returned a module. Twin: ``integration.cpu_attention.copy_kv_slots``
    per layer."""
    # vLLM's slot mappings are int64 on its CPU backend; any other integer type is widened.
    load().move_slots(caches, src.to(torch.int64).contiguous(), dst.to(torch.int64).contiguous())


def tree_attention(query: torch.Tensor, kv_cache: torch.Tensor, blocks: torch.Tensor,
                   rows: torch.Tensor, write: torch.Tensor, bias: torch.Tensor, scale: float,
                   output: torch.Tensor) -> None:
    """Launch the kernel (see the module docstring for the arguments); ``load()`` must
    have returned a module and :func:`supports` must hold."""
    load().tree_attention(query, kv_cache, blocks, rows, write, bias, scale, output)
