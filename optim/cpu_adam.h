// SPDX-License-Identifier: Apache-2.0
// CPU Adam / AdamW: the optimizer step for state that lives in host memory.
//
// One call, CpuAdam::Step, updates one shard (e.g. a layer's parameters) in a
// single pass over memory: it reads the gradient (fp32, fp16 or bf16) and
// multiplies it by the caller's gradient multiplier (1/loss_scale x clip
// coefficient), updates the fp32 master weights and the moments m, v (fp32,
// or bf16 as an explicit option) in place, and writes the new parameter copy
// (fp16, bf16 or fp32) into a caller-given buffer, typically pinned and ready
// for upload. Vectorized for AVX-512 and AVX2+F16C with a scalar fallback,
// chosen at run time (optim/cpu_features.h); parallel with oneTBB over
// cache-sized tiles. Plain C++ with no framework headers: part of the
// embeddable API.
//
// ## The update, as the two references write it (step t >= 1, g the gradient)
//
// torch.optim.Adam / AdamW (torch/optim/adam.py, _single_tensor_adam):
//   Adam (L2):    g = g + wd * p
//   AdamW:        p = p * (1 - lr * wd)
//   m = m.lerp(g, 1 - b1)                      (= b1*m + (1-b1)*g)
//   v = v * b2 + (1 - b2) * g * g              (mul_ then addcmul_)
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps
//   p = p - (lr / (1 - b1^t)) * m / denom      (addcdiv_)
//   Always bias-corrected; hyperparameters are Python floats (double) and the
//   tensor arithmetic is in the tensor's dtype.
//
// DeepSpeed cpu_adam (csrc/includes/cpu_adam.h, Step_AVX; adamw_mode defaults
// to true, also for "type": "Adam" in a DeepSpeed config):
//   L2 mode:      g = p * wd + g                (only when wd > 0)
//   m = g * (1-b1) + m * b1                    (fma)
//   v = (g*g) * (1-b2) + v * b2                (fma)
//   denom = sqrt(v) * bc2 + eps                (fma), bc2 = 1/sqrt(1 - b2^t)
//   AdamW mode:   p = p * (-lr*wd) + p          (fma; only when wd > 0)
//   p = (m / denom) * (-lr / bc1) + p          (fma), bc1 = 1 - b1^t
//   bias_correction can be turned off (bc1 = bc2 = 1); the per-step
//   constants are computed in fp32 (b^t as a running fp32 product).
//
// Where they differ: only in rounding, never in the mathematics. torch
// divides sqrt(v) by sqrt(bc2) where DeepSpeed multiplies by its inverse;
// torch's lerp and mul_/addcmul_ round differently from DeepSpeed's fmas;
// DeepSpeed's fp32 b^t drifts from the exact power over long runs; torch's
// AdamW scales p by (1 - lr*wd) where DeepSpeed adds (-lr*wd)*p with one fma.
// torch always applies weight decay, DeepSpeed only when wd > 0 (the same
// thing for wd >= 0). Both count t from 1 and add eps after the bias
// correction of sqrt(v).
//
// ## strata's update
//
// The per-element operations are DeepSpeed's fma sequence, written out in
// optim/adam_coefficients.h (AdamCoefficients), with each per-step constant computed
// in double and rounded to fp32 once (MakeAdamCoefficients). Against a
// float64 evaluation of the formula the fp32 results are within a few fp32
// ulps (tests/optim/cpu_adam_test.cc checks 1e-6 relative, measured against
// the magnitude of the terms summed, and reproduces torch.optim.AdamW's
// update of tests/data/gpt2_tiny_ref.safetensors).
//
// ## Determinism
//
// Every path (scalar, AVX2, AVX-512, AVX-512+BF16, and the GPU kernel)
// executes the same IEEE operations in the same order: the scalar path uses
// std::fma where the vector code uses FMA instructions, sqrt and division are
// correctly rounded everywhere, fp16/bf16 conversions round to nearest even
// (base/half.h is the reference; the native vcvtneps2bf16, which flushes
// subnormal inputs, is bypassed for those inputs). So all paths, and any
// thread count, give bitwise identical results; the tests demand equality.
// (NaN results are NaN everywhere, but their payload bits are not part of
// the contract: x86 propagates an input NaN's payload, the GPU writes a
// canonical NaN.)
// ComputeGradStats sums in fp64 over a fixed decomposition (64 Ki-element
// tiles, 16 interleaved lanes per tile, lanes and tiles summed in index
// order) that does not depend on the path or the thread count either.
// (The process must run with the default MXCSR: no flush-to-zero or
// denormals-are-zero.)
//
// ## Non-finite gradients: what is guaranteed
//
// A single pass cannot both discover a NaN in its last tile and not have
// written its first tiles. So:
//  - ComputeGradStats(grad) counts non-finite values (and the squared L2 norm
//    needed for global clipping anyway) without writing anything. With
//    dynamic loss scaling the engine calls it for every shard before any
//    Step, and skips the step on overflow: then no state has been touched.
//  - Step with AdamStepOptions::skip_on_nonfinite = true first scans the
//    shard's gradient (2-4 bytes/param more traffic) and, if any value is
//    non-finite, returns {skipped = true} having written nothing at all
//    (out of place: nor the outputs).
//  - Step without it always updates everything and reports the number of
//    non-finite gradient values it met (AdamStepResult::nonfinite_grads);
//    the state of those elements then holds Inf/NaN.
// Values are counted before the multiplier is applied.
//
// ## In place or out of place
//
// By default master, m and v are updated in place. With AdamShard's
// master_out / exp_avg_out / exp_avg_sq_out set, the pass reads the old state
// and writes the new one there instead, leaving the inputs untouched (the
// engine's speculative update keeps two sets and commits one by swapping
// them: engine/trainer.cc). The arithmetic is the same, so the results are
// bitwise the in-place ones, on every path and thread count.
//
// ## Memory traffic per parameter (what one Step moves)
//
//   master fp32 read+write 8, m and v read+write 16 (fp32) or 8 (bf16),
//   gradient read 4/2, parameter copy written 2/4 (non-temporal stores: no
//   read for ownership). fp32 state + fp16 grad + fp16 copy = 28 bytes.
//   (AdamBytesPerParam computes it.) Out of place the same: the old state is
//   read and the new one written with non-temporal stores, so the outputs
//   cost no read for ownership. (That needs the three new-state arrays
//   aligned alike, as 64-byte-aligned buffers are: after the elements up to
//   the new master's first 64-byte boundary, each must be at one too;
//   otherwise they get plain stores: the same results, and then a read for
//   ownership too.)
//
// ## Reaching the memory roof: what the pass does, what the caller does
//
// The pass is bandwidth-bound: 8 streams per thread (4 read, 3 written in
// place, 1 written non-temporally; out of place 4 read, 4 written
// non-temporally). What decides how much of the machine's bandwidth it gets,
// besides the code:
//  - Pages: with 4 KiB pages each stream crosses a page every 64 lines (dTLB
//    misses, and the L2 streamer stops at every page boundary). Allocate the
//    arrays 2 MiB-aligned with MADV_HUGEPAGE before first touch:
//    tiers/host_tier.h MapHostMemory, or HostTierOptions::huge_pages =
//    kAligned for the host tier.
//  - Placement: touch the pages first from the threads that will update them
//    (RunTiles runs a function on exactly Step's threads and partition);
//    Options::pin_threads keeps them there.
//  - Memory-level parallelism: Options::prefetch_bytes adds software
//    prefetches ahead of the hardware prefetchers (a hint; no effect on any
//    result).
// strata-bench adam measures every combination against a roof pass with the
// same byte pattern, set up the same way; scripts/adam-sweep.sh is the sweep
// that picks the defaults.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "base/dtype.h"
#include "base/status.h"
#include "optim/adam_coefficients.h"
#include "optim/cpu_features.h"
#include "optim/grad_clip.h"

namespace strata::optim {

enum class WeightDecayMode : uint8_t {
  kDecoupled,  // AdamW: p -= lr * wd * p  (torch.optim.AdamW; DeepSpeed adam_w_mode=true)
  kL2,         // Adam:  g += wd * p       (torch.optim.Adam;  DeepSpeed adam_w_mode=false)
};

// Hyperparameters of one parameter group for one step.
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  WeightDecayMode decay_mode = WeightDecayMode::kDecoupled;
  bool bias_correction = true;  // DeepSpeed's option; torch always corrects
  int64_t step = 1;             // the step being taken, counted from 1

  // InvalidArgument naming the field and the rule: lr >= 0, 0 <= beta1 < 1,
  // 0 <= beta2 < 1, eps >= 0, weight_decay >= 0 (all finite), step >= 1.
  Status Validate() const;
};

// The fp32 per-element constants of one step (optim/adam_coefficients.h), from the
// hyperparameters and the gradient multiplier (finite, >= 0), computed in
// double and rounded once. Validates both.
Result<AdamCoefficients> MakeAdamCoefficients(const AdamHyper& h, double grad_scale);

// One shard in host memory. All arrays hold n elements, are naturally aligned
// for their dtype and do not overlap. Writing the copy (and, out of place,
// the new state) with non-temporal stores needs nothing from the caller (the
// pass aligns itself), but pinned, page-aligned buffers are what the upload
// wants anyway.
struct AdamShard {
  size_t n = 0;
  float* master = nullptr;              // (n) fp32 master weights, updated in place (or read only: out of place)
  void* exp_avg = nullptr;              // (n) state_dtype: first moment m, in place (or read only)
  void* exp_avg_sq = nullptr;           // (n) state_dtype: second moment v, in place (or read only)
  DType state_dtype = DType::kF32;      // kF32, or kBF16 to halve the state traffic
  const void* grad = nullptr;           // (n) grad_dtype, read only
  DType grad_dtype = DType::kF32;       // kF32, kF16 or kBF16
  void* param_out = nullptr;            // (n) param_out_dtype: the new parameters; nullptr: none
  DType param_out_dtype = DType::kF16;  // kF16, kBF16 or kF32
  // Out of place: all three set, the new master / m / v are written here
  // (the same dtypes as the inputs) and the inputs above are only read. All
  // three null: in place.
  float* master_out = nullptr;          // (n) fp32
  void* exp_avg_out = nullptr;          // (n) state_dtype
  void* exp_avg_sq_out = nullptr;       // (n) state_dtype

  bool out_of_place() const { return master_out != nullptr; }

  // InvalidArgument naming the field: null pointers (n > 0), unsupported
  // dtypes, misaligned pointers, some but not all of the *_out state
  // pointers, any two arrays overlapping.
  Status Validate() const;
};

// Bytes one Step moves per parameter for this shard's dtypes (see above);
// `prescan` adds the gradient read of skip_on_nonfinite. The same in place
// and out of place (aligned outputs: see above).
size_t AdamBytesPerParam(DType grad, DType state, bool param_out, DType out, bool prescan = false);

struct AdamStepOptions {
  double grad_scale = 1.0;         // multiplier on every gradient value (GradMultiplier)
  bool skip_on_nonfinite = false;  // scan the gradient first; write nothing if any is non-finite
};

struct AdamStepResult {
  uint64_t nonfinite_grads = 0;  // non-finite gradient values found
  bool skipped = false;          // true: nothing was written (skip_on_nonfinite found some)
};

// Where software prefetches put the line (CpuAdam::Options::prefetch_bytes).
enum class PrefetchHint : uint8_t {
  kL1,  // prefetcht0: into L1 (and L2); holds a line fill buffer until the data arrive
  kL2,  // prefetcht2: into L2 only; the L2's larger miss queue keeps more lines in flight
};
std::string_view PrefetchHintName(PrefetchHint h);  // "l1", "l2"

// The CPU Adam engine: a thread pool (a oneTBB arena of `threads` threads,
// optionally pinned to cores with hwloc) and the chosen code path. Holds no
// optimizer state; the caller owns all arrays.
//
// Thread-safety: Step and ComputeGradStats may be called concurrently from
// several threads (on different shards); the calls share the arena.
class CpuAdam {
 public:
  struct Options {
    int threads = 0;                 // 0: all hardware threads (oneTBB's default concurrency)
    Isa isa = Isa::kAuto;            // kAuto: the best path this CPU supports
    size_t tile_elems = 16 * 1024;   // elements per task (a multiple of 64, 64..2^24)
    bool pin_threads = false;        // bind worker threads to cores (hwloc)
    int numa_node = -1;              // with pin_threads: only cores of this NUMA node (-1: any)
    // Software prefetch distance in bytes (a multiple of 64, at most 64 KiB;
    // 0: none, the hardware prefetchers only). Each read stream (master, m,
    // v, gradient) is prefetched this many bytes ahead of where the pass
    // reads it, one prefetch per 64-byte line, never past the shard's end;
    // the copy is written non-temporally and not prefetched. Meant to raise
    // the memory-level parallelism of a core beyond what its L2 streamer
    // keeps in flight across 4 KiB page boundaries. A hint only: results are
    // bitwise the same for every distance and hint (tests/optim).
    // Default 2 KiB into L1: scripts/adam-sweep.sh on the H200 host (16
    // threads, f16:f32:f16, 200M parameters) measured 5.46-5.86 G params/s
    // with it against 4.69-5.19 without (docs/measurements.md).
    size_t prefetch_bytes = 2048;
    PrefetchHint prefetch_hint = PrefetchHint::kL1;
  };

  // Unavailable when the requested path is not supported here (naming the
  // missing CPU features) or pinning is asked for and hwloc cannot do it;
  // InvalidArgument for bad options.
  static Result<std::unique_ptr<CpuAdam>> Create(const Options& options);
  static Result<std::unique_ptr<CpuAdam>> Create() { return Create(Options{}); }
  ~CpuAdam();
  CpuAdam(const CpuAdam&) = delete;
  CpuAdam& operator=(const CpuAdam&) = delete;

  // Updates one shard (see the header comment for the exact semantics and the
  // non-finite guarantee). Errors (InvalidArgument naming the field) are
  // detected before anything is written.
  Result<AdamStepResult> Step(const AdamShard& shard, const AdamHyper& hyper,
                              const AdamStepOptions& options = {}) const;

  // Sum of squares (fp64) and non-finite count of n gradient values of
  // `dtype` (kF32, kF16, kBF16). Writes nothing. Deterministic (see above).
  Result<GradStats> ComputeGradStats(const void* grad, DType dtype, size_t n) const;

  // Runs f(tile) for every tile in [0, ntiles) on this engine's threads, with
  // the partition Step uses (contiguous runs of tiles per thread, pinned if
  // asked); returns when all are done. For work that must share Step's
  // threads and placement: first-touch initialization of the state, and the
  // memory roof that strata-bench adam measures beside Step. f must be safe
  // to call concurrently for different tiles.
  void RunTiles(size_t ntiles, const std::function<void(size_t tile)>& f) const;

  Isa isa() const { return isa_; }
  int threads() const { return threads_; }
  size_t tile_elems() const { return tile_elems_; }
  size_t prefetch_bytes() const { return prefetch_bytes_; }
  PrefetchHint prefetch_hint() const { return prefetch_hint_; }
  bool pinned() const;

 private:
  struct Impl;
  CpuAdam() = default;
  Isa isa_ = Isa::kScalar;
  int threads_ = 1;
  size_t tile_elems_ = 0;
  size_t prefetch_bytes_ = 0;
  PrefetchHint prefetch_hint_ = PrefetchHint::kL2;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::optim
