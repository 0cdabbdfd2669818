// The whole run of `strata train` (engine/trainer.h Trainer::Run): steps,
// their log, validation, checkpoints.
#include <iostream>

#include "base/bytes.h"
#include "base/device.h"
#include "engine/model_config.h"
#include "engine/run_log.h"
#include "engine/trainer_impl.h"

namespace strata {

Status Trainer::Run(std::ostream& out) {
  Impl& I = *impl_;
  const Config& c = I.cfg();
  const int64_t total = TotalSteps(I.opt);
  out << "strata: " << I.backend->name() << "; GEMM baseline " << I.peak.what << "\n";
  out << "model: " << I.spec.n_layer << " layers, d " << I.spec.d_model << ", " << I.spec.n_head << " heads, vocab "
      << I.spec.vocab_size << ", seq " << c.model.seq_len << ": " << I.spec.NumParameters() << " parameters, "
      << c.precision() << "; batch " << c.micro_batch << " x " << c.grad_accum << " micro-batches\n";
  out << "data: " << I.data->Describe() << "\n";
  out << "plan:\n" << PlanTable();
  if (I.run.budgets.gpu_overhead)
    out << "gpu: the tier's budget is the limit less " << FormatBytes(I.run.budgets.gpu_overhead)
        << " held outside it (CUDA context, cuBLASLt, a margin)\n";
  out.flush();
  RunLog::Options lo;
  lo.total_steps = total;
  lo.every = c.steps_per_print;
  lo.peak_flops = I.peak.flops;
  lo.flops_per_token = ModelFlopsPerToken(I.spec, c.model.seq_len);
  lo.wall_clock_breakdown = c.wall_clock_breakdown;
  lo.assist = I.assist_update != nullptr;
  lo.speculative = I.run.mode.speculative;
  lo.progress = I.opt.progress;
  lo.json_path = I.opt.log_json;
  ASSIGN_OR_RETURN(RunLog log, RunLog::Open(&out, lo));
  auto validate = [&]() -> Status {
    ASSIGN_OR_RETURN(double vl, Evaluate(c.trainer.eval_batches));
    out << "step " << I.step << " | val loss " << Fixed(vl, 4) << "\n";
    return Status::OK();
  };
  while (I.step < total) {
    if (Status files = I.CheckSwapFiles(); !files.ok()) {
      // Nothing of the step has run and the deleted file's data is still
      // readable through the tier's descriptor: save it while we can.
      if (I.opt.save_dir.empty())
        return files.WithContext("stopping before step " + std::to_string(I.step + 1) +
                                 " (no --save DIR to keep the state in); resume from the last checkpoint");
      RETURN_IF_ERROR(Save(I.opt.save_dir).WithContext("saving the state after " + files.ToString()));
      return files.WithContext("stopping before step " + std::to_string(I.step + 1) + "; the state after step " +
                               std::to_string(I.step) + " was saved to " + I.opt.save_dir + " (resume from it)");
    }
    ASSIGN_OR_RETURN(StepReport r, Step());
    log.Add(r, I.store->stats());
    if (c.trainer.eval_interval > 0 && r.step % c.trainer.eval_interval == 0 && I.data->val_tokens())
      RETURN_IF_ERROR(validate());
    if (!I.opt.save_dir.empty() && I.opt.save_every > 0 && r.step % I.opt.save_every == 0 && r.step != total)
      RETURN_IF_ERROR(Save(I.opt.save_dir));
  }
  if (I.data->val_tokens()) RETURN_IF_ERROR(validate());
  if (!I.opt.save_dir.empty()) RETURN_IF_ERROR(Save(I.opt.save_dir));
  RETURN_IF_ERROR(I.pool->WaitAll(I.step));
  TierStoreStats st = I.store->stats();
  out << "memory: gpu tier peak " << FormatBytes(st.tiers[0].usage.peak_used) << " of its budget "
      << FormatBytes(st.tiers[0].usage.budget) << "; host tier peak " << FormatBytes(st.tiers[1].usage.peak_used);
  if (I.cuda()) {
    auto info = QueryGpu(0);
    if (info.ok())
      out << "; device in use now (cudaMemGetInfo, all of this process) "
          << FormatBytes(info->total_bytes - info->free_bytes);
  }
  out << "\n";
  return Status::OK();
}

}  // namespace strata
