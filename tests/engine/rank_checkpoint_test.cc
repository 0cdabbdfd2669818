// SPDX-License-Identifier: Apache-2.0
// Partitioned checkpoints (engine/checkpoint.h): each rank's slices in a
// file of its own beside the Hugging Face weights, resumed at another world
// size by reading the slices that overlap what each new rank keeps. The
// ranks here are in-memory shards of known values (the MPI runs of the whole
// trainer are tests/engine/dp_ranks.cc and mpirun_resume.py).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/checkpoint.h"
#include "engine/inference_model.h"
#include "engine/model_config.h"
#include "kernels/backend.h"
#include "tests/engine/tiny_trainer.h"
#include "tests/test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::FileBytes;
using ::strata::testing::StatusIs;
using ::strata::testing::TempDir;
using ::testing::HasSubstr;

// The value of element i of unit u's master (which 0), m (1) or v (2):
// distinct everywhere; the moments exact in bf16 (quarters below 32), the
// masters not (a 2^-12 more), so that a bf16 copy of them is told apart.
float Value(size_t u, int64_t i, int which) {
  const float q = static_cast<float>((static_cast<int64_t>(u) * 7 + i * 3 + which * 11) % 127) / 4.0f;
  return which == 0 ? q + 1.0f / 4096 : q;
}

void Fill(size_t u, int64_t off, int64_t n, int which, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = Value(u, off + i, which);
}

// Rank `rank` of `world`'s shards as a trainer's ModelState gives them.
std::vector<CheckpointShard> SavingRank(const models::ModelSpec& spec, int rank, int world, DType moments) {
  std::vector<CheckpointShard> out;
  for (size_t u = 0; u < spec.units.size(); ++u) {
    CheckpointShard c;
    c.numel = spec.units[u].numel;
    c.moment_dtype = moments;
    const FlatSlice s = FlatSliceOf(c.numel, world, rank);
    c.slice_off = s.off;
    c.slice_len = s.len;
    c.read_own = [u, s](float* w, float* m, float* v) {
      Fill(u, s.off, s.len, 0, w);
      Fill(u, s.off, s.len, 1, m);
      Fill(u, s.off, s.len, 2, v);
      return Status::OK();
    };
    // (the gathered read rank 0 makes for the Hugging Face weights)
    c.read = [u, n = c.numel](float* w, float* m, float* v) {
      if (w) Fill(u, 0, n, 0, w);
      if (m) Fill(u, 0, n, 1, m);
      if (v) Fill(u, 0, n, 2, v);
      return Status::OK();
    };
    out.push_back(std::move(c));
  }
  return out;
}

// Saves step 7 as `world` ranks would (each rank's file, then rank 0's rest).
Result<std::string> SavePartitioned(const std::string& dir, const models::ModelSpec& spec, int world,
                                    DType moments = DType::kF32, DType hf_dtype = DType::kF32) {
  TrainState ts;
  ts.step = 7;
  ts.data_position = 123;
  ts.precision = "fp32";
  RETURN_IF_ERROR(PrepareCheckpointTmpDir(dir, ts.step));
  CheckpointExtras extras;
  extras.hf_dtype = hf_dtype;
  for (int r = 0; r < world; ++r) {
    ASSIGN_OR_RETURN(FileSum sum, WriteRankStateFile(CheckpointTmpDir(dir, ts.step, ::getpid()), spec,
                                                     SavingRank(spec, r, world, moments), r, world, ts.step));
    extras.rank_files.push_back(sum);
  }
  return SaveCheckpoint(dir, spec, SavingRank(spec, 0, world, moments), ts, extras);
}

// A resuming rank's shards: what each write received.
struct Loaded {
  std::vector<std::vector<float>> w, m, v;
};
std::vector<CheckpointShard> ResumingRank(const models::ModelSpec& spec, int rank, int world, Loaded* got) {
  got->w.assign(spec.units.size(), {});
  got->m.assign(spec.units.size(), {});
  got->v.assign(spec.units.size(), {});
  std::vector<CheckpointShard> out;
  for (size_t u = 0; u < spec.units.size(); ++u) {
    CheckpointShard c;
    c.numel = spec.units[u].numel;
    if (world > 1) {
      const FlatSlice s = FlatSliceOf(c.numel, world, rank);
      c.slice_off = s.off;
      c.slice_len = s.len;
    }
    c.write = [u, n = c.numel, got](const float* w, const float* m, const float* v) {
      got->w[u].assign(w, w + n);
      got->m[u].assign(m, m + n);
      got->v[u].assign(v, v + n);
      return Status::OK();
    };
    out.push_back(std::move(c));
  }
  return out;
}

// Every element in [begin, end) of each unit's arrays is the saved value.
void ExpectKept(const models::ModelSpec& spec, const Loaded& got, int world, int rank) {
  for (size_t u = 0; u < spec.units.size(); ++u) {
    const int64_t n = spec.units[u].numel;
    const FlatSlice s = world > 1 ? FlatSliceOf(n, world, rank) : FlatSlice{0, n};
    ASSERT_EQ(got.w[u].size(), static_cast<size_t>(n)) << spec.units[u].name;
    for (int64_t i = s.off; i < s.off + s.len; ++i) {
      ASSERT_EQ(got.w[u][i], Value(u, i, 0)) << spec.units[u].name << " master " << i;
      ASSERT_EQ(got.m[u][i], Value(u, i, 1)) << spec.units[u].name << " exp_avg " << i;
      ASSERT_EQ(got.v[u][i], Value(u, i, 2)) << spec.units[u].name << " exp_avg_sq " << i;
    }
  }
}

models::ModelSpec TinySpec() {
  Result<models::ModelSpec> spec = ModelSpecFor(testing::TinyTrainer(2).config);
  EXPECT_OK(spec.status());
  return *spec;
}

TEST(RankCheckpoint, EachRankHasItsFileAndTheManifestNamesThem) {
  TempDir dir;
  const models::ModelSpec spec = TinySpec();
  ASSERT_OK_AND_ASSIGN(const std::string step, SavePartitioned(dir.path(), spec, 2));
  EXPECT_TRUE(fs::exists(step + "/zero-rank-00000-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(step + "/zero-rank-00001-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(step + "/model.safetensors"));  // the Hugging Face weights, once
  EXPECT_FALSE(fs::exists(step + "/master.safetensors"));
  EXPECT_FALSE(fs::exists(step + "/optimizer.safetensors"));
  std::ifstream in(step + "/manifest.json");
  const nlohmann::json m = nlohmann::json::parse(in);
  EXPECT_EQ(m["files"]["zero"]["world"], 2);
  EXPECT_EQ(m["files"]["zero"]["files"][1], "zero-rank-00001-of-00002.safetensors");
  EXPECT_TRUE(m["checksums"].contains("zero-rank-00000-of-00002.safetensors"));
}

// Saved at 2, resumed at 2, 3 and 1: each rank gets the part it keeps (its
// slice of the master and moments; at stages 1-2 the full parameters are
// gathered from the ranks' slices, engine/model_state.h).
TEST(RankCheckpoint, ResumesAtAnyWorldSize) {
  TempDir dir;
  const models::ModelSpec spec = TinySpec();
  ASSERT_OK(SavePartitioned(dir.path(), spec, 2).status());
  for (int world : {2, 3, 1})
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(world));
      Loaded got;
      TrainState ts;
      ASSERT_OK(LoadCheckpoint(dir.path(), spec, ResumingRank(spec, rank, world, &got), &ts, nullptr));
      EXPECT_EQ(ts.step, 7);
      EXPECT_EQ(ts.data_position, 123u);
      ExpectKept(spec, got, world, rank);
    }
}

TEST(RankCheckpoint, Bf16MomentsResumeExactly) {
  TempDir dir;
  const models::ModelSpec spec = TinySpec();
  ASSERT_OK(SavePartitioned(dir.path(), spec, 3, DType::kBF16).status());
  Loaded got;
  TrainState ts;
  ASSERT_OK(LoadCheckpoint(dir.path(), spec, ResumingRank(spec, 0, 2, &got), &ts, nullptr));
  ExpectKept(spec, got, 2, 0);
}

// One bit of the byte in the middle of file `path` flipped in place.
void FlipAByteOf(const std::string& path) {
  std::string bytes = FileBytes(path);
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A flipped byte in a rank's file is DataLoss naming it, for a rank that
// reads that file; nothing is written into the shards.
TEST(RankCheckpoint, AFlippedByteInARankFileIsDataLossNamingIt) {
  TempDir dir;
  const models::ModelSpec spec = TinySpec();
  ASSERT_OK_AND_ASSIGN(const std::string step, SavePartitioned(dir.path(), spec, 2));
  FlipAByteOf(step + "/zero-rank-00001-of-00002.safetensors");
  Loaded got;
  TrainState ts;
  const Status s = LoadCheckpoint(dir.path(), spec, ResumingRank(spec, 1, 2, &got), &ts, nullptr);
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(s.ToString(), HasSubstr("zero-rank-00001-of-00002.safetensors"));
  EXPECT_TRUE(got.w[0].empty());
}

// Resumed at the world size it was saved at, a rank reads its own file
// alone (no rank reads the whole master): rank 1's file damaged, rank 0
// resumes all the same, and rank 1 gets the DataLoss.
TEST(RankCheckpoint, AtTheSameWorldSizeARankReadsItsOwnFileAlone) {
  TempDir dir;
  const models::ModelSpec spec = TinySpec();
  ASSERT_OK_AND_ASSIGN(const std::string step, SavePartitioned(dir.path(), spec, 2));
  FlipAByteOf(step + "/zero-rank-00001-of-00002.safetensors");
  Loaded got;
  TrainState ts;
  ASSERT_OK(LoadCheckpoint(dir.path(), spec, ResumingRank(spec, 0, 2, &got), &ts, nullptr));
  ExpectKept(spec, got, 2, 0);
  EXPECT_THAT(LoadCheckpoint(dir.path(), spec, ResumingRank(spec, 1, 2, &got), &ts, nullptr),
              StatusIs(StatusCode::kDataLoss));
}

// A rank file that says it is another rank's (renamed over) is DataLoss.
TEST(RankCheckpoint, ARankFileOfAnotherRankIsDataLoss) {
  TempDir dir;
  const models::ModelSpec spec = TinySpec();
  ASSERT_OK_AND_ASSIGN(const std::string step, SavePartitioned(dir.path(), spec, 2));
  // Rank 0's bytes under rank 1's name, in a manifest without checksums
  // (as an older save's): the file's own metadata must catch it.
  fs::copy_file(step + "/zero-rank-00000-of-00002.safetensors", step + "/zero-rank-00001-of-00002.safetensors",
                fs::copy_options::overwrite_existing);
  std::ifstream in(step + "/manifest.json");
  nlohmann::json m = nlohmann::json::parse(in);
  in.close();
  m.erase("manifest_crc32c");
  m.erase("checksums");
  std::ofstream(step + "/manifest.json", std::ios::trunc) << m.dump(2);
  Loaded got;
  TrainState ts;
  std::ostringstream log;
  const Status s = LoadCheckpoint(dir.path(), spec, ResumingRank(spec, 0, 1, &got), &ts, nullptr, &log);
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(s.ToString(), HasSubstr("rank 1 of 2"));
}

// strata generate and eval read a partitioned step's fp32 masters from the
// ranks' slices: each unit once, in unit order, put together at any split.
TEST(RankCheckpoint, ThePartitionedMastersPutTogetherAreTheSavedOnes) {
  TempDir dir;
  const models::ModelSpec spec = TinySpec();
  ASSERT_OK(SavePartitioned(dir.path(), spec, 3).status());
  std::vector<size_t> order;
  ASSERT_OK_AND_ASSIGN(const bool partitioned,
                       ReadPartitionedMasters(dir.path(), spec, [&](size_t u, std::span<const float> w) {
                         order.push_back(u);
                         EXPECT_EQ(w.size(), static_cast<size_t>(spec.units[u].numel)) << spec.units[u].name;
                         for (size_t i = 0; i < w.size(); ++i)
                           if (w[i] != Value(u, static_cast<int64_t>(i), 0)) {
                             ADD_FAILURE() << spec.units[u].name << " master " << i << ": " << w[i];
                             break;
                           }
                         return Status::OK();
                       }));
  EXPECT_TRUE(partitioned);
  ASSERT_EQ(order.size(), spec.units.size());
  for (size_t u = 0; u < order.size(); ++u) EXPECT_EQ(order[u], u);
}

// A step saved by one rank has its masters in master.safetensors: nothing
// is read here.
TEST(RankCheckpoint, AStepThatIsNotPartitionedHasNoPartitionedMasters) {
  TempDir dir;
  const models::ModelSpec spec = TinySpec();
  TrainState ts;
  ts.step = 7;
  ASSERT_OK(SaveCheckpoint(dir.path(), spec, SavingRank(spec, 0, 1, DType::kF32), ts, CheckpointExtras{}).status());
  bool called = false;
  ASSERT_OK_AND_ASSIGN(const bool partitioned, ReadPartitionedMasters(dir.path(), spec, [&](size_t, std::span<const float>) {
    called = true;
    return Status::OK();
  }));
  EXPECT_FALSE(partitioned);
  EXPECT_FALSE(called);
}

// A rank's file gone, or one whose masters have another shape (another
// model's), is an error naming the file; nothing is handed out.
TEST(RankCheckpoint, PartitionedMastersOfAMissingOrForeignRankFileAreAnError) {
  TempDir dir;
  const models::ModelSpec spec = TinySpec();
  ASSERT_OK_AND_ASSIGN(const std::string step, SavePartitioned(dir.path(), spec, 2));
  bool called = false;
  auto take = [&](size_t, std::span<const float>) {
    called = true;
    return Status::OK();
  };
  models::ModelSpec other = spec;
  other.units[1].numel += 2;
  Result<bool> r = ReadPartitionedMasters(dir.path(), other, take);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.status().ToString(), HasSubstr("zero-rank-00000-of-00002.safetensors"));
  EXPECT_THAT(r.status().ToString(), HasSubstr("master." + spec.units[1].name));
  fs::remove(step + "/zero-rank-00001-of-00002.safetensors");
  r = ReadPartitionedMasters(dir.path(), spec, take);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(r.status().ToString(), HasSubstr("zero-rank-00001-of-00002.safetensors"));
  EXPECT_FALSE(called);
}

// LoadInferenceModel (strata generate, strata eval) on a partitioned step
// whose Hugging Face copy is bf16 gets the fp32 masters, not the copy.
TEST(RankCheckpoint, AModelLoadedFromAPartitionedStepHasTheFp32Masters) {
  TempDir dir;
  const models::ModelSpec spec = TinySpec();
  ASSERT_OK_AND_ASSIGN(const std::string step, SavePartitioned(dir.path(), spec, 2, DType::kF32, DType::kBF16));
  auto be = kernels::MakeCpuBackend(1);
  ASSERT_OK_AND_ASSIGN(InferenceModel m, LoadInferenceModel(step, be.get(), DType::kF32, "--model"));
  EXPECT_EQ(m.weights, step + "/manifest.json");
  ASSERT_EQ(m.spec.units.size(), spec.units.size());
  for (size_t u = 0; u < spec.units.size(); ++u) {
    ASSERT_EQ(m.spec.units[u].numel, spec.units[u].numel) << spec.units[u].name;
    std::vector<float> got(static_cast<size_t>(spec.units[u].numel));
    ASSERT_OK(be->CopyToHost(got.data(), m.units[u].data(), got.size() * sizeof(float)));
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], Value(u, static_cast<int64_t>(i), 0)) << spec.units[u].name << " " << i;
  }
}

}  // namespace
}  // namespace strata
