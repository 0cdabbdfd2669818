#include "engine/hf_weights.h"

#include <sys/stat.h>

#include <algorithm>
#include <vector>

namespace strata {

Result<std::string> HfWeightsFile(const std::string& path, const std::string& flag) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus("cannot read " + flag, path);
  if (!S_ISDIR(st.st_mode)) return path;
  const std::string file = path + "/model.safetensors";
  if (::stat(file.c_str(), &st) == 0) return file;
  if (::stat((path + "/model.safetensors.index.json").c_str(), &st) == 0)
    return Unavailable(flag + " " + path + " holds a sharded checkpoint (model.safetensors.index.json), which is "
                       "not read yet: give one model.safetensors");
  for (const char* other : {"pytorch_model.bin", "tf_model.h5", "flax_model.msgpack"})
    if (::stat((path + "/" + other).c_str(), &st) == 0)
      return InvalidArgument(flag + " " + path + " has " + other + " but no model.safetensors: strata reads "
                             "safetensors (save the model with safe_serialization=True)");
  return NotFound(flag + " " + path + " is a directory without a model.safetensors");
}

Status ReadUnitFromHf(const SafetensorsFile& f, const models::ModelSpec& spec, int unit, const std::string& prefix,
                      float* master) {
  const std::string& base = spec.hf_base_prefix;
  const std::string& path = f.path();
  for (const models::ParamSpec* t : spec.ParamsOf(unit)) {
    std::string name = prefix + t->name;
    const SafetensorsEntry* e = f.Find(name);
    if (!e && !base.empty() && t->name.rfind(base, 0) == 0) {
      name = prefix + t->name.substr(base.size());
      e = f.Find(name);
    }
    if (!e) return NotFound("tensor '" + prefix + t->name + "' is not in " + path);
    bool shape_ok = e->shape.rank() == static_cast<int>(t->shape.size());
    for (size_t d = 0; shape_ok && d < t->shape.size(); ++d)
      shape_ok = t->extra_rows_ok && d == 0 ? e->shape[0] >= t->shape[0] : e->shape[static_cast<int>(d)] == t->shape[d];
    if (!shape_ok) {
      std::string want = "[";
      for (size_t d = 0; d < t->shape.size(); ++d) want += (d ? ", " : "") + std::to_string(t->shape[d]);
      return InvalidArgument("tensor '" + name + "' in " + path + " has shape " + e->shape.ToString() +
                             ", the configured model needs " + want + "]" +
                             (t->extra_rows_ok ? " (at least seq_len rows)" : ""));
    }
    ASSIGN_OR_RETURN(std::vector<float> v, f.ReadF32(name));
    std::copy(v.begin(), v.begin() + t->numel, master + t->offset);
  }
  return Status::OK();
}

}  // namespace strata
