// SPDX-License-Identifier: Apache-2.0
#include "models/passes.h"

namespace strata::models {

namespace {

using P = PassTensor;

// Runs `f` (a kernel call) unless the env only records accesses.
template <class F>
Status Compute(PassEnv& env, F&& f) {
  return env.computes() ? f() : Status::OK();
}

// Whether block `l`'s internals stay in the scratch from its forward to its backward.
Internals KeptInternals(const ModelProgram& m, PassEnv& env, const MicroBatches& mb, int64_t l) {
  return l == m.spec().n_layer - 1 && mb.one() && env.keep_last_block() ? Internals::kKept : Internals::kNotKept;
}

enum class Mode { kTrain, kEval };

Status ForwardPass(const ModelProgram& m, PassEnv& env, const MicroBatches& mb, Mode mode) {
  const int64_t L = m.spec().n_layer;
  ASSIGN_OR_RETURN(void* e, env.Acquire(P::Params(0), Access::kRead));
  for (int64_t a = mb.first; a < mb.end; ++a) {
    ASSIGN_OR_RETURN(void* x, env.Acquire(P::Checkpoint(0, a), Access::kWriteDiscard));
    RETURN_IF_ERROR(Compute(env, [&] { return m.embedding().Forward(e, env.tokens(a), x); }));
    RETURN_IF_ERROR(env.Release(P::Checkpoint(0, a), true));
  }
  RETURN_IF_ERROR(env.Release(P::Params(0), false));
  const ScratchSpace s = env.block_scratch();
  for (int64_t l = 0; l < L; ++l) {
    const int u = ModelSpec::block_unit(l);
    const Internals kept = mode == Mode::kTrain ? KeptInternals(m, env, mb, l) : Internals::kNotKept;
    ASSIGN_OR_RETURN(void* p, env.Acquire(P::Params(u), Access::kRead));
    for (int64_t a = mb.first; a < mb.end; ++a) {
      const P in = P::Checkpoint(static_cast<int>(l), a), out = P::Checkpoint(static_cast<int>(l + 1), a);
      ASSIGN_OR_RETURN(void* xi, env.Acquire(in, Access::kRead));
      ASSIGN_OR_RETURN(void* xo, env.Acquire(out, Access::kWriteDiscard));
      RETURN_IF_ERROR(Compute(env, [&] { return m.block().Forward(p, xi, xo, s.data, s.bytes, kept); }));
      RETURN_IF_ERROR(env.Release(in, false));
      RETURN_IF_ERROR(env.Release(out, true));
    }
    RETURN_IF_ERROR(env.Release(P::Params(u), false));
  }
  return Status::OK();
}

// What the head reads for micro-batch a, in training and in evaluation: the
// final unit's and the embedding's parameters, x_L, the targets, where the
// losses go, and its scratch.
HeadArgs HeadInputs(PassEnv& env, void* embedding, void* final_params, void* x, int64_t a, const ScratchSpace& s) {
  HeadArgs h;
  h.final_params = final_params;
  h.embedding_params = embedding;
  h.x = x;
  h.targets = env.targets(a);
  h.losses = env.losses(a);
  h.chunk_rows = env.head_chunk_rows();
  h.scratch = s.data;
  h.scratch_bytes = s.bytes;
  return h;
}

// The head's forward and backward. The embedding's gradient target stays
// open (the embedding's own backward adds to it last): returned in *ge.
Status HeadPass(const ModelProgram& m, PassEnv& env, const MicroBatches& mb, GradTarget* ge) {
  const int L = static_cast<int>(m.spec().n_layer), fin = m.spec().final_unit();
  ASSIGN_OR_RETURN(void* e, env.Acquire(P::Params(0), Access::kRead));
  ASSIGN_OR_RETURN(void* f, env.Acquire(P::Params(fin), Access::kRead));
  ASSIGN_OR_RETURN(*ge, env.BeginGrads(0, mb));
  ASSIGN_OR_RETURN(GradTarget gf, env.BeginGrads(fin, mb));
  const ScratchSpace s = env.head_scratch();
  for (int64_t a = mb.first; a < mb.end; ++a) {
    ASSIGN_OR_RETURN(void* x, env.Acquire(P::Checkpoint(L, a), Access::kRead));
    HeadArgs h = HeadInputs(env, e, f, x, a, s);
    h.dloss = env.dloss();
    h.dx = env.residual_grad(a);
    h.final_grads = gf.data;
    h.embedding_grads = ge->data;
    h.grad_dtype = gf.dtype;
    h.accumulate = a > mb.first || gf.accumulate;
    RETURN_IF_ERROR(Compute(env, [&] { return m.head().ForwardBackward(h); }));
    RETURN_IF_ERROR(env.Release(P::Checkpoint(L, a), false));
  }
  RETURN_IF_ERROR(env.Release(P::Params(fin), false));
  RETURN_IF_ERROR(env.Release(P::Params(0), false));
  RETURN_IF_ERROR(env.EndGrads(fin, mb, gf));
  return env.GradsDone(fin, mb);
}

}  // namespace

Status Forward(const ModelProgram& model, PassEnv& env, const MicroBatches& mb) {
  return ForwardPass(model, env, mb, Mode::kTrain);
}

Status Backward(const ModelProgram& m, PassEnv& env, const MicroBatches& mb) {
  GradTarget ge;
  RETURN_IF_ERROR(HeadPass(m, env, mb, &ge));
  const ScratchSpace s = env.block_scratch();
  for (int64_t l = m.spec().n_layer - 1; l >= 0; --l) {
    const int u = ModelSpec::block_unit(l);
    const Internals kept = KeptInternals(m, env, mb, l);
    ASSIGN_OR_RETURN(void* p, env.Acquire(P::Params(u), Access::kRead));
    ASSIGN_OR_RETURN(GradTarget g, env.BeginGrads(u, mb));
    for (int64_t a = mb.first; a < mb.end; ++a) {
      const P in = P::Checkpoint(static_cast<int>(l), a);
      ASSIGN_OR_RETURN(void* xi, env.Acquire(in, Access::kRead));
      void* d = env.residual_grad(a);
      const bool acc = a > mb.first || g.accumulate;
      RETURN_IF_ERROR(Compute(env, [&] {
        return m.block().Backward(p, xi, d, d, g.data, g.dtype, acc, s.data, s.bytes, kept);
      }));
      RETURN_IF_ERROR(env.Release(in, false));
    }
    RETURN_IF_ERROR(env.EndGrads(u, mb, g));
    RETURN_IF_ERROR(env.Release(P::Params(u), false));
    RETURN_IF_ERROR(env.GradsDone(u, mb));
  }
  // The embedding: d wte += by token (the head wrote its part), d wpe.
  for (int64_t a = mb.first; a < mb.end; ++a) {
    const bool acc = a > mb.first || ge.accumulate;
    RETURN_IF_ERROR(Compute(env, [&] {
      return m.embedding().Backward(ge.data, ge.dtype, acc, env.tokens(a), env.residual_grad(a));
    }));
  }
  RETURN_IF_ERROR(env.EndGrads(0, mb, ge));
  return env.GradsDone(0, mb);
}

Status Evaluate(const ModelProgram& m, PassEnv& env, const MicroBatches& mb) {
  RETURN_IF_ERROR(ForwardPass(m, env, mb, Mode::kEval));
  const int L = static_cast<int>(m.spec().n_layer), fin = m.spec().final_unit();
  ASSIGN_OR_RETURN(void* e, env.Acquire(P::Params(0), Access::kRead));
  ASSIGN_OR_RETURN(void* f, env.Acquire(P::Params(fin), Access::kRead));
  const ScratchSpace s = env.head_scratch();
  for (int64_t a = mb.first; a < mb.end; ++a) {
    ASSIGN_OR_RETURN(void* x, env.Acquire(P::Checkpoint(L, a), Access::kRead));
    const HeadArgs h = HeadInputs(env, e, f, x, a, s);
    RETURN_IF_ERROR(Compute(env, [&] { return m.head().Forward(h); }));
    RETURN_IF_ERROR(env.Release(P::Checkpoint(L, a), false));
  }
  RETURN_IF_ERROR(env.Release(P::Params(fin), false));
  return env.Release(P::Params(0), false);
}

}  // namespace strata::models
