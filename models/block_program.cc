// SPDX-License-Identifier: Apache-2.0
// The block executor: compiling a BlockSpec (slots, backward placement,
// lowering) and running it.
#include "models/block_program.h"

#include <algorithm>
#include <climits>
#include <map>

namespace strata::models {

using kernels::AttentionShape;
using kernels::Backend;
using kernels::GemmArgs;
using kernels::LayerNormArgs;

namespace {

constexpr size_t kScratchAlign = 256;  // bytes: every scratch slot starts here

const char* OpName(OpKind k) {
  switch (k) {
    case OpKind::kLayerNorm: return "LayerNorm";
    case OpKind::kLinear: return "Linear";
    case OpKind::kAttention: return "Attention";
    case OpKind::kRmsNorm: return "RMSNorm";
    case OpKind::kRope: return "RoPE";
    case OpKind::kSwiGlu: return "SwiGLU";
  }
  return "?";
}

// What Compile knows of each activation.
struct ActInfo {
  int64_t width = 0;        // columns per token
  int producer = -1;        // op index; -1: the block's input x
  std::vector<int> readers;  // ops whose backward reads its forward value
  std::vector<int> consumers;  // ops that take it as `in` or `residual`
  int slot = -1;            // its forward slot; -1: external (x, y)
};

// A scratch slot and the ops whose backward reads it.
struct SlotInfo {
  size_t offset = 0, bytes = 0;
  int lowest_reader = INT_MAX;  // the last op (in backward order) to read it
  int act = -1;                 // the activation it holds, if any
  int grads = 0;                // live gradients stored in it
};

}  // namespace

Result<size_t> BlockProgram::ScratchBytes(const Backend& backend, const BlockSpec& spec, const BlockShape& shape) {
  ASSIGN_OR_RETURN(BlockProgram p, Compile(backend, spec, shape, Options{}, false));
  return p.scratch_bytes_;
}

Result<BlockProgram> BlockProgram::Make(Backend* backend, const BlockSpec& spec, const BlockShape& shape,
                                        const Options& options) {
  if (backend == nullptr) return InvalidArgument("BlockProgram: backend is null");
  const bool fused = options.fused_epilogues && backend->GemmHasBackwardEpilogues();
  ASSIGN_OR_RETURN(BlockProgram p, Compile(*backend, spec, shape, options, fused));
  p.backend_ = backend;
  return p;
}

Status BlockProgram::CompileParts(const BlockSpec& spec, const BlockOp& op, Step* s) {
  std::vector<std::string> weights{op.weight}, biases;
  weights.insert(weights.end(), op.concat.begin(), op.concat.end());
  if (!op.bias.empty()) {
    biases.push_back(op.bias);
    biases.insert(biases.end(), op.concat_bias.begin(), op.concat_bias.end());
  } else if (!op.concat_bias.empty()) {
    return InvalidArgument("concatenated biases without a first bias");
  }
  if (!biases.empty() && biases.size() != weights.size())
    return InvalidArgument(std::to_string(weights.size()) + " weights but " + std::to_string(biases.size()) +
                           " biases (all or none)");
  bool adjacent = true;
  int64_t n0 = 0, w_end = -1, b_end = -1;
  std::vector<Part> parts;
  for (size_t p = 0; p < weights.size(); ++p) {
    const BlockParam* w = spec.Find(weights[p]);
    if (!w || w->shape.size() != 2 || w->shape[1] != s->k)
      return InvalidArgument("weight \"" + weights[p] + "\" is missing or not [n, " + std::to_string(s->k) + "]");
    Part part{w->offset, -1, n0, w->shape[0]};
    if (p > 0 && w->offset != w_end) adjacent = false;
    w_end = w->offset + w->numel;
    if (!biases.empty()) {
      const BlockParam* b = spec.Find(biases[p]);
      if (!b || b->shape != std::vector<int64_t>{part.n})
        return InvalidArgument("bias \"" + biases[p] + "\" is missing or not [" + std::to_string(part.n) + "]");
      part.bias = b->offset;
      if (p > 0 && b->offset != b_end) adjacent = false;
      b_end = b->offset + b->numel;
    }
    parts.push_back(part);
    n0 += part.n;
  }
  if (!adjacent && !biases.empty())
    return InvalidArgument("concatenated weights with biases must lie adjacent in the unit (weights and biases)");
  s->transposed = true;
  s->n = n0;
  if (adjacent) parts = {Part{parts[0].weight, parts[0].bias, 0, n0}};
  s->parts = std::move(parts);
  s->weight = s->parts[0].weight;
  s->bias = s->parts[0].bias;
  return Status::OK();
}

Result<BlockProgram> BlockProgram::Compile(const Backend& backend, const BlockSpec& spec, const BlockShape& shape,
                                           const Options& options, bool fused) {
  const int64_t C = shape.d_model, N = shape.batch * shape.seq;
  if (C < 1 || shape.n_head < 1 || C % shape.n_head != 0 || N < 1 || shape.n_kv_head < 0 ||
      shape.n_head % shape.kv() != 0)
    return InvalidArgument("BlockProgram: d_model " + std::to_string(C) + ", n_head " + std::to_string(shape.n_head) +
                           ", n_kv_head " + std::to_string(shape.n_kv_head) + ", batch x seq " + std::to_string(N) +
                           " is not a block shape");
  const int64_t D = shape.head_dim(), KV = shape.kv(), qkv_width = (shape.n_head + 2 * KV) * D;
  if (!IsFloating(shape.dtype))
    return InvalidArgument("BlockProgram: dtype " + std::string(DTypeName(shape.dtype)) + " is not a float type");
  BlockProgram prog;
  prog.shape_ = shape;
  prog.eps_ = spec.norm_eps;
  prog.rope_ = spec.rope;
  prog.fused_ = fused;
  prog.fused_dgelu_ = fused && options.fused_dgelu;
  const size_t es = DTypeSize(shape.dtype), sb = StatBytes(shape.dtype);

  // Activations and their producers.
  std::map<std::string, int> index{{"x", 0}};
  std::vector<ActInfo> acts(1);
  acts[0].width = C;
  const int n_ops = static_cast<int>(spec.ops.size());
  std::vector<Step>& steps = prog.steps_;
  steps.resize(spec.ops.size());
  auto fail = [&](int i, const std::string& what) {
    const BlockOp& op = spec.ops[static_cast<size_t>(i)];
    return InvalidArgument("block op " + std::to_string(i) + " (" + OpName(op.kind) + " " + op.in + " -> " + op.out +
                           "): " + what);
  };
  auto act = [&](int i, const std::string& name) -> Result<int> {
    auto it = index.find(name);
    if (it == index.end()) return fail(i, "no op before it makes \"" + name + "\"");
    return it->second;
  };
  auto param = [&](int i, const std::string& name, std::vector<int64_t> want) -> Result<int64_t> {
    const BlockParam* p = spec.Find(name);
    if (!p) return fail(i, "the block has no parameter \"" + name + "\"");
    if (p->shape != want) return fail(i, "parameter \"" + name + "\" has the wrong shape");
    return p->offset;
  };
  int output_op = -1;
  for (int i = 0; i < n_ops; ++i) {
    const BlockOp& op = spec.ops[static_cast<size_t>(i)];
    Step& s = steps[static_cast<size_t>(i)];
    s.kind = op.kind;
    s.name = "op " + std::to_string(i) + " (" + OpName(op.kind) + " " + op.in + " -> " + op.out + ")";
    ASSIGN_OR_RETURN(const int in, act(i, op.in));
    acts[static_cast<size_t>(in)].consumers.push_back(i);
    int64_t width = 0;
    switch (op.kind) {
      case OpKind::kLayerNorm: {
        if (acts[static_cast<size_t>(in)].width != C) return fail(i, "a LayerNorm over other than d_model columns");
        ASSIGN_OR_RETURN(s.weight, param(i, op.weight, {C}));
        ASSIGN_OR_RETURN(s.bias, param(i, op.bias, {C}));
        acts[static_cast<size_t>(in)].readers.push_back(i);
        width = C;
        break;
      }
      case OpKind::kLinear: {
        s.k = acts[static_cast<size_t>(in)].width;
        if (op.transposed) {
          RETURN_IF_ERROR(CompileParts(spec, op, &s).WithContext(s.name));
        } else {
          if (!op.concat.empty()) return fail(i, "concatenated weights need the nn.Linear layout (transposed)");
          const BlockParam* w = spec.Find(op.weight);
          if (!w || w->shape.size() != 2 || w->shape[0] != s.k)
            return fail(i, "weight \"" + op.weight + "\" is missing or not [" + std::to_string(s.k) + ", n]");
          s.n = w->shape[1];
          s.weight = w->offset;
          if (!op.bias.empty()) {
            ASSIGN_OR_RETURN(s.bias, param(i, op.bias, {s.n}));
          }
        }
        if (s.parts.size() > 1 && (!op.residual.empty() || op.gelu))
          return fail(i, "a residual or GELU on weights that are not adjacent in the unit (not one GEMM)");
        s.gelu = op.gelu;
        acts[static_cast<size_t>(in)].readers.push_back(i);
        width = s.n;
        if (!op.residual.empty()) {
          ASSIGN_OR_RETURN(const int r, act(i, op.residual));
          if (acts[static_cast<size_t>(r)].width != s.n) return fail(i, "residual \"" + op.residual + "\" has other width");
          acts[static_cast<size_t>(r)].consumers.push_back(i);
          s.residual.kind = Loc::kScratch;  // placed below
        }
        break;
      }
      case OpKind::kAttention:
        if (acts[static_cast<size_t>(in)].width != qkv_width)
          return fail(i, "attention's input is not [N, (n_head + 2 n_kv_head) head_dim]");
        if (acts[static_cast<size_t>(in)].consumers.size() > 1)
          return fail(i, "attention's input \"" + op.in + "\" has another consumer (not supported)");
        acts[static_cast<size_t>(in)].readers.push_back(i);
        width = shape.n_head * D;
        break;
      case OpKind::kRmsNorm: {
        if (acts[static_cast<size_t>(in)].width != C) return fail(i, "an RMSNorm over other than d_model columns");
        ASSIGN_OR_RETURN(s.weight, param(i, op.weight, {C}));
        acts[static_cast<size_t>(in)].readers.push_back(i);
        width = C;
        break;
      }
      case OpKind::kRope:
        if (acts[static_cast<size_t>(in)].width != qkv_width || D % 2 != 0)
          return fail(i, "RoPE's input is not [N, (n_head + 2 n_kv_head) head_dim] of an even head_dim");
        s.rope_heads = static_cast<size_t>(shape.n_head + KV);
        s.n = qkv_width;
        width = qkv_width;
        break;
      case OpKind::kSwiGlu:
        if (acts[static_cast<size_t>(in)].width % 2 != 0) return fail(i, "SwiGLU's input has an odd width");
        acts[static_cast<size_t>(in)].readers.push_back(i);
        width = acts[static_cast<size_t>(in)].width / 2;
        s.k = width;
        break;
    }
    if ((op.kind == OpKind::kRope || op.kind == OpKind::kSwiGlu) && acts[static_cast<size_t>(in)].consumers.size() > 1)
      return fail(i, "its input \"" + op.in + "\" has another consumer (not supported)");
    if (index.count(op.out)) return fail(i, "\"" + op.out + "\" is made twice (or is the input)");
    index[op.out] = static_cast<int>(acts.size());
    ActInfo a;
    a.width = width;
    a.producer = i;
    if (op.kind == OpKind::kAttention) a.readers.push_back(i);  // its backward reads its output
    acts.push_back(a);
    if (op.out == "y") {
      if (width != C) return fail(i, "the block's output is not [N, d_model]");
      output_op = i;
      s.makes_output = true;
    }
  }
  if (output_op < 0) return InvalidArgument("block: no op makes the output \"y\"");
  // The output must reach the input through residuals (the gradient's in-place path).
  for (int i = output_op;;) {
    const BlockOp& op = spec.ops[static_cast<size_t>(i)];
    if (op.residual.empty()) return fail(i, "the block's output does not reach its input \"x\" through residuals");
    if (op.residual == "x") break;
    i = acts[static_cast<size_t>(index.at(op.residual))].producer;
  }

  // Forward slots, in op order: outputs (a GELU op's pre-activation first),
  // statistics; the attention workspace last.
  std::vector<SlotInfo> slots;
  size_t end = 0;
  auto take = [&](size_t bytes, int reader, int act_index) {
    SlotInfo si;
    si.offset = end;
    si.bytes = (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    si.lowest_reader = reader;
    si.act = act_index;
    end += si.bytes;
    slots.push_back(si);
    return slots.size() - 1;
  };
  auto lowest = [&](const ActInfo& a) {
    int r = INT_MAX;
    for (int x : a.readers) r = std::min(r, x);
    return r;
  };
  size_t attention_ws = 0;
  bool have_attention = false;
  for (int i = 0; i < n_ops; ++i) {
    const BlockOp& op = spec.ops[static_cast<size_t>(i)];
    Step& s = steps[static_cast<size_t>(i)];
    const int o = index.at(op.out);
    ActInfo& oa = acts[static_cast<size_t>(o)];
    const size_t out_bytes = static_cast<size_t>(N * oa.width) * es;
    if (op.kind == OpKind::kLinear && op.gelu) s.pre = slots[take(out_bytes, i, -1)].offset;
    if (!s.makes_output) {
      oa.slot = static_cast<int>(take(out_bytes, lowest(oa), o));
      s.out = Loc{Loc::kScratch, slots[static_cast<size_t>(oa.slot)].offset};
    } else {
      s.out = Loc{Loc::kOutput, 0};
    }
    if (op.kind == OpKind::kLayerNorm) {
      s.mean = slots[take(static_cast<size_t>(N) * sb, i, -1)].offset;
      s.rstd = slots[take(static_cast<size_t>(N) * sb, i, -1)].offset;
    }
    if (op.kind == OpKind::kRmsNorm) s.rstd = slots[take(static_cast<size_t>(N) * sb, i, -1)].offset;
    if (op.kind == OpKind::kAttention) {
      s.lse = slots[take(static_cast<size_t>(N * shape.n_head) * sb, i, -1)].offset;
      have_attention = true;
    }
  }
  if (have_attention) {
    const AttentionShape as{shape.batch, shape.seq, shape.n_head, D, shape.dtype, 0.f, shape.n_kv_head};
    int first = INT_MAX;
    for (int i = 0; i < n_ops; ++i)
      if (spec.ops[static_cast<size_t>(i)].kind == OpKind::kAttention) first = std::min(first, i);
    attention_ws = slots[take(backend.AttentionWorkspaceBytes(as), first, -1)].offset;
  }
  prog.attention_ws_ = attention_ws;
  prog.scratch_bytes_ = end;
  auto act_loc = [&](int a) {
    if (a == 0) return Loc{Loc::kInput, 0};
    return Loc{Loc::kScratch, slots[static_cast<size_t>(acts[static_cast<size_t>(a)].slot)].offset};
  };
  for (int i = 0; i < n_ops; ++i) {
    const BlockOp& op = spec.ops[static_cast<size_t>(i)];
    steps[static_cast<size_t>(i)].in = act_loc(index.at(op.in));
    if (!op.residual.empty()) steps[static_cast<size_t>(i)].residual = act_loc(index.at(op.residual));
  }

  // Backward placement, ops in reverse.
  std::vector<Loc> grad(acts.size());
  grad[static_cast<size_t>(index.at("y"))] = Loc{Loc::kGradIn, 0};
  auto slot_of = [&](const Loc& l) -> int {
    if (l.kind != Loc::kScratch) return -1;
    for (size_t k = 0; k < slots.size(); ++k)
      if (slots[k].offset == l.offset) return static_cast<int>(k);
    return -1;
  };
  auto hold = [&](const Loc& l, int delta) {
    if (int k = slot_of(l); k >= 0) slots[static_cast<size_t>(k)].grads += delta;
  };
  // A slot for the gradient of activation `a` written at op i, not one of `busy`.
  auto place = [&](int i, int a, std::vector<Loc> busy) -> Result<Loc> {
    const size_t need = static_cast<size_t>(N * acts[static_cast<size_t>(a)].width) * es;
    auto ok = [&](size_t k) {
      const SlotInfo& si = slots[k];
      if (si.grads > 0 || si.lowest_reader < i || si.bytes < need) return false;
      for (const Loc& b : busy)
        if (b.kind == Loc::kScratch && b.offset == si.offset) return false;
      return true;
    };
    const int own = acts[static_cast<size_t>(a)].slot;
    int pick = own >= 0 && ok(static_cast<size_t>(own)) ? own : -1;
    for (size_t k = 0; pick < 0 && k < slots.size(); ++k)
      if (ok(k)) pick = static_cast<int>(k);
    if (pick < 0) return fail(i, "no dead scratch slot holds the gradient of its input");
    slots[static_cast<size_t>(pick)].grads += 1;
    return Loc{Loc::kScratch, slots[static_cast<size_t>(pick)].offset};
  };
  for (int i = n_ops - 1; i >= 0; --i) {
    const BlockOp& op = spec.ops[static_cast<size_t>(i)];
    Step& s = steps[static_cast<size_t>(i)];
    const int o = index.at(op.out), a = index.at(op.in);
    s.d_out = grad[static_cast<size_t>(o)];
    if (s.d_out.kind == Loc::kNone) return fail(i, "its output \"" + op.out + "\" is never used");
    Loc& ga = grad[static_cast<size_t>(a)];
    switch (op.kind) {
      case OpKind::kLinear: {
        const int p = acts[static_cast<size_t>(a)].producer;
        const bool fuse = prog.fused_dgelu_ && p >= 0 && spec.ops[static_cast<size_t>(p)].gelu &&
                          acts[static_cast<size_t>(a)].consumers.size() == 1 && s.parts.size() <= 1;
        if (ga.kind != Loc::kNone) {
          s.d_in = ga, s.d_in_add = true;
        } else {
          std::vector<Loc> busy{s.d_out};
          if (fuse) busy.push_back(Loc{Loc::kScratch, steps[static_cast<size_t>(p)].pre});
          ASSIGN_OR_RETURN(ga, place(i, a, busy));
          s.d_in = ga;
        }
        if (fuse) {
          Step& ps = steps[static_cast<size_t>(p)];
          s.dgelu_epilogue = true;
          s.dgelu_bias = ps.bias;
          s.dgelu_pre = ps.pre;
          ps.gelu_done_by_consumer = true;
        }
        if (!op.residual.empty()) {
          Loc& gr = grad[static_cast<size_t>(index.at(op.residual))];
          if (gr.kind == Loc::kNone) {
            gr = s.d_out;  // the residual stream: the same buffer
            hold(gr, +1);
          } else {
            s.d_residual_add = true;
            s.d_residual = gr;
          }
        }
        break;
      }
      case OpKind::kLayerNorm:
      case OpKind::kRmsNorm: {
        if (ga.kind != Loc::kNone) {
          s.d_in = ga, s.d_in_add = true;
        } else {
          std::vector<Loc> busy{s.d_out, s.in, Loc{Loc::kScratch, s.rstd}};
          if (op.kind == OpKind::kLayerNorm) busy.push_back(Loc{Loc::kScratch, s.mean});
          ASSIGN_OR_RETURN(ga, place(i, a, busy));
          s.d_in = ga, s.d_in_zero = true;
        }
        break;
      }
      case OpKind::kRope: {  // its input has no other consumer (checked above)
        ASSIGN_OR_RETURN(ga, place(i, a, {s.d_out}));
        s.d_in = ga;
        break;
      }
      case OpKind::kSwiGlu: {
        ASSIGN_OR_RETURN(ga, place(i, a, {s.d_out}));  // in place over its input when that is free
        s.d_in = ga;
        break;
      }
      case OpKind::kAttention: {
        ASSIGN_OR_RETURN(ga, place(i, a, {s.d_out, s.in, s.out, Loc{Loc::kScratch, s.lse},
                                          Loc{Loc::kScratch, attention_ws}}));
        s.d_in = ga;
        break;
      }
    }
    hold(s.d_out, -1);  // consumed: `out`'s gradient is dead after its producer's backward
  }
  return prog;
}

// ---- running -------------------------------------------------------------------

void* BlockProgram::Ptr(const Loc& l, const void* x_in, void* x_out, void* d_in, char* scratch) const {
  switch (l.kind) {
    case Loc::kScratch: return scratch + l.offset;
    case Loc::kInput: return const_cast<void*>(x_in);
    case Loc::kOutput: return x_out;
    case Loc::kGradIn: return d_in;
    case Loc::kNone: break;
  }
  return nullptr;
}

Status BlockProgram::CheckScratch(const char* op, const void* scratch, size_t bytes) const {
  if (bytes < scratch_bytes_)
    return InvalidArgument(std::string(op) + ": scratch of " + std::to_string(bytes) + " bytes, needs " +
                           std::to_string(scratch_bytes_));
  if (scratch_bytes_ > 0 && scratch == nullptr) return InvalidArgument(std::string(op) + ": scratch is null");
  return Status::OK();
}

Status BlockProgram::Run(const Step& s, const char* params, const void* x_in, void* x_out, char* scratch,
                         bool keep_pre) const {
  Backend& be = *backend_;
  const int64_t N = shape_.batch * shape_.seq, C = shape_.d_model;
  const DType dt = shape_.dtype;
  const size_t es = DTypeSize(dt);
  auto W = [&](int64_t off) { return static_cast<const void*>(params + off * static_cast<int64_t>(es)); };
  void* in = Ptr(s.in, x_in, x_out, nullptr, scratch);
  void* out = Ptr(s.out, x_in, x_out, nullptr, scratch);
  switch (s.kind) {
    case OpKind::kLayerNorm:
      return be.LayerNormForward(LayerNormArgs{N, C, dt, eps_}, out, reinterpret_cast<float*>(scratch + s.mean),
                                 reinterpret_cast<float*>(scratch + s.rstd), in, W(s.weight), W(s.bias));
    case OpKind::kAttention: {
      const AttentionShape as{shape_.batch, shape_.seq, shape_.n_head, shape_.head_dim(), dt, 0.f, shape_.n_kv_head};
      return be.AttentionForward(as, out, reinterpret_cast<float*>(scratch + s.lse), in, scratch + attention_ws_);
    }
    case OpKind::kRmsNorm:
      return be.RmsNormForward(kernels::RmsNormArgs{N, C, dt, eps_}, out, reinterpret_cast<float*>(scratch + s.rstd),
                               in, W(s.weight));
    case OpKind::kRope:
      return be.RopeForward(RopeOf(s), out, in);
    case OpKind::kSwiGlu:
      return be.SwiGluForward(out, in, N, s.k, dt);
    case OpKind::kLinear: {
      if (s.transposed) {
        const void* r = s.residual.kind != Loc::kNone ? Ptr(s.residual, x_in, x_out, nullptr, scratch) : nullptr;
        return RunLinear(s, params, in, out, r, scratch, keep_pre);
      }
      GemmArgs g;
      g.ab_dtype = g.c_dtype = dt;
      g.m = N, g.n = s.n, g.k = s.k;
      g.a = in, g.lda = s.k, g.b = W(s.weight), g.ldb = s.n;
      g.c = out, g.ldc = s.n;
      if (s.bias >= 0) g.bias = W(s.bias);
      if (s.residual.kind != Loc::kNone) {
        // out = residual + in @ W + b: the residual read by the GEMM itself,
        // or copied into out first.
        const void* r = Ptr(s.residual, x_in, x_out, nullptr, scratch);
        if (fused_) g.c_in = r;
        else RETURN_IF_ERROR(be.CopyDeviceToDevice(out, r, static_cast<size_t>(N * s.n) * es));
        g.beta = 1.f;
      }
      if (s.gelu) {
        g.gelu = true;
        if (keep_pre) g.gelu_aux = scratch + s.pre;
      }
      return be.Gemm(g);
    }
  }
  return Internal("BlockProgram: unknown op");
}

kernels::RopeArgs BlockProgram::RopeOf(const Step& s) const {
  return kernels::RopeArgs{shape_.batch, shape_.seq, s.n, static_cast<int64_t>(s.rope_heads), shape_.head_dim(),
                           shape_.dtype, rope_};
}

// out[:, n0:n0+n] = in @ W_p^T (+ b_p) per part (+ residual, then GELU: one part).
Status BlockProgram::RunLinear(const Step& s, const char* params, void* in, void* out, const void* residual,
                               char* scratch, bool keep_pre) const {
  Backend& be = *backend_;
  const int64_t N = shape_.batch * shape_.seq;
  const DType dt = shape_.dtype;
  const size_t es = DTypeSize(dt);
  for (const Part& p : s.parts) {
    GemmArgs g;
    g.ab_dtype = g.c_dtype = dt;
    g.trans_b = true;
    g.m = N, g.n = p.n, g.k = s.k;
    g.a = in, g.lda = s.k;
    g.b = params + p.weight * static_cast<int64_t>(es), g.ldb = s.k;
    g.c = static_cast<char*>(out) + p.n0 * static_cast<int64_t>(es), g.ldc = s.n;
    if (p.bias >= 0) g.bias = params + p.bias * static_cast<int64_t>(es);
    if (residual) {
      if (fused_) g.c_in = residual;
      else RETURN_IF_ERROR(be.CopyDeviceToDevice(out, residual, static_cast<size_t>(N * s.n) * es));
      g.beta = 1.f;
    }
    if (s.gelu) {
      g.gelu = true;
      if (keep_pre) g.gelu_aux = scratch + s.pre;
    }
    RETURN_IF_ERROR(be.Gemm(g));
  }
  return Status::OK();
}

// A transposed Linear's backward after the GELU's: per part dW_p (+)= dout_p^T
// @ in [n, k] and the bias gradient; then d_in (+)= sum_p dout_p @ W_p.
Status BlockProgram::LinearBackward(const Step& s, const char* params, void* in, void* dout, void* d_in, char* grads,
                                    DType gd, bool accumulate, char* scratch) const {
  Backend& be = *backend_;
  const int64_t N = shape_.batch * shape_.seq;
  const DType dt = shape_.dtype;
  const int64_t es = static_cast<int64_t>(DTypeSize(dt)), gs = static_cast<int64_t>(DTypeSize(gd));
  for (const Part& p : s.parts) {
    char* dp = static_cast<char*>(dout) + p.n0 * es;
    GemmArgs w;
    w.trans_a = true;
    w.m = p.n, w.n = s.k, w.k = N;
    w.a = dp, w.lda = s.n, w.b = in, w.ldb = s.k;
    w.c = grads + p.weight * gs, w.ldc = s.k;
    w.ab_dtype = dt, w.c_dtype = gd, w.beta = accumulate ? 1.f : 0.f;
    RETURN_IF_ERROR(be.Gemm(w));
    // Biases come only with one part (adjacent), whose columns are all of dout's.
    if (p.bias >= 0 && !(s.gelu && s.gelu_done_by_consumer))
      RETURN_IF_ERROR(be.BiasBackward(grads + p.bias * gs, gd, accumulate, dout, N, s.n, dt));
  }
  if (!d_in) return Status::OK();
  for (size_t i = 0; i < s.parts.size(); ++i) {
    const Part& p = s.parts[i];
    GemmArgs g;
    g.m = N, g.n = s.k, g.k = p.n;
    g.a = static_cast<char*>(dout) + p.n0 * es, g.lda = s.n;
    g.b = params + p.weight * es, g.ldb = s.k;
    g.c = d_in, g.ldc = s.k;
    g.ab_dtype = g.c_dtype = dt;
    if (s.d_in_add || i > 0) g.beta = 1.f;
    if (s.dgelu_epilogue) {
      g.dgelu = true, g.gelu_aux = scratch + s.dgelu_pre;
      g.bias_grad = grads + s.dgelu_bias * gs, g.bias_grad_dtype = gd, g.bias_grad_accumulate = accumulate;
    }
    RETURN_IF_ERROR(be.Gemm(g));
  }
  return Status::OK();
}

Status BlockProgram::Forward(const void* params, const void* x_in, void* x_out, void* scratch, size_t scratch_bytes,
                             Internals internals) const {
  RETURN_IF_ERROR(CheckScratch("BlockForward", scratch, scratch_bytes));
  if (x_out == x_in) return InvalidArgument("BlockForward: x_out must not alias x_in");
  for (const Step& s : steps_)
    RETURN_IF_ERROR(Run(s, static_cast<const char*>(params), x_in, x_out, static_cast<char*>(scratch),
                        internals == Internals::kKept));
  return Status::OK();
}

Status BlockProgram::RunBackward(const Step& s, const char* params, const void* x_in, void* d_in, char* grads,
                                 DType gd, bool accumulate, char* scratch) const {
  Backend& be = *backend_;
  const int64_t N = shape_.batch * shape_.seq, C = shape_.d_model;
  const DType dt = shape_.dtype;
  const size_t es = DTypeSize(dt), gs = DTypeSize(gd);
  auto W = [&](int64_t off) { return static_cast<const void*>(params + off * static_cast<int64_t>(es)); };
  auto G = [&](int64_t off) { return static_cast<void*>(grads + off * static_cast<int64_t>(gs)); };
  auto P = [&](const Loc& l) { return Ptr(l, x_in, nullptr, d_in, scratch); };
  void* dout = P(s.d_out);
  switch (s.kind) {
    case OpKind::kLayerNorm:
      if (s.d_in_zero) RETURN_IF_ERROR(be.Memset(P(s.d_in), 0, static_cast<size_t>(N * C) * es));
      return be.LayerNormBackward(LayerNormArgs{N, C, dt, eps_}, P(s.d_in), G(s.weight), G(s.bias), gd, accumulate,
                                  dout, P(s.in), W(s.weight), reinterpret_cast<const float*>(scratch + s.mean),
                                  reinterpret_cast<const float*>(scratch + s.rstd));
    case OpKind::kAttention: {
      const AttentionShape as{shape_.batch, shape_.seq, shape_.n_head, shape_.head_dim(), dt, 0.f, shape_.n_kv_head};
      return be.AttentionBackward(as, P(s.d_in), dout, P(s.in), P(s.out), reinterpret_cast<const float*>(scratch + s.lse),
                                  scratch + attention_ws_);
    }
    case OpKind::kRmsNorm:
      if (s.d_in_zero) RETURN_IF_ERROR(be.Memset(P(s.d_in), 0, static_cast<size_t>(N * C) * es));
      return be.RmsNormBackward(kernels::RmsNormArgs{N, C, dt, eps_}, P(s.d_in), G(s.weight), gd, accumulate, dout,
                                P(s.in), W(s.weight), reinterpret_cast<const float*>(scratch + s.rstd));
    case OpKind::kRope:
      return be.RopeBackward(RopeOf(s), P(s.d_in), dout);
    case OpKind::kSwiGlu:
      return be.SwiGluBackward(P(s.d_in), dout, P(s.in), N, s.k, dt);
    case OpKind::kLinear: {
      if (s.gelu && !s.gelu_done_by_consumer) {
        // d pre = d h * gelu'(pre), in place; then the bias gradient.
        RETURN_IF_ERROR(be.GeluBackward(dout, scratch + s.pre, dout, N * s.n, dt));
      }
      if (s.transposed) {
        RETURN_IF_ERROR(LinearBackward(s, params, P(s.in), dout, s.d_in.kind != Loc::kNone ? P(s.d_in) : nullptr, grads,
                                       gd, accumulate, scratch));
        if (s.d_residual_add) return be.Add(P(s.d_residual), P(s.d_residual), dout, N * s.n, dt);
        return Status::OK();
      }
      // Weight gradient dW (+)= in^T @ d, [k, n].
      GemmArgs w;
      w.trans_a = true;
      w.m = s.k, w.n = s.n, w.k = N;
      w.a = P(s.in), w.lda = s.k, w.b = dout, w.ldb = s.n;
      w.c = G(s.weight), w.ldc = s.n;
      w.ab_dtype = dt, w.c_dtype = gd, w.beta = accumulate ? 1.f : 0.f;
      RETURN_IF_ERROR(be.Gemm(w));
      if (s.bias >= 0 && !(s.gelu && s.gelu_done_by_consumer))
        RETURN_IF_ERROR(be.BiasBackward(G(s.bias), gd, accumulate, dout, N, s.n, dt));
      if (s.d_in.kind != Loc::kNone) {
        // Input gradient d_in (+)= d @ W^T, [N, k].
        GemmArgs g;
        g.trans_b = true;
        g.m = N, g.n = s.k, g.k = s.n;
        g.a = dout, g.lda = s.n, g.b = W(s.weight), g.ldb = s.n;
        g.c = P(s.d_in), g.ldc = s.k;
        g.ab_dtype = g.c_dtype = dt;
        if (s.d_in_add) g.beta = 1.f;
        if (s.dgelu_epilogue) {
          // ... times gelu'(the producer's pre-activation), and the
          // producer's bias gradient as its column sums.
          g.dgelu = true, g.gelu_aux = scratch + s.dgelu_pre;
          g.bias_grad = G(s.dgelu_bias), g.bias_grad_dtype = gd, g.bias_grad_accumulate = accumulate;
        }
        RETURN_IF_ERROR(be.Gemm(g));
      }
      if (s.d_residual_add) return be.Add(P(s.d_residual), P(s.d_residual), dout, N * s.n, dt);
      return Status::OK();
    }
  }
  return Internal("BlockProgram: unknown op");
}

Status BlockProgram::Backward(const void* params, const void* x_in, const void* d_out, void* d_in, void* grads,
                              DType grad_dtype, bool accumulate, void* scratch, size_t scratch_bytes,
                              Internals internals) const {
  RETURN_IF_ERROR(CheckScratch("BlockBackward", scratch, scratch_bytes));
  if (d_in == x_in) return InvalidArgument("BlockBackward: d_in must not alias x_in");
  if (!IsFloating(grad_dtype))
    return InvalidArgument("BlockBackward: grad_dtype " + std::string(DTypeName(grad_dtype)) + " is not a float type");
  const char* p = static_cast<const char*>(params);
  char* s = static_cast<char*>(scratch);
  if (internals == Internals::kNotKept)
    for (const Step& st : steps_)
      if (!st.makes_output) RETURN_IF_ERROR(Run(st, p, x_in, nullptr, s, /*keep_pre=*/true));
  // The residual stream's gradient flows in d_in from here.
  if (d_in != d_out) {
    const size_t bytes = static_cast<size_t>(shape_.batch * shape_.seq * shape_.d_model) * DTypeSize(shape_.dtype);
    RETURN_IF_ERROR(backend_->CopyDeviceToDevice(d_in, d_out, bytes));
  }
  for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) {
    // The op's name is joined to the message only on failure: no string is
    // built per op on the step's path.
    const Status st = RunBackward(*it, p, x_in, d_in, static_cast<char*>(grads), grad_dtype, accumulate, s);
    if (!st.ok()) return st.WithContext("BlockBackward " + it->name);
  }
  return Status::OK();
}

}  // namespace strata::models
