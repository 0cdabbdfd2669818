// Hugging Face weights into a model's units: which file a model directory's
// weights are in, and one unit's parameters read from it by their Hugging
// Face names (with or without the family's base prefix, "transformer."),
// shapes checked. Shared by --init-from (engine/model_state.h) and the
// inference commands (engine/inference_model.h).
//
// Thread-safety: free functions.
#pragma once

#include <string>

#include "base/status.h"
#include "engine/safetensors.h"
#include "models/model_spec.h"

namespace strata {

// The weights file of `path`: the path itself, or a model directory's
// single model.safetensors (a directory as Hugging Face saves one). Errors
// name `flag` and say what the directory holds instead (a sharded
// checkpoint, a PyTorch .bin, nothing).
Result<std::string> HfWeightsFile(const std::string& path, const std::string& flag);

// Unit `unit` of `spec` from `f`: every parameter of the unit (its tensor
// named prefix + its Hugging Face name, or without the spec's base prefix)
// converted to fp32 at its offset in `master` (the unit's numel; the
// padding is left as it is). NotFound naming the tensor and the file, or
// InvalidArgument naming both shapes.
Status ReadUnitFromHf(const SafetensorsFile& f, const models::ModelSpec& spec, int unit, const std::string& prefix,
                      float* master);

}  // namespace strata
