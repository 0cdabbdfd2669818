// SPDX-License-Identifier: Apache-2.0
// strata eval: the mean loss and perplexity of a model directory
// (engine/inference_model.h) on a file, over the windows the trainer's
// validation reads (DataLoader::Val over the whole file, as with
// data.val_path = FILE), printed as the trainer prints its val loss.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

#include "engine/cli_parse.h"
#include "engine/data.h"
#include "engine/inference_cli.h"
#include "engine/inference_eval.h"
#include "engine/inference_model.h"

namespace strata {

namespace po = boost::program_options;

namespace {

struct EvalFlags {
  std::string model, data, format = "auto", backend = "auto", dtype = "fp32";
  int64_t batches = 0, batch = 0, seq = 0;
  int threads = 0;
  po::variables_map given;
  bool Given(const char* f) const { return given.count(f) > 0 && !given[f].defaulted(); }
};

po::options_description Describe(EvalFlags* f) {
  po::options_description d("strata eval options");
  d.add_options()("help,h", "show this help")(
      "model", po::value(&f->model)->value_name("DIR"),
      "a checkpoint step directory, a --save directory (its latest step) or a Hugging Face model directory")(
      "data", po::value(&f->data)->value_name("FILE"), "a text file or an llm.c/nanoGPT token file")(
      "batches", po::value(&f->batches)->value_name("N"),
      "batches to evaluate (default: the checkpoint's trainer.eval_batches, else 4)")(
      "batch", po::value(&f->batch)->value_name("B"),
      "sequences per batch (default: the checkpoint's train_micro_batch_size_per_gpu, else 1)")(
      "seq", po::value(&f->seq)->value_name("T"), "tokens per sequence (default: the checkpoint's model.seq_len, else "
                                                  "the model's positions)")(
      "data-format", po::value(&f->format)->value_name("F"), "auto (default), text or tokens, as data.format")(
      "backend", po::value(&f->backend)->value_name("NAME"), "auto (default: CUDA when there is a GPU), cpu or cuda")(
      "dtype", po::value(&f->dtype)->value_name("D"), "fp32 (default), bf16 or fp16")(
      "threads", po::value(&f->threads)->value_name("N"), "CPU threads for the CPU backend (0: all)");
  return d;
}

Status CheckFlags(const EvalFlags& f) {
  if (!f.Given("model")) return InvalidArgument("--model DIR is required (a checkpoint or Hugging Face model directory)");
  if (!f.Given("data")) return InvalidArgument("--data FILE is required (the text or token file to evaluate on)");
  for (auto [flag, v] : {std::pair{"batches", f.batches}, std::pair{"batch", f.batch}, std::pair{"seq", f.seq}})
    if (f.Given(flag) && v < 1) return InvalidArgument("--" + std::string(flag) + " " + std::to_string(v) + ": must be at least 1");
  if (f.format != "auto" && f.format != "text" && f.format != "tokens")
    return InvalidArgument("--data-format \"" + f.format + "\" is not allowed (allowed: auto, text, tokens)");
  if (f.Given("threads") && (f.threads < 0 || f.threads > 4096))
    return InvalidArgument("--threads " + std::to_string(f.threads) + ": must be from 0 (all) to 4096");
  return Status::OK();
}

// A field of the checkpoint's training config, or `fallback`.
int64_t FromTraining(const nlohmann::json& c, const char* section, const char* key, int64_t fallback) {
  const nlohmann::json* j = &c;
  if (section) {
    if (!c.is_object() || !c.contains(section)) return fallback;
    j = &c[section];
  }
  if (!j->is_object() || !j->contains(key) || !(*j)[key].is_number_integer()) return fallback;
  return (*j)[key].get<int64_t>();
}

Status Run(const EvalFlags& f) {
  RETURN_IF_ERROR(CheckFlags(f));
  DType dtype = DType::kF32;
  if (f.dtype == "bf16") dtype = DType::kBF16;
  else if (f.dtype == "fp16") dtype = DType::kF16;
  else if (f.dtype != "fp32") return InvalidArgument("--dtype \"" + f.dtype + "\" is not allowed (allowed: fp32, bf16, fp16)");
  ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend, BackendNamed(f.backend, f.threads));
  ASSIGN_OR_RETURN(InferenceModel m, LoadInferenceModel(f.model, backend.get(), dtype, "--model"));
  const nlohmann::json& tc = m.train_config;
  const int64_t B = f.Given("batch") ? f.batch : FromTraining(tc, nullptr, "train_micro_batch_size_per_gpu", 1);
  const int64_t T = f.Given("seq") ? f.seq : FromTraining(tc, "model", "seq_len", m.spec.max_seq);
  const int64_t batches = f.Given("batches") ? f.batches : FromTraining(tc, "trainer", "eval_batches", 4);
  if (T > m.spec.max_seq)
    return InvalidArgument("--seq " + std::to_string(T) + ": the model has " + std::to_string(m.spec.max_seq) +
                           " positions");
  DataConfig dc;
  dc.path = f.data;
  dc.val_path = f.data;  // the whole file is the validation data
  dc.format = f.format;
  Result<std::unique_ptr<DataLoader>> data =
      DataLoader::Open(dc, "", static_cast<int>(m.spec.vocab_size), static_cast<int>(B), static_cast<int>(T));
  if (!data.ok()) return data.status().WithContext("--data " + f.data);
  ASSIGN_OR_RETURN(const double loss, EvaluateModel(m, backend.get(), data->get(), B, T, batches));
  char line[256];
  std::snprintf(line, sizeof line, "val loss %.4f | perplexity %.3f | %lld batches of %lld x %lld tokens", loss,
                std::exp(loss), static_cast<long long>(batches), static_cast<long long>(B), static_cast<long long>(T));
  std::cout << line << "\n";
  std::cerr << "eval: " << m.dir << " on " << backend->name() << ", " << DTypeName(dtype) << "; " << f.data << " ("
            << (*data)->val_tokens() << " tokens)\n";
  return Status::OK();
}

}  // namespace

int RunEvalCommand(int argc, char** argv) {
  EvalFlags f;
  const po::options_description desc = Describe(&f);
  if (Status s = ParseCommandOptions("eval", argc, argv, desc, &f.given); !s.ok()) {
    std::cerr << s.message() << "\n";
    return 2;
  }
  if (f.given.count("help")) {
    std::cout << "usage: strata eval --model DIR --data FILE [--batches N] [options]\n" << desc << "\n";
    return 0;
  }
  const Status s = Run(f);
  if (s.ok()) return 0;
  std::cerr << "strata eval: " << s.ToString() << "\n";
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace strata
