#include "models/model_spec.h"

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

}  // namespace strata::models
