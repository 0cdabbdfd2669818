// SPDX-License-Identifier: Apache-2.0
#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "base/half.h"
#include "tiers/nvme/checksum.h"

namespace strata {

namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // as the reference implementation

Status Bad(const std::string& path, const std::string& what) {
  return DataLoss("not a valid safetensors file: " + what, path);
}

template <typename Out>
Result<std::vector<Out>> Convert(const SafetensorsFile& f, const std::string& name) {
  const SafetensorsEntry* e = f.Find(name);
  if (!e) return NotFound("tensor '" + name + "' is not in " + f.path());
  auto data = f.Data(*e);
  size_t n = static_cast<size_t>(e->shape.numel());
  std::vector<Out> out(n);
  const uint8_t* p = data.data();
  auto load = [&](auto tag) {
    using T = decltype(tag);
    for (size_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, p + i * sizeof(T), sizeof(T));
      out[i] = static_cast<Out>(v);
    }
  };
  switch (e->dtype) {
    case DType::kF32: load(float{}); break;
    case DType::kF64: load(double{}); break;
    case DType::kI64: load(int64_t{}); break;
    case DType::kI32: load(int32_t{}); break;
    case DType::kI16: load(int16_t{}); break;
    case DType::kU16: load(uint16_t{}); break;
    case DType::kI8: load(int8_t{}); break;
    case DType::kU8: load(uint8_t{}); break;
    case DType::kF16:
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = static_cast<Out>(e->dtype == DType::kF16 ? HalfToFloat(h) : BF16ToFloat(h));
      }
      break;
  }
  return out;
}

}  // namespace

namespace {

// One tensor's header entry, checked against the data section of
// `data_bytes` bytes that starts `header_end` bytes into the file.
Result<SafetensorsEntry> ParseEntry(const std::string& path, const std::string& name, const nlohmann::json& v,
                                    uint64_t data_bytes, uint64_t header_end) {
  try {
    SafetensorsEntry e;
    e.name = name;
    auto dt = ParseSafetensorsDType(v.at("dtype").get<std::string>());
    if (!dt) return Bad(path, "tensor '" + name + "' has unsupported dtype " + v.at("dtype").dump());
    e.dtype = *dt;
    std::vector<int64_t> dims = v.at("shape").get<std::vector<int64_t>>();
    auto shape = Shape::Make(dims);
    if (!shape.ok()) return Bad(path, "tensor '" + name + "': " + std::string(shape.status().message()));
    e.shape = *shape;
    auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
    if (off.size() != 2 || off[1] < off[0])
      return Bad(path, "tensor '" + name + "' has bad data_offsets " + v.at("data_offsets").dump());
    if (off[1] > data_bytes)
      return DataLoss("safetensors file is truncated: tensor '" + name + "' ends at data offset " +
                          std::to_string(off[1]) + " but the data section has " + std::to_string(data_bytes) +
                          " bytes",
                      path, header_end + off[1]);
    e.offset = off[0];
    e.bytes = off[1] - off[0];
    const uint64_t want = static_cast<uint64_t>(e.shape.numel()) * DTypeSize(e.dtype);
    if (want != e.bytes)
      return Bad(path, "tensor '" + name + "' is " + std::to_string(e.bytes) + " bytes but its shape " +
                           e.shape.ToString() + " and dtype " + std::string(DTypeName(e.dtype)) + " need " +
                           std::to_string(want));
    return e;
  } catch (const nlohmann::json::exception& ex) {
    return Bad(path, "tensor '" + name + "': " + ex.what());
  }
}

// The whole file mapped read-only; *size its bytes (at least the 8-byte header length).
Result<void*> MapFile(const std::string& path, uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open safetensors file", path);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    Status s = ErrnoStatus("cannot stat safetensors file", path);
    ::close(fd);
    return s;
  }
  *size = static_cast<uint64_t>(st.st_size);
  if (*size < 8) {
    ::close(fd);
    return Bad(path, "file is " + std::to_string(*size) + " bytes, shorter than the 8-byte header length");
  }
  void* map = mmap(nullptr, *size, PROT_READ, MAP_PRIVATE, fd, 0);
  Status map_err = map == MAP_FAILED ? ErrnoStatus("cannot mmap safetensors file", path) : Status::OK();
  ::close(fd);
  RETURN_IF_ERROR(map_err);
  return map;
}

}  // namespace

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  uint64_t size = 0;
  ASSIGN_OR_RETURN(void* map, MapFile(path, &size));
  SafetensorsFile f;
  f.path_ = path;
  f.map_ = map;
  f.map_bytes_ = size;
  const uint8_t* base = static_cast<const uint8_t*>(map);
  uint64_t n = 0;
  std::memcpy(&n, base, 8);  // little-endian host (x86-64)
  if (n > kMaxHeader || n > size - 8)
    return Bad(path, "header length " + std::to_string(n) + " exceeds the file (" + std::to_string(size) + " bytes)");
  f.data_ = base + 8 + n;
  const uint64_t data_bytes = size - 8 - n;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(base + 8, base + 8 + n);
  } catch (const std::exception& e) {
    return Bad(path, std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) return Bad(path, "header is not a JSON object");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Bad(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return Bad(path, "__metadata__." + m.key() + " is not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    ASSIGN_OR_RETURN(SafetensorsEntry e, ParseEntry(path, name, v, data_bytes, 8 + n));
    ranges.emplace_back(e.offset, e.offset + e.bytes);
    f.index_[name] = f.entries_.size();
    f.entries_.push_back(std::move(e));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second && ranges[i].first != ranges[i].second)
      return Bad(path, "tensor data ranges overlap at data offset " + std::to_string(ranges[i].first));
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (map_) munmap(map_, map_bytes_);
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    data_ = o.data_;
    entries_ = std::move(o.entries_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
    o.map_ = nullptr;
    o.map_bytes_ = 0;
    o.data_ = nullptr;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, map_bytes_);
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::span<const uint8_t> SafetensorsFile::Data(const SafetensorsEntry& e) const {
  return {data_ + e.offset, static_cast<size_t>(e.bytes)};
}

Result<std::vector<float>> SafetensorsFile::ReadF32(const std::string& name) const {
  return Convert<float>(*this, name);
}
Result<std::vector<double>> SafetensorsFile::ReadF64(const std::string& name) const {
  return Convert<double>(*this, name);
}
Status SafetensorsFile::ReadF32Into(const SafetensorsEntry& e, std::span<float> out) const {
  if (out.size() > static_cast<size_t>(e.shape.numel()))
    return InvalidArgument("tensor '" + e.name + "' in " + path_ + " has " + std::to_string(e.shape.numel()) +
                           " elements, " + std::to_string(out.size()) + " were asked for");
  const uint8_t* p = data_ + e.offset;
  auto halves = [&](float (*to_float)(uint16_t)) {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = to_float(h);
    }
  };
  switch (e.dtype) {
    case DType::kF32: std::memcpy(out.data(), p, out.size() * 4); break;
    case DType::kBF16: halves(BF16ToFloat); break;
    case DType::kF16: halves(HalfToFloat); break;
    case DType::kF64:
      for (size_t i = 0; i < out.size(); ++i) {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      break;
    default:
      return InvalidArgument("tensor '" + e.name + "' in " + path_ + " is " + std::string(DTypeName(e.dtype)) +
                             ", not a floating-point tensor (bf16, fp16, fp32 or fp64)");
  }
  return Status::OK();
}

Result<std::vector<int32_t>> SafetensorsFile::ReadI32(const std::string& name) const {
  const SafetensorsEntry* e = Find(name);
  if (e && IsFloating(e->dtype))
    return InvalidArgument("tensor '" + name + "' in " + path_ + " is " +
                           std::string(DTypeName(e->dtype)) + ", not an integer tensor");
  return Convert<int32_t>(*this, name);
}

// ---- writer -----------------------------------------------------------------

Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t w = ::write(fd, p, bytes);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("write failed", path, offset);
    }
    if (w == 0) return IoError("write made no progress", EIO, path, offset);
    p += w;
    bytes -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return Status::OK();
}

Status SyncParentDir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open directory to fsync", dir);
  Status s = ::fsync(fd) == 0 ? Status::OK() : ErrnoStatus("fsync of directory failed", dir);
  ::close(fd);
  return s;
}

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Begin(
    const std::string& path, const std::vector<Tensor>& tensors,
    const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  std::map<std::string, int> seen;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      return InvalidArgument("bad tensor name '" + t.name + "' for " + path);
    if (seen[t.name]++) return InvalidArgument("tensor '" + t.name + "' declared twice for " + path);
    uint64_t bytes = static_cast<uint64_t>(t.shape.numel()) * DTypeSize(t.dtype);
    std::vector<int64_t> dims(t.shape.dims().begin(), t.shape.dims().end());
    header[t.name] = {{"dtype", std::string(SafetensorsDTypeName(t.dtype))},
                      {"shape", dims},
                      {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h.push_back(' ');

  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->tmp_path_ = path + ".tmp." + std::to_string(::getpid());
  w->fd_ = ::open(w->tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return ErrnoStatus("cannot create", w->tmp_path_);
  uint64_t n = h.size();
  RETURN_IF_ERROR(w->WriteCounted(&n, 8, 0));
  RETURN_IF_ERROR(w->WriteCounted(h.data(), h.size(), 8));
  w->header_bytes_ = 8 + h.size();
  w->expected_ = off;
  return w;
}

Status SafetensorsWriter::WriteCounted(const void* data, size_t bytes, uint64_t offset) {
  RETURN_IF_ERROR(WriteAll(fd_, data, bytes, tmp_path_, offset));
  crc_ = Crc32cExtend(crc_, data, bytes);
  return Status::OK();
}

Status SafetensorsWriter::Append(const void* data, size_t bytes) {
  if (fd_ < 0 || committed_) return FailedPrecondition("safetensors writer for " + path_ + " is closed");
  if (written_ + bytes > expected_)
    return InvalidArgument("safetensors writer for " + path_ + ": " + std::to_string(written_ + bytes) +
                           " bytes appended but the declared tensors hold " + std::to_string(expected_));
  RETURN_IF_ERROR(WriteCounted(data, bytes, header_bytes_ + written_));
  written_ += bytes;
  return Status::OK();
}

Status SafetensorsWriter::Commit() {
  if (fd_ < 0 || committed_) return FailedPrecondition("safetensors writer for " + path_ + " is closed");
  if (written_ != expected_)
    return FailedPrecondition("safetensors writer for " + path_ + ": " + std::to_string(written_) +
                              " of " + std::to_string(expected_) + " data bytes appended");
  if (::fsync(fd_) != 0) return ErrnoStatus("fsync failed", tmp_path_);
  if (::close(fd_) != 0) {
    fd_ = -1;
    return ErrnoStatus("close failed", tmp_path_);
  }
  fd_ = -1;
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) return ErrnoStatus("rename into place failed", path_);
  committed_ = true;
  return SyncParentDir(path_);
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_path_.empty()) ::unlink(tmp_path_.c_str());
}

Status WriteSafetensors(const std::string& path, const std::vector<HostTensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Tensor> decl;
  decl.reserve(tensors.size());
  for (const auto& t : tensors) decl.push_back({t.name, t.dtype, t.shape});
  ASSIGN_OR_RETURN(auto w, SafetensorsWriter::Begin(path, decl, metadata));
  for (const auto& t : tensors)
    RETURN_IF_ERROR(w->Append(t.data, static_cast<size_t>(t.shape.numel()) * DTypeSize(t.dtype)));
  return w->Commit();
}

}  // namespace strata
