// SPDX-License-Identifier: Apache-2.0
// Rotary position embedding forward and backward (HF rotate_half pairing).
//
// One thread per (row, column) of the first half of each rotated head: it
// reads the pair (i, i + D/2), rotates it by the angle fp32(t * inv_freq[i])
// (negated for the backward) and writes both, so `out` may alias `in`.
// Columns past the rotated heads are copied by their own threads (nothing to
// do in place).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/rope_params.h"

namespace strata::kernels::cuda {
namespace {

// out, in: (rows, W); rows = B*T, position = offset + row % T.
template <typename T>
__global__ void rope_kernel(T* out, const T* in, int64_t rows, int T_, int64_t offset, int W, int rotated, int D, RopeParams p,
                            float sign) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * W) return;
  const int64_t r = idx / W;
  const int j = static_cast<int>(idx % W);
  const int half = D / 2;
  if (j >= rotated) {
    if (out != in) out[idx] = in[idx];
    return;
  }
  const int i = j % D;
  if (i >= half) return;  // the pair's first thread does both
  const float angle = static_cast<float>(offset + r % T_) * RopeInvFreq(p, D, i);
  float s, c;
  sincosf(angle, &s, &c);
  s *= sign;
  const int64_t lo_at = idx, hi_at = idx + half;
  const float lo = ToF(in[lo_at]), hi = ToF(in[hi_at]);
  out[lo_at] = FromF<T>(lo * c - hi * s);
  out[hi_at] = FromF<T>(hi * c + lo * s);
}

Status Launch(cudaStream_t stream, const RopeArgs& a, void* out, const void* in, float sign, const char* op) {
  const int64_t rows = a.batch * a.seq;
  if (rows == 0) return Status::OK();
  return DispatchFloat(a.dtype, op, [&](auto tag) -> Status {
    using T = decltype(tag);
    rope_kernel<T><<<CeilDiv(rows * a.width, 256), 256, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(in), rows, static_cast<int>(a.seq), a.position_offset, static_cast<int>(a.width),
        static_cast<int>(a.heads * a.head_dim), static_cast<int>(a.head_dim), a.rope, sign);
    CUDA_RETURN_IF_LAUNCH_ERROR("rope_kernel");
    return Status::OK();
  });
}

}  // namespace

Status RopeForward(cudaStream_t stream, const RopeArgs& a, void* out, const void* in) {
  return Launch(stream, a, out, in, 1.f, "RopeForward");
}

Status RopeBackward(cudaStream_t stream, const RopeArgs& a, void* dx, const void* dy) {
  return Launch(stream, a, dx, dy, -1.f, "RopeBackward");
}

}  // namespace strata::kernels::cuda
