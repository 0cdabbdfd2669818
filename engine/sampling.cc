// SPDX-License-Identifier: Apache-2.0
#include "engine/sampling.h"

#include <algorithm>
#include <cmath>

namespace strata {

Status CheckSamplingOptions(const SamplingOptions& o) {
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    return InvalidArgument("--temperature " + std::to_string(o.temperature) + ": must be finite and >= 0 (0: greedy)");
  if (o.top_k < 0) return InvalidArgument("--top-k " + std::to_string(o.top_k) + ": must be >= 0 (0: no cut)");
  if (!(o.top_p > 0 && o.top_p <= 1))
    return InvalidArgument("--top-p " + std::to_string(o.top_p) + ": must be in (0, 1] (1: no cut)");
  return Status::OK();
}

Result<int32_t> Sampler::Next(std::span<const float> logits) {
  if (logits.empty()) return InvalidArgument("Sampler: an empty row of logits");
  work_.clear();
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::isfinite(logits[i])) work_.push_back({logits[i], static_cast<int32_t>(i)});
  if (work_.empty()) return InvalidArgument("Sampler: no finite logit among " + std::to_string(logits.size()));
  // Most likely first; equal logits by id.
  auto order = [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; };
  if (o_.temperature == 0) return std::min_element(work_.begin(), work_.end(), order)->second;
  std::sort(work_.begin(), work_.end(), order);
  if (o_.top_k > 0 && static_cast<size_t>(o_.top_k) < work_.size()) work_.resize(static_cast<size_t>(o_.top_k));
  const double top = work_[0].first;
  double sum = 0;
  for (auto& [v, id] : work_) sum += v = std::exp((v - top) / o_.temperature);
  if (o_.top_p < 1) {
    double kept = 0;
    size_t n = 0;
    while (n < work_.size() && kept < o_.top_p * sum) kept += work_[n++].first;
    work_.resize(std::max<size_t>(n, 1));
    sum = kept > 0 ? kept : work_[0].first;
  }
  const double u = Uniform() * sum;
  double acc = 0;
  for (const auto& [p, id] : work_) {
    acc += p;
    if (u < acc) return id;
  }
  return work_.back().second;  // u within rounding of the total
}

}  // namespace strata
