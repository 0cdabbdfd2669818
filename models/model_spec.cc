// SPDX-License-Identifier: Apache-2.0
#include "models/model_spec.h"

#include <string>

namespace strata::models {

const BlockParam* BlockSpec::Find(const std::string& name) const {
  for (const BlockParam& p : params)
    if (p.name == name) return &p;
  return nullptr;
}

int64_t ModelSpec::NumParameters() const {
  int64_t n = 0;
  for (const ParamSpec& p : params) n += p.numel;
  return n;
}

Result<const ParamSpec*> ModelSpec::Find(const std::string& name) const {
  for (const ParamSpec& p : params)
    if (p.name == name) return &p;
  return NotFound("the " + family + " model has no parameter named \"" + name + "\"");
}

std::vector<const ParamSpec*> ModelSpec::ParamsOf(int u) const {
  std::vector<const ParamSpec*> out;
  for (const ParamSpec& p : params)
    if (p.unit == u) out.push_back(&p);
  return out;
}

int64_t PaddedVocab(int64_t vocab_size, int64_t padded_vocab_size) {
  return padded_vocab_size > 0 ? padded_vocab_size : (vocab_size + 127) / 128 * 128;
}

Status CheckTransformerShape(const std::string& who, const TransformerShape& s) {
  auto bad = [&who](const std::string& what) { return InvalidArgument(who + ": " + what); };
  auto str = [](int64_t v) { return std::to_string(v); };
  if (s.n_layer < 1) return bad("n_layer = " + str(s.n_layer) + " must be >= 1");
  if (s.n_embd < 1) return bad("n_embd = " + str(s.n_embd) + " must be >= 1");
  if (s.n_head < 1) return bad("n_head = " + str(s.n_head) + " must be >= 1");
  if (s.n_embd % s.n_head != 0)
    return bad("n_embd = " + str(s.n_embd) + " is not a multiple of n_head = " + str(s.n_head));
  if (s.vocab_size < 1) return bad("vocab_size = " + str(s.vocab_size) + " must be >= 1");
  if (s.padded_vocab_size != 0 && (s.padded_vocab_size % 128 != 0 || s.padded_vocab_size < s.vocab_size))
    return bad("padded_vocab_size = " + str(s.padded_vocab_size) +
               " must be 0 (automatic) or a multiple of 128 that is >= vocab_size = " + str(s.vocab_size));
  if (s.seq_len < 1) return bad("seq_len = " + str(s.seq_len) + " must be >= 1");
  return Status::OK();
}

}  // namespace strata::models
