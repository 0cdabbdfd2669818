// SPDX-License-Identifier: Apache-2.0
#include "optim/gpu_adam.h"

#include "optim/gpu_adam_launch.h"

namespace strata::optim {

Status GpuAdamStep(const AdamShard& s, const AdamHyper& hyper, double grad_scale, void* stream,
                   uint64_t* device_nonfinite_count) {
  RETURN_IF_ERROR(s.Validate());
  if (s.out_of_place())
    return InvalidArgument("GpuAdamStep updates in place: AdamShard.master_out / exp_avg_out / exp_avg_sq_out "
                           "must be null (the out-of-place form is the CPU Adam's)");
  ASSIGN_OR_RETURN(const AdamCoefficients c, MakeAdamCoefficients(hyper, grad_scale));
  if (s.n == 0) return Status::OK();
  AdamGpuShard g;
  g.n = static_cast<int64_t>(s.n);
  g.master = s.master;
  g.exp_avg = s.exp_avg;
  g.exp_avg_sq = s.exp_avg_sq;
  g.state_dtype = s.state_dtype;
  g.grad = s.grad;
  g.grad_dtype = s.grad_dtype;
  g.param_out = s.param_out;
  g.param_out_dtype = s.param_out_dtype;
  g.nonfinite_count = device_nonfinite_count;
  return LaunchAdamGpu(g, c, stream);
}

}  // namespace strata::optim
