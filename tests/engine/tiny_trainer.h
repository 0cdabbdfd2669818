// The small GPT the trainer tests train: n_layer blocks of width n_embd, 4
// heads, byte vocabulary, 32 or 64 tokens, micro-batch 4 x accumulation 2
// over the bundled corpus, AdamW at lr 3e-3, quiet logging. Each test then
// sets what it is about (backend, budgets, offload devices, dtypes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/trainer.h"
#include "tests/test_util.h"

namespace strata::testing {

inline TrainOptions TinyTrainer(int64_t n_layer, int64_t n_embd = 64, int64_t seq_len = 32) {
  TrainOptions o;
  Config& c = o.config;
  c.model.n_layer = static_cast<int>(n_layer);
  c.model.n_embd = static_cast<int>(n_embd);
  c.model.n_head = 4;
  c.model.vocab_size = 256;
  c.model.seq_len = static_cast<int>(seq_len);
  c.micro_batch = 4;
  c.grad_accum = 2;
  c.train_batch_size = 8;
  c.optimizer.lr = 3e-3;
  c.steps_per_print = 1000;
  c.data.path = SourcePath("data/kjv.txt");
  return o;
}

// The named parameters of `t` (Trainer::Parameter), in order; an error fails
// the calling test (ADD_FAILURE) and leaves that entry empty.
inline std::vector<std::vector<float>> Parameters(Trainer& t, const std::vector<std::string>& names) {
  std::vector<std::vector<float>> out;
  for (const std::string& n : names) {
    auto p = t.Parameter(n);
    if (!p.ok()) ADD_FAILURE() << "Parameter(" << n << "): " << p.status().ToString();
    out.push_back(p.ok() ? std::move(p).value() : std::vector<float>{});
  }
  return out;
}

}  // namespace strata::testing
