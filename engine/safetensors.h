// SPDX-License-Identifier: Apache-2.0
// safetensors files (the format PyTorch/transformers load with
// safetensors.torch.load_file): read (memory-mapped, validated) and write
// (streamed, atomically: temp file, fsync, rename, fsync of the directory).
//
// Format: 8-byte little-endian header length N, N bytes of JSON
// {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}, ...,
//  "__metadata__": {"k": "v"}}, then the data; offsets are relative to the
// end of the header.
//
// Thread-safety: a SafetensorsFile is immutable after Open and may be read
// from any thread; a SafetensorsWriter is used by one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/shape.h"
#include "base/status.h"

namespace strata {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t bytes = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`: header length within the file, JSON well
  // formed, known dtypes, shapes matching byte counts, offsets inside the data
  // and not overlapping. Errors name the file and the tensor.
  static Result<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* Find(const std::string& name) const;
  std::span<const uint8_t> Data(const SafetensorsEntry& e) const;

  // The tensor converted to fp32 (from f32/f16/bf16/f64/integers);
  // NotFound naming the tensor and the file when absent.
  Result<std::vector<float>> ReadF32(const std::string& name) const;
  // Same, to fp64.
  Result<std::vector<double>> ReadF64(const std::string& name) const;
  Result<std::vector<int32_t>> ReadI32(const std::string& name) const;
  // The first out.size() elements (at most the tensor's) of a floating
  // tensor (f32/f16/bf16/f64) converted to fp32 into `out`, without a copy
  // of the tensor; an integer tensor is InvalidArgument naming it and the file.
  Status ReadF32Into(const SafetensorsEntry& e, std::span<float> out) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Streams a safetensors file: declare every tensor up front (the header comes
// first), then Append the bytes of each tensor in declaration order, then
// Commit. Nothing is visible at `path` until Commit succeeds; a writer
// destroyed without Commit removes its temp file, leaving any previous file
// at `path` untouched.
class SafetensorsWriter {
 public:
  struct Tensor {
    std::string name;
    DType dtype;
    Shape shape;
  };
  static Result<std::unique_ptr<SafetensorsWriter>> Begin(
      const std::string& path, const std::vector<Tensor>& tensors,
      const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends raw bytes (in declaration order; may split a tensor over calls).
  Status Append(const void* data, size_t bytes);
  // Checks that exactly the declared bytes arrived, fsyncs, renames into
  // place and fsyncs the directory.
  Status Commit();
  // The crc32c (tiers/nvme/checksum.h) and the size of the whole file as
  // written so far: the header and every byte appended (what a checkpoint's
  // manifest records).
  uint32_t crc32c() const { return crc_; }
  uint64_t file_bytes() const { return header_bytes_ + written_; }

 private:
  SafetensorsWriter() = default;
  Status WriteCounted(const void* data, size_t bytes, uint64_t offset);
  std::string path_, tmp_path_;
  int fd_ = -1;
  uint64_t expected_ = 0, written_ = 0, header_bytes_ = 0;
  uint32_t crc_ = 0;
  bool committed_ = false;
};

// One-shot form for tensors already in host memory.
struct HostTensor {
  std::string name;
  DType dtype;
  Shape shape;
  const void* data;
};
Status WriteSafetensors(const std::string& path, const std::vector<HostTensor>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// Writes all of `bytes` to `fd` (retrying EINTR and short writes); errors name
// `path` and the offset reached.
Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path, uint64_t offset);
// fsync of the directory holding `path` (makes a rename durable).
Status SyncParentDir(const std::string& path);

}  // namespace strata
