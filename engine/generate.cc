// SPDX-License-Identifier: Apache-2.0
#include "engine/generate.h"

#include <chrono>

namespace strata {

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Result<GenerateStats> Generate(models::Decoder& decoder, const GenerateRequest& r,
                               const std::function<Status(int32_t)>& emit) {
  RETURN_IF_ERROR(CheckSamplingOptions(r.sampling));
  const int64_t P = static_cast<int64_t>(r.prompt.size());
  if (P < 1) return InvalidArgument("the prompt has no tokens");
  if (P > decoder.max_rows() || P > decoder.capacity())
    return InvalidArgument("the prompt's " + std::to_string(P) + " tokens exceed the decoder's " +
                           std::to_string(std::min(decoder.max_rows(), decoder.capacity())) + " positions");
  decoder.Reset();
  Sampler sampler(r.sampling);
  GenerateStats st;
  st.prompt_tokens = P;
  std::vector<float> logits;
  const double t0 = Now();
  RETURN_IF_ERROR(decoder.Step(r.prompt.data(), P, models::Decoder::Logits::kLast, &logits));
  double t1 = Now();
  st.prefill_seconds = t1 - t0;
  for (int64_t i = 0; i < r.max_new_tokens; ++i) {
    ASSIGN_OR_RETURN(const int32_t next, sampler.Next(logits));
    ++st.new_tokens;
    RETURN_IF_ERROR(emit(next));
    if (next == r.stop_token) {
      st.stopped = true;
      break;
    }
    if (i + 1 == r.max_new_tokens || decoder.position() >= decoder.capacity()) break;
    RETURN_IF_ERROR(decoder.Step(&next, 1, models::Decoder::Logits::kLast, &logits));
  }
  st.decode_seconds = Now() - t1;
  return st;
}

}  // namespace strata
