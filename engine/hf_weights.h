// SPDX-License-Identifier: Apache-2.0
// A Hugging Face model's weights as save_pretrained writes them, read one
// safetensors file at a time:
//
//   FILE                       a safetensors file
//   DIR/model.safetensors      a model directory, unsharded (preferred, as
//                              transformers prefers it, when both are there)
//   DIR/model.safetensors.index.json + DIR/model-0000N-of-0000M.safetensors
//                              a sharded one: the index's "weight_map" names
//                              each tensor's file
//
// Open reads every file's header (each file mapped while its header is read,
// then unmapped) and checks the index against the files: a file it names
// that is missing, a tensor it places in a file that lacks it, or a tensor
// of a file that it does not list is an error naming the index, the file and
// the tensor (a tensor also in a file other than the index's is read from
// the index's); a truncated file is one naming the file
// and the tensor (SafetensorsFile::Open). Reading maps the one file holding
// the tensor, unmapping the file read before: at most one file of the model
// is mapped at a time, so a loader that reads tensor by tensor holds no more
// than one shard's pages (file-backed, clean, reclaimable) beside its own
// buffers.
//
// Thread-safety: one thread (the mapped file is state).
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/safetensors.h"

namespace strata {

struct HfTensor {
  std::string file;        // the path of the safetensors file holding it
  SafetensorsEntry entry;  // its name, dtype, shape and place in that file
};

class HfWeights {
 public:
  // `path`: a safetensors file or a model directory (above).
  static Result<HfWeights> Open(const std::string& path);

  // The file or directory opened, and the index ("" unsharded).
  const std::string& path() const { return path_; }
  const std::string& index_path() const { return index_; }
  // The safetensors files, in order.
  const std::vector<std::string>& files() const { return files_; }
  // Every tensor, by name.
  const std::map<std::string, HfTensor>& tensors() const { return tensors_; }
  const HfTensor* Find(const std::string& name) const;

  // The first out.size() elements of `t` as fp32 (SafetensorsFile::ReadF32Into),
  // mapping its file if it is not the one mapped.
  Status ReadF32Into(const HfTensor& t, std::span<float> out);

 private:
  HfWeights() = default;
  Status AddFile(const std::string& file, const std::map<std::string, std::string>* weight_map);
  std::string path_, index_;
  std::vector<std::string> files_;
  std::map<std::string, HfTensor> tensors_;
  std::optional<SafetensorsFile> mapped_;  // the file mapped now, if any
};

// The weights file or index of a model directory `dir` as transformers looks
// for them (model.safetensors, else model.safetensors.index.json); NotFound or
// InvalidArgument saying what the directory holds instead.
Result<std::string> HfWeightsEntry(const std::string& dir);

}  // namespace strata
