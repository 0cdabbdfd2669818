#include "engine/model_config.h"

#include "models/gpt2.h"

namespace strata {

Result<models::ModelSpec> ModelSpecFor(const Config& c) {
  models::GptConfig g;
  g.n_layer = c.model.n_layer;
  g.n_embd = c.model.n_embd;
  g.n_head = c.model.n_head;
  g.vocab_size = c.model.vocab_size;
  g.padded_vocab_size = 0;
  g.seq_len = c.model.seq_len;
  Result<models::ModelSpec> spec = models::Gpt2Spec(g);
  if (!spec.ok()) return spec.status().WithContext(c.source + ": model");
  return spec;
}

DType ComputeDType(const Config& c) {
  if (c.bf16) return DType::kBF16;
  if (c.fp16.enabled) return DType::kF16;
  return DType::kF32;
}

double ModelFlopsPerToken(const models::ModelSpec& m, int64_t seq) {
  return 6.0 * static_cast<double>(m.NumParameters()) +
         12.0 * static_cast<double>(m.n_layer) * static_cast<double>(m.d_model) * static_cast<double>(seq);
}

}  // namespace strata
