// SPDX-License-Identifier: Apache-2.0
// The whole run of `strata train` (engine/trainer.h Trainer::Run): steps,
// their log, validation, checkpoints, and the stop a signal asks for
// (engine/signals.h: the step under way ends, a checkpoint is saved).
#include <iostream>

#include "base/bytes.h"
#include "base/device.h"
#include "engine/config.h"
#include "engine/model_config.h"
#include "engine/run_log.h"
#include "engine/signals.h"
#include "engine/trainer_impl.h"

namespace strata {

namespace {

// The plan as the JSON log's "run" record holds it.
nlohmann::json PlanJson(const RunPlan& run, const TierSizes& tiers, const std::string& table) {
  nlohmann::json rows = nlohmann::json::array();
  for (const Plan::Row& r : run.plan.rows) rows.push_back({{"kind", r.kind}, {"gpu", r.gpu}, {"host", r.host}, {"nvme", r.nvme}});
  return {{"rows", rows},
          {"gpu_total", run.plan.gpu_total},
          {"host_total", run.plan.host_total},
          {"nvme_total", run.plan.nvme_total},
          {"gpu_budget", run.budgets.gpu},
          {"host_budget", run.budgets.host},
          {"gpu_tier", tiers.gpu},
          {"host_tier", tiers.host},
          {"params", TierName(run.plan.params)},
          {"grads", TierName(run.plan.grads)},
          {"optimizer", TierName(run.plan.optimizer)},
          {"checkpoints", TierName(run.plan.checkpoints)},
          {"optimizer_update", run.mode.why},
          {"table", table}};
}

}  // namespace

Status Trainer::Run(std::ostream& given) {
  Impl& I = *impl_;
  std::ostream& out = I.leads() ? given : I.quiet;  // rank 0 alone logs
  const Config& c = I.cfg();
  const int64_t total = TotalSteps(I.opt);
  const std::string table = PlanTable();
  out << "strata: " << I.backend->name() << "; GEMM baseline " << I.peak.what << "\n";
  out << "model: " << I.spec.n_layer << " layers, d " << I.spec.d_model << ", " << I.spec.n_head << " heads, vocab "
      << I.spec.vocab_size << ", seq " << c.model.seq_len << ": " << I.spec.NumParameters() << " parameters, "
      << c.precision() << "; batch " << c.micro_batch << " x " << c.grad_accum << " micro-batches\n";
  out << "data: " << I.data->Describe() << "\n";
  out << ZeroStageNote(c) << "\n";
  if (I.dp) out << I.dp->Describe(I.opt, I.spec.NumParameters()) << "\n";
  out << "plan:\n" << table;
  if (I.run.budgets.gpu_overhead)
    out << "gpu: the tier's budget is the limit less " << FormatBytes(I.run.budgets.gpu_overhead)
        << " held outside it (CUDA context, cuBLASLt, a margin"
        << (I.run.budgets.ranks_device ? ", " + FormatBytes(I.run.budgets.ranks_device) +
                                             " for the ranks' collectives: staging" +
                                             (I.param_gather ? " and the gathered parameters" : "")
                                       : std::string())
        << ")\n";
  out.flush();
  RunLog::Options lo;
  lo.first_step = I.step;
  lo.total_steps = total;
  lo.every = c.steps_per_print;
  lo.peak_flops = I.peak.flops;
  lo.peak_what = I.peak.what;
  lo.flops_per_token = ModelFlopsPerToken(I.spec, c.model.seq_len);
  lo.wall_clock_breakdown = c.wall_clock_breakdown;
  lo.assist = I.assist_update != nullptr;
  lo.speculative = I.run.mode.speculative;
  lo.progress = I.opt.progress;
  lo.json_path = I.leads() ? I.opt.log_json : "";
  if (!I.leads()) lo.progress = false;
  nlohmann::json header = {{"argv", I.opt.argv},
                           {"config", ConfigToJson(c)},
                           {"plan", PlanJson(I.run, I.tiers, table)},
                           {"backend", I.backend->name()},
                           {"data", I.data->Describe()}};
  if (!I.opt.resume_dir.empty()) header["resumed_from"] = I.model_source;
  if (!I.opt.init_from.empty()) header["init_from"] = I.opt.init_from;
  ASSIGN_OR_RETURN(RunLog log, RunLog::Open(&out, lo, std::move(header)));
  Status s = I.RunSteps(total, &log);
  log.Finish(s, I.last_saved);
  const bool traced = I.trace.active();
  if (Status tr = I.trace.Finish(); !tr.ok()) {
    if (s.ok()) return tr;
    *I.log << "strata: " << tr.ToString() << "\n";  // (the run's own error is the one returned)
  } else if (traced) {
    *I.log << "trace: " << I.trace.path() << " (Chrome trace-event JSON: open it in ui.perfetto.dev or chrome://tracing)\n";
  }
  return s;
}

Status Trainer::Impl::RunSteps(int64_t total, RunLog* log) {
  const Config& c = cfg();
  Trainer& t = *owner;
  int64_t validated_step = -1;  // the step the last validation followed
  auto validate = [&]() -> Status {
    ASSIGN_OR_RETURN(double vl, t.Evaluate(c.trainer.eval_batches));
    log->Val(step, vl, c.trainer.eval_batches);
    validated_step = step;
    return Status::OK();
  };
  int64_t saved_step = -1;  // the step the last checkpoint holds
  auto save = [&]() -> Status {
    log->ClearProgress();  // Save says "saved checkpoint ..." on the log stream
    RETURN_IF_ERROR(t.Save(opt.save_dir));
    saved_step = step;
    return Status::OK();
  };
  // A signal asked to stop (engine/signals.h): the step under way has ended.
  auto stop = [&](int sig) -> Status {
    const std::string what = std::string("stopped by ") + StopSignalName(sig) + " after step " +
                             std::to_string(step) + " of " + std::to_string(total);
    if (opt.save_dir.empty()) return Cancelled(what + "; nothing was saved (no --save DIR)");
    if (saved_step != step) RETURN_IF_ERROR(save().WithContext(what + "; saving the state"));
    // The others wait for rank 0's save: under mpirun a rank that exits
    // non-zero ends the job, the saving rank with it.
    if (dp) RETURN_IF_ERROR(dp->AnyStop(sig).status().WithContext(what + "; waiting for rank 0's save"));
    return Cancelled(what + "; the state was saved to " + last_saved + " (continue with --resume " + opt.save_dir +
                     ")");
  };
  // A signal any rank has seen (with several ranks all stop together).
  auto stop_signal = [&]() -> Result<int> { return dp ? dp->AnyStop(StopSignal()) : StopSignal(); };
  while (step < total) {
    ASSIGN_OR_RETURN(const int sig, stop_signal());
    if (sig) return stop(sig);
    if (Status files = CheckSwapFiles(); !files.ok()) {
      // Nothing of the step has run and the deleted file's data is still
      // readable through the tier's descriptor: save it while we can.
      if (opt.save_dir.empty())
        return files.WithContext("stopping before step " + std::to_string(step + 1) +
                                 " (no --save DIR to keep the state in); resume from the last checkpoint");
      RETURN_IF_ERROR(save().WithContext("saving the state after " + files.ToString()));
      return files.WithContext("stopping before step " + std::to_string(step + 1) + "; the state after step " +
                               std::to_string(step) + " was saved to " + opt.save_dir + " (resume from it)");
    }
    ASSIGN_OR_RETURN(StepReport r, t.Step());
    log->Add(r, store->stats());
    if (c.trainer.eval_interval > 0 && r.step % c.trainer.eval_interval == 0 && data->val_tokens()) {
      // (A signal skips it; at ZeRO stage 3 the evaluation gathers the
      // parameters from the ranks, so they agree on skipping it.)
      bool skip = StopSignal() != 0;
      if (param_gather) {
        ASSIGN_OR_RETURN(const int sig, stop_signal());
        skip = sig != 0;
      }
      if (!skip) RETURN_IF_ERROR(validate());
    }
    if (!opt.save_dir.empty() && opt.save_every > 0 && r.step % opt.save_every == 0 && r.step != total)
      RETURN_IF_ERROR(save());
  }
  ASSIGN_OR_RETURN(const int sig, stop_signal());
  if (sig) return stop(sig);
  // The run ends with a validation, unless the interval's just ran after
  // the last step (every rank takes the same branch: the steps agree).
  if (data->val_tokens() && validated_step != step) RETURN_IF_ERROR(validate());
  if (!opt.save_dir.empty()) RETURN_IF_ERROR(save());
  RETURN_IF_ERROR(pool->WaitAll(step));
  TierStoreStats st = store->stats();
  std::string mem = "memory: gpu tier peak " + FormatBytes(st.tiers[0].usage.peak_used) + " of its budget " +
                    FormatBytes(st.tiers[0].usage.budget) + "; host tier peak " +
                    FormatBytes(st.tiers[1].usage.peak_used);
  if (cuda()) {
    auto info = QueryGpu(0);
    if (info.ok())
      mem += "; device in use now (cudaMemGetInfo, all of this process) " +
             FormatBytes(info->total_bytes - info->free_bytes);
  }
  log->Line(mem);
  return Status::OK();
}

}  // namespace strata
