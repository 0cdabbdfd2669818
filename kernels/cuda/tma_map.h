// SPDX-License-Identifier: Apache-2.0
// Host side of the TMA copies in tma.cuh: the tensor map a kernel takes as a
// __grid_constant__ parameter.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "base/status.h"

namespace strata::kernels::cuda {

// Host: a tensor map over a (dim2, dim1, dim0) array of 16-bit elements at
// `base`, dim0 innermost, rows of `stride1` elements and planes of `stride2`,
// read in boxes of (1, box1, 64) with the 128-byte swizzle. InvalidArgument
// when the address or strides are not 16-byte multiples (a TMA rule), the
// driver's error otherwise.
Status EncodeTmaMap16(CUtensorMap* map, const void* base, uint64_t dim0, uint64_t dim1, uint64_t dim2,
                      uint64_t stride1, uint64_t stride2, uint32_t box1, bool bf16);

// Host: the map over a packed [batch, seq, row] activation of rows of `row`
// elements (qkv: (H + 2 KV) D; out, dout: H D), read in boxes of `box_rows`
// positions of one sequence: rows past `seq` arrive as zeros, never as the
// next sequence's.
inline Status EncodeSequenceTmaMap(CUtensorMap* map, const void* base, uint64_t row, uint64_t seq, uint64_t batch,
                                   uint32_t box_rows, bool bf16) {
  return EncodeTmaMap16(map, base, row, seq, batch, row, row * seq, box_rows, bf16);
}

}  // namespace strata::kernels::cuda
