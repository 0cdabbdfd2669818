// SPDX-License-Identifier: Apache-2.0
#include "models/family.h"

#include "models/gpt2.h"
#include "models/llama.h"

namespace strata::models {

const std::vector<Family>& Families() {
  static const std::vector<Family> families{
      {"gpt2", {"GPT2LMHeadModel"}, Gpt2FromDesc, Gpt2ReadHfConfig, Gpt2WriteHfConfig},
      {"llama", {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"}, LlamaFromDesc, LlamaReadHfConfig,
       LlamaWriteHfConfig},
  };
  return families;
}

std::string SupportedArchitectures() {
  std::string s;
  for (const Family& f : Families()) {
    if (!s.empty()) s += ", ";
    s += std::string(f.name) + " (";
    for (size_t i = 0; i < f.hf_architectures.size(); ++i) s += (i ? ", " : "") + f.hf_architectures[i];
    s += ")";
  }
  return s;
}

Result<const Family*> FindFamily(const std::string& arch) {
  for (const Family& f : Families()) {
    if (arch == f.name) return &f;
    for (const std::string& a : f.hf_architectures)
      if (arch == a) return &f;
  }
  return InvalidArgument("the architecture \"" + arch + "\" is not supported; supported: " + SupportedArchitectures());
}

Result<ModelSpec> BuildModel(const ModelDesc& desc) {
  ASSIGN_OR_RETURN(const Family* f, FindFamily(desc.arch));
  ModelDesc d = desc;
  if (d.hf_architecture.empty()) {
    d.hf_architecture = d.arch == f->name ? f->hf_architectures.front() : d.arch;
  } else {
    bool known = false;
    for (const std::string& a : f->hf_architectures) known = known || a == d.hf_architecture;
    if (!known)
      return InvalidArgument("the architecture \"" + d.hf_architecture + "\" is not of the " + f->name +
                             " family; supported: " + SupportedArchitectures());
  }
  return f->build(d);
}

Result<ModelDesc> ReadHfConfig(const nlohmann::json& config, const std::string& path) {
  if (!config.is_object()) return InvalidArgument(path + ": not a JSON object");
  std::string arch;
  auto a = config.find("architectures");
  if (a != config.end() && a->is_array() && !a->empty() && a->front().is_string()) {
    arch = a->front().get<std::string>();
  } else {
    auto t = config.find("model_type");
    if (t == config.end() || !t->is_string())
      return InvalidArgument(path + ": no \"architectures\" (nor \"model_type\") says which model this is; supported: " +
                             SupportedArchitectures());
    arch = t->get<std::string>();
  }
  Result<const Family*> f = FindFamily(arch);
  if (!f.ok()) return f.status().WithContext(path + ": architectures");
  ASSIGN_OR_RETURN(ModelDesc d, (*f)->read_hf_config(config, path));
  d.arch = (*f)->name;
  if (d.hf_architecture.empty()) d.hf_architecture = arch == (*f)->name ? (*f)->hf_architectures.front() : arch;
  return d;
}

Result<nlohmann::json> WriteHfConfig(const ModelSpec& spec, nlohmann::json base) {
  ASSIGN_OR_RETURN(const Family* f, FindFamily(spec.family));
  if (!base.is_object()) base = nlohmann::json::object();
  return f->write_hf_config(spec, std::move(base));
}

}  // namespace strata::models
