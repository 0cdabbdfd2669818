// SPDX-License-Identifier: Apache-2.0
#include "models/resident_model.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/convert.h"
#include "models/init.h"
#include "models/passes.h"

namespace strata::models {

using kernels::Backend;
using kernels::DeviceBuffer;

namespace {

std::string Str(int64_t v) { return std::to_string(v); }

// Host conversions (exact through double; RNE to the narrow types).
template <class F>
void VisitHost(DType t, F&& f) {
  switch (t) {
    case DType::kF32: f(float{}); break;
    case DType::kF16: f(f16_t{}); break;
    case DType::kBF16: f(bf16_t{}); break;
    case DType::kF64: f(double{}); break;
    default: break;
  }
}
void HostToDouble(const void* src, DType t, double* dst, int64_t n) {
  VisitHost(t, [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::cpu::Load1<double>(s[i]);
  });
}
void DoubleToHost(const double* src, DType t, void* dst, int64_t n) {
  VisitHost(t, [&](auto tag) {
    using T = decltype(tag);
    T* d = static_cast<T*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = kernels::cpu::Store1<T>(src[i]);
  });
}

}  // namespace

// The passes' environment of a resident model: every tensor a buffer of its
// own; gradients written in place in their dtype.
class ResidentModel::Env final : public PassEnv {
 public:
  Env(ResidentModel* m, bool accumulate, float dloss) : m_(m), accumulate_(accumulate), dloss_(dloss) {}

  Result<void*> Acquire(const PassTensor& t, Access) override {
    if (t.role == PassTensor::kParams) return m_->params_[static_cast<size_t>(t.unit)].data();
    return m_->acts_[static_cast<size_t>(t.layer)].data();
  }
  Status Release(const PassTensor&, bool) override { return Status::OK(); }
  Result<GradTarget> BeginGrads(int unit, const MicroBatches&) override {
    return GradTarget{m_->grads_[static_cast<size_t>(unit)].data(), m_->options_.grad_dtype, accumulate_};
  }
  Status EndGrads(int, const MicroBatches&, const GradTarget&) override { return Status::OK(); }
  const int32_t* tokens(int64_t) override { return m_->tokens_.as<int32_t>(); }
  const int32_t* targets(int64_t) override { return m_->targets_.as<int32_t>(); }
  float* losses(int64_t) override { return m_->losses_.as<float>(); }
  void* residual_grad(int64_t) override { return m_->dx_.data(); }
  float dloss() const override { return dloss_; }
  ScratchSpace block_scratch() override { return {m_->scratch_.data(), m_->scratch_.bytes()}; }
  ScratchSpace head_scratch() override {
    const DeviceBuffer& hs = m_->options_.keep_last_block ? m_->head_scratch_ : m_->scratch_;
    return {hs.data(), hs.bytes()};
  }
  bool keep_last_block() const override { return m_->options_.keep_last_block; }
  int64_t head_chunk_rows() const override { return m_->options_.head_chunk_rows; }

 private:
  ResidentModel* m_;
  bool accumulate_;
  float dloss_;
};

ResidentModel::ResidentModel(Backend* backend, const Options& options, ModelProgram program)
    : backend_(backend), options_(options), program_(std::move(program)) {}

ResidentModel::~ResidentModel() = default;

Result<std::unique_ptr<ResidentModel>> ResidentModel::Create(Backend* backend, const ModelSpec& spec,
                                                             const Options& options) {
  const int64_t seq = options.seq > 0 ? options.seq : spec.max_seq;
  ModelProgram::Options po;
  po.fused_epilogues = options.fused_epilogues;
  po.fused_dgelu = options.fused_dgelu;
  ASSIGN_OR_RETURN(ModelProgram program, ModelProgram::Make(backend, spec, options.batch, seq, options.dtype, po));
  if (!IsFloating(options.grad_dtype))
    return InvalidArgument("ResidentModel: grad_dtype " + std::string(DTypeName(options.grad_dtype)) +
                           " is not a float type");
  Options o = options;
  o.seq = seq;
  std::unique_ptr<ResidentModel> m(new ResidentModel(backend, o, std::move(program)));
  const int64_t C = spec.d_model, N = o.batch * seq;
  const size_t es = DTypeSize(o.dtype), gs = DTypeSize(o.grad_dtype);
  auto alloc = [&](size_t bytes, DeviceBuffer* out) -> Status {
    ASSIGN_OR_RETURN(*out, backend->Allocate(bytes));
    return backend->Memset(out->data(), 0, bytes);
  };
  m->params_.resize(spec.units.size());
  m->grads_.resize(spec.units.size());
  for (size_t u = 0; u < spec.units.size(); ++u) {
    RETURN_IF_ERROR(alloc(static_cast<size_t>(spec.units[u].numel) * es, &m->params_[u]));
    RETURN_IF_ERROR(alloc(static_cast<size_t>(spec.units[u].numel) * gs, &m->grads_[u]));
  }
  m->acts_.resize(static_cast<size_t>(spec.n_layer + 1));
  for (auto& a : m->acts_) RETURN_IF_ERROR(alloc(static_cast<size_t>(N * C) * es, &a));
  RETURN_IF_ERROR(alloc(static_cast<size_t>(N * C) * es, &m->dx_));
  const size_t block_scratch = m->program_.block_scratch_bytes();
  const size_t head_scratch = m->program_.head_scratch_bytes(o.head_chunk_rows);
  if (o.keep_last_block) {
    RETURN_IF_ERROR(alloc(block_scratch, &m->scratch_));
    RETURN_IF_ERROR(alloc(head_scratch, &m->head_scratch_));
  } else {
    RETURN_IF_ERROR(alloc(std::max(block_scratch, head_scratch), &m->scratch_));
  }
  RETURN_IF_ERROR(alloc(static_cast<size_t>(N) * 4, &m->tokens_));
  RETURN_IF_ERROR(alloc(static_cast<size_t>(N) * 4, &m->targets_));
  RETURN_IF_ERROR(alloc(static_cast<size_t>(N) * StatBytes(o.dtype), &m->losses_));
  return m;
}

std::vector<DeviceBuffer*> ResidentModel::ParameterBuffers() {
  std::vector<DeviceBuffer*> v;
  for (auto& b : params_) v.push_back(&b);
  return v;
}

std::vector<DeviceBuffer*> ResidentModel::GradientBuffers() {
  std::vector<DeviceBuffer*> v;
  for (auto& b : grads_) v.push_back(&b);
  return v;
}

Status ResidentModel::InitRandom(uint64_t seed) {
  const ModelSpec& s = spec();
  const size_t es = DTypeSize(options_.dtype);
  for (int u = 0; u < s.num_units(); ++u) {
    ASSIGN_OR_RETURN(std::vector<float> master, InitUnit(s, u, seed));
    std::vector<double> wide(master.begin(), master.end());
    std::vector<uint8_t> bytes(master.size() * es);
    DoubleToHost(wide.data(), options_.dtype, bytes.data(), static_cast<int64_t>(wide.size()));
    RETURN_IF_ERROR(backend_->CopyToDevice(params_[static_cast<size_t>(u)].data(), bytes.data(), bytes.size()));
  }
  return Status::OK();
}

Status ResidentModel::SetParameter(const std::string& hf_name, const void* data, DType dtype, int64_t numel) {
  ASSIGN_OR_RETURN(const ParamSpec* t, spec().Find(hf_name));
  if (numel != t->numel)
    return InvalidArgument("SetParameter " + hf_name + ": " + Str(numel) + " elements given, the tensor has " +
                           Str(t->numel));
  if (!IsFloating(dtype))
    return InvalidArgument("SetParameter " + hf_name + ": dtype " + std::string(DTypeName(dtype)) +
                           " is not a float type");
  if (numel > 0 && data == nullptr) return InvalidArgument("SetParameter " + hf_name + ": data is null");
  std::vector<double> v(static_cast<size_t>(numel));
  HostToDouble(data, dtype, v.data(), numel);
  const size_t es = DTypeSize(options_.dtype);
  std::vector<uint8_t> bytes(static_cast<size_t>(numel) * es);
  DoubleToHost(v.data(), options_.dtype, bytes.data(), numel);
  char* dst = static_cast<char*>(params_[static_cast<size_t>(t->unit)].data()) + t->offset * static_cast<int64_t>(es);
  return backend_->CopyToDevice(dst, bytes.data(), bytes.size());
}

Result<std::vector<double>> ResidentModel::Read(const ParamSpec& t, bool grads) const {
  const DType dt = grads ? options_.grad_dtype : options_.dtype;
  const size_t es = DTypeSize(dt);
  std::vector<uint8_t> bytes(static_cast<size_t>(t.numel) * es);
  RETURN_IF_ERROR(backend_->Synchronize());
  const DeviceBuffer& b = grads ? grads_[static_cast<size_t>(t.unit)] : params_[static_cast<size_t>(t.unit)];
  const char* src = static_cast<const char*>(b.data()) + t.offset * static_cast<int64_t>(es);
  RETURN_IF_ERROR(backend_->CopyToHost(bytes.data(), src, bytes.size()));
  std::vector<double> v(static_cast<size_t>(t.numel));
  HostToDouble(bytes.data(), dt, v.data(), t.numel);
  return v;
}

Result<std::vector<double>> ResidentModel::GetParameter(const std::string& hf_name) const {
  ASSIGN_OR_RETURN(const ParamSpec* t, spec().Find(hf_name));
  return Read(*t, false);
}

Result<std::vector<double>> ResidentModel::GetGradient(const std::string& hf_name) const {
  ASSIGN_OR_RETURN(const ParamSpec* t, spec().Find(hf_name));
  return Read(*t, true);
}

Result<std::vector<ResidentModel::HostTensor>> ResidentModel::Export(DType dtype, bool gradients) const {
  if (!IsFloating(dtype))
    return InvalidArgument("Export: dtype " + std::string(DTypeName(dtype)) + " is not a float type");
  std::vector<HostTensor> out;
  for (const ParamSpec& t : spec().params) {
    ASSIGN_OR_RETURN(std::vector<double> v, Read(t, gradients));
    HostTensor h{t, dtype, std::vector<uint8_t>(static_cast<size_t>(t.numel) * DTypeSize(dtype))};
    DoubleToHost(v.data(), dtype, h.bytes.data(), t.numel);
    out.push_back(std::move(h));
  }
  return out;
}

Status ResidentModel::UploadTokens(const int32_t* tokens, const int32_t* targets, int64_t* valid) {
  const int64_t N = options_.batch * options_.seq, V = spec().vocab_size;
  if (tokens == nullptr || targets == nullptr) return InvalidArgument("ResidentModel: tokens and targets must not be null");
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V)
      return InvalidArgument("ResidentModel: tokens[" + Str(i) + "] = " + Str(tokens[i]) +
                             " is outside [0, vocab_size = " + Str(V) + ")");
    if (targets[i] >= V)
      return InvalidArgument("ResidentModel: targets[" + Str(i) + "] = " + Str(targets[i]) +
                             " is not below vocab_size = " + Str(V) + " (negative = ignored)");
    count += targets[i] >= 0;
  }
  *valid = count;
  RETURN_IF_ERROR(backend_->CopyToDevice(tokens_.data(), tokens, static_cast<size_t>(N) * 4));
  return backend_->CopyToDevice(targets_.data(), targets, static_cast<size_t>(N) * 4);
}

// Mean of the per-token losses (f32, or f64 for f64 models) over `valid` targets.
Result<double> ResidentModel::MeanLoss(int64_t valid) const {
  RETURN_IF_ERROR(backend_->Synchronize());
  const int64_t n = options_.batch * options_.seq;
  double sum = 0;
  if (options_.dtype == DType::kF64) {
    std::vector<double> v(static_cast<size_t>(n));
    RETURN_IF_ERROR(backend_->CopyToHost(v.data(), losses_.data(), v.size() * 8));
    for (double x : v) sum += x;
  } else {
    std::vector<float> v(static_cast<size_t>(n));
    RETURN_IF_ERROR(backend_->CopyToHost(v.data(), losses_.data(), v.size() * 4));
    for (float x : v) sum += x;
  }
  return valid > 0 ? sum / static_cast<double>(valid) : 0.0;
}

Result<double> ResidentModel::ForwardBackward(const int32_t* tokens, const int32_t* targets, bool accumulate) {
  int64_t valid = 0;
  RETURN_IF_ERROR(UploadTokens(tokens, targets, &valid));
  Env env(this, accumulate, valid > 0 ? static_cast<float>(1.0 / static_cast<double>(valid)) : 0.f);
  const MicroBatches one;
  RETURN_IF_ERROR(models::Forward(program_, env, one));
  RETURN_IF_ERROR(models::Backward(program_, env, one));
  return MeanLoss(valid);
}

Result<double> ResidentModel::Evaluate(const int32_t* tokens, const int32_t* targets) {
  int64_t valid = 0;
  RETURN_IF_ERROR(UploadTokens(tokens, targets, &valid));
  Env env(this, false, 1.f);
  RETURN_IF_ERROR(models::Evaluate(program_, env, MicroBatches{}));
  return MeanLoss(valid);
}

}  // namespace strata::models
