// SPDX-License-Identifier: Apache-2.0
// EncodeTmaMap16 (tma_map.h): cuTensorMapEncodeTiled, reached through the
// runtime's driver entry point so that nothing links libcuda directly.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <string>

#include "base/cuda_check.h"
#include "kernels/cuda/tma_map.h"

namespace strata::kernels::cuda {
namespace {

Result<PFN_cuTensorMapEncodeTiled_v12000> EncodeTiledEntry() {
  static void* fn = nullptr;
  static cudaError_t err = [] {
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    if (e == cudaSuccess && found != cudaDriverEntryPointSuccess) e = cudaErrorSymbolNotFound;
    return e;
  }();
  if (err != cudaSuccess)
    return FailedPrecondition(std::string("TMA: cuTensorMapEncodeTiled is not available from the driver (") +
                              cudaGetErrorString(err) + ")");
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

}  // namespace

Status EncodeTmaMap16(CUtensorMap* map, const void* base, uint64_t dim0, uint64_t dim1, uint64_t dim2,
                      uint64_t stride1, uint64_t stride2, uint32_t box1, bool bf16) {
  const uint64_t s1 = stride1 * 2, s2 = stride2 * 2;
  if ((reinterpret_cast<uintptr_t>(base) & 15) != 0 || s1 % 16 != 0 || s2 % 16 != 0)
    return InvalidArgument("TMA: address and strides must be multiples of 16 bytes (stride " +
                           std::to_string(s1) + ", " + std::to_string(s2) + " bytes)");
  ASSIGN_OR_RETURN(auto encode, EncodeTiledEntry());
  const cuuint64_t dims[3] = {dim0, dim1, dim2};
  const cuuint64_t strides[2] = {s1, s2};
  const cuuint32_t box[3] = {64, box1, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
                            const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return InvalidArgument("TMA: cuTensorMapEncodeTiled failed (CUresult " + std::to_string(static_cast<int>(r)) +
                           ") for dims " + std::to_string(dim0) + " x " + std::to_string(dim1) + " x " +
                           std::to_string(dim2) + ", box 64 x " + std::to_string(box1));
  return Status::OK();
}

}  // namespace strata::kernels::cuda
