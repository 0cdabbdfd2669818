// SPDX-License-Identifier: Apache-2.0
#include "engine/preflight.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <filesystem>

#include "base/bytes.h"
#include "engine/checkpoint.h"
#include "engine/model_config.h"
#include "engine/save_dir.h"
#include "tiers/host_tier.h"
#include "tiers/nvme/io_env.h"
#include "tiers/nvme/leftovers.h"

namespace strata {

namespace {

// A checkpoint's size: fp32 master and m and v (in their dtype) of every
// parameter, the Hugging Face weights (trainer.save_dtype), and a megabyte
// for the manifest, config and tokenizer files.
uint64_t CheckpointBytes(const models::ModelSpec& spec, const Config& c) {
  uint64_t n = 0;
  for (const auto& p : spec.params) n += static_cast<uint64_t>(p.numel);
  return (4 + 2 * DTypeSize(MomentDType(c)) + (c.trainer.save_dtype == "fp32" ? 4 : 2)) * n + (1ull << 20);
}

Status CheckNvmeDir(const std::string& dir, uint64_t need, IoEnv* env) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus("the NVMe path (nvme_path) cannot be used", dir);
  if (!S_ISDIR(st.st_mode)) return InvalidArgument("the NVMe path (nvme_path) " + dir + " is not a directory");
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) == 0 && (vfs.f_flag & ST_RDONLY))
    return IoError("the NVMe path (nvme_path) is on a read-only file system", EROFS, dir);
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return ErrnoStatus("the NVMe path (nvme_path) is not writable", dir);
  if (::statvfs(dir.c_str(), &vfs) != 0) return ErrnoStatus("cannot read the free space of the NVMe path", dir);
  const uint64_t free = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  uint64_t left = 0;
  if (auto l = nvme::FindLeftoverSwapFiles(env, dir); l.ok())
    for (const auto& f : *l) left += f.bytes;
  if (free + left >= need) return Status::OK();
  return OutOfMemory(TierKind::kNvme, need, free + left,
                     "the NVMe path " + dir + " has " + FormatBytes(free) + " free" +
                         (left ? " (and " + FormatBytes(left) + " in swap files killed runs left, which are removed)"
                               : std::string()) +
                         ", and the plan puts " + FormatBytes(need) +
                         " there: free space, or give the run more host memory (--host-memory-limit) so that less "
                         "goes to NVMe");
}

// A file the run will append to: not a directory, in a directory it may write.
Status CheckLogFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return InvalidArgument("--log-json " + path + " is a directory, not a file");
    if (::access(path.c_str(), W_OK) != 0) return ErrnoStatus("--log-json: cannot append to", path);
    return Status::OK();
  }
  const std::string parent = std::filesystem::path(path).parent_path().string();
  const std::string dir = parent.empty() ? std::string(".") : parent;
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return ErrnoStatus("--log-json: cannot create a file in", dir);
  return Status::OK();
}

// What the run starts from exists (reading it whole is the run's, which
// verifies it: engine/checkpoint.h), and a model it starts from was made
// for the run's sequence length (engine/model_config.h).
Status CheckSources(const TrainOptions& o) {
  if (!o.resume_dir.empty()) RETURN_IF_ERROR(ResolveCheckpoint(o.resume_dir).status().WithContext("--resume"));
  if (!o.init_from.empty()) {
    struct stat st {};
    if (::stat(o.init_from.c_str(), &st) != 0) return ErrnoStatus("--init-from: cannot read", o.init_from);
    RETURN_IF_ERROR(CheckSeqLenWithinSource(o.config, o.init_from));
  }
  return Status::OK();
}

}  // namespace

Status PreflightChecks(const TrainOptions& o, const RunPlan& run, const TierSizes& tiers,
                       const models::ModelSpec& spec, bool cuda, std::vector<std::string>* warnings) {
  RETURN_IF_ERROR(CheckSources(o));
  RETURN_IF_ERROR(CheckSaveDir(o.save_dir, CheckpointBytes(spec, o.config), warnings));
  if (!o.log_json.empty()) RETURN_IF_ERROR(CheckLogFile(o.log_json));
  if (run.plan.nvme_total > 0 || run.plan.optimizer == TierKind::kNvme || run.plan.params == TierKind::kNvme)
    RETURN_IF_ERROR(CheckNvmeDir(NvmeDirOf(o.config), run.plan.nvme_total, o.nvme_env ? o.nvme_env : IoEnv::Default()));
  if (tiers.host_pin && !cuda)
    RETURN_IF_ERROR(CheckMlockLimit(tiers.host).WithContext("the host tier pins " + FormatBytes(tiers.host) +
                                                            " for this plan with mlock (no GPU)"));
  return Status::OK();
}

}  // namespace strata
