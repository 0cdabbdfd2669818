// SPDX-License-Identifier: Apache-2.0
#include "engine/hf_export.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "models/family.h"

namespace strata {

namespace {

bool IsFile(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// `dir`/`name` as JSON; an empty object when `dir` is "" or has no such file.
Result<nlohmann::json> ReadJsonIn(const std::string& dir, const std::string& name) {
  if (dir.empty() || !IsFile(dir + "/" + name)) return nlohmann::json::object();
  const std::string path = dir + "/" + name;
  std::ifstream in(path);
  if (!in) return ErrnoStatus("cannot open", path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(path + " is not a JSON object");
  return j;
}

}  // namespace

Result<nlohmann::json> HfConfigJson(const models::ModelSpec& spec, const std::string& source_dir,
                                    const std::string& torch_dtype) {
  ASSIGN_OR_RETURN(nlohmann::json base, ReadJsonIn(source_dir, "config.json"));
  // The family's own class and fields (models/family.h).
  ASSIGN_OR_RETURN(nlohmann::json c, models::WriteHfConfig(spec, std::move(base)));
  // The dtype of the weights beside it, under the source's key: transformers
  // 5's "dtype" (or both, where the source has both), else "torch_dtype".
  const bool both = c.contains("dtype") && c.contains("torch_dtype");
  if (c.contains("dtype")) c["dtype"] = torch_dtype;
  if (!c.contains("dtype") || both) c["torch_dtype"] = torch_dtype;
  // A token id the vocabulary no longer holds would break generation.
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (c.contains(k) && c[k].is_number_integer() && c[k].get<int64_t>() >= spec.vocab_size) c.erase(k);
  return c;
}

Result<nlohmann::json> HfGenerationConfig(const nlohmann::json& config, const std::string& source_dir) {
  ASSIGN_OR_RETURN(nlohmann::json g, ReadJsonIn(source_dir, "generation_config.json"));
  if (!g.empty()) return g;
  g = {{"_from_model_config", true}};
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id"})
    if (config.contains(k) && !config[k].is_null()) g[k] = config[k];
  return g;
}

std::vector<std::string> TokenizerFiles(const std::string& source_dir) {
  std::vector<std::string> out;
  if (source_dir.empty()) return out;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                           "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
                           "chat_template.jinja"})
    if (IsFile(source_dir + "/" + name)) out.push_back(name);
  return out;
}

std::string ModelSourceDir(const std::string& init_from) {
  if (init_from.empty()) return "";
  struct stat st {};
  if (::stat(init_from.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return init_from;
  const std::string parent = std::filesystem::path(init_from).parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace strata
