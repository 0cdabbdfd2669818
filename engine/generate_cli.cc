// SPDX-License-Identifier: Apache-2.0
// strata generate: samples a continuation of a prompt from a model directory
// (engine/inference_model.h), streaming each token to stdout as it is chosen.
// Byte-level models (vocabulary 256) take the prompt as text and print text;
// other models take --tokens and print ids (python -m strata generate puts
// their tokenizer around this: python/strata/generate.py).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/cli_parse.h"
#include "engine/generate.h"
#include "engine/inference_cli.h"
#include "engine/inference_model.h"
#include "models/decoder.h"

namespace strata {

namespace po = boost::program_options;

namespace {

struct GenerateFlags {
  std::string model, prompt, prompt_file, tokens, backend = "auto", dtype = "fp32";
  int64_t max_new_tokens = 64, top_k = 0;
  double temperature = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  int threads = 0;
  bool print_ids = false, ignore_eos = false;
  po::variables_map given;
  bool Given(const char* f) const { return given.count(f) > 0 && !given[f].defaulted(); }
};

po::options_description Describe(GenerateFlags* f) {
  po::options_description d("strata generate options");
  d.add_options()("help,h", "show this help")(
      "model", po::value(&f->model)->value_name("DIR"),
      "a checkpoint step directory, a --save directory (its latest step) or a Hugging Face model directory")(
      "prompt", po::value(&f->prompt)->value_name("TEXT"), "the prompt as text (byte-level models)")(
      "prompt-file", po::value(&f->prompt_file)->value_name("FILE"), "the prompt as the text of FILE")(
      "tokens", po::value(&f->tokens)->value_name("IDS"), "the prompt as token ids, e.g. 464,3290 or \"464 3290\"")(
      "max-new-tokens", po::value(&f->max_new_tokens)->default_value(64)->value_name("N"),
      "tokens to generate (fewer when the model's positions run out first)")(
      "temperature", po::value(&f->temperature)->default_value(1.0, "1")->value_name("T"), "0: greedy")(
      "top-k", po::value(&f->top_k)->default_value(0)->value_name("K"), "sample among the K most likely (0: all)")(
      "top-p", po::value(&f->top_p)->default_value(1.0, "1")->value_name("P"),
      "sample among the most likely tokens whose probability reaches P (1: all)")(
      "seed", po::value(&f->seed)->default_value(0)->value_name("S"), "the sampler's seed: a seed gives the same tokens")(
      "print-ids", po::bool_switch(&f->print_ids), "print each new token's id on a line of its own")(
      "ignore-eos", po::bool_switch(&f->ignore_eos),
      "go on past the end-of-text token of generation_config.json (eos_token_id)")(
      "backend", po::value(&f->backend)->value_name("NAME"), "auto (default: CUDA when there is a GPU), cpu or cuda")(
      "dtype", po::value(&f->dtype)->value_name("D"), "fp32 (default), bf16 or fp16: the weights' and activations'")(
      "threads", po::value(&f->threads)->value_name("N"), "CPU threads for the CPU backend (0: all)");
  return d;
}

Result<DType> DTypeFlag(const std::string& s) {
  if (s == "fp32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  if (s == "fp16") return DType::kF16;
  return InvalidArgument("--dtype \"" + s + "\" is not allowed (allowed: fp32, bf16, fp16)");
}

// "464,3290" or "464 3290" -> ids, each in [0, vocab).
Result<std::vector<int32_t>> ParseIds(const std::string& text, int64_t vocab) {
  std::string s = text;
  for (char& c : s)
    if (c == ',') c = ' ';
  std::istringstream in(s);
  std::vector<int32_t> ids;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size()) return InvalidArgument("--tokens: \"" + word + "\" is not a token id");
    if (v < 0 || v >= vocab)
      return InvalidArgument("--tokens: " + word + " is outside the model's vocabulary [0, " + std::to_string(vocab) + ")");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return InvalidArgument("--tokens \"" + text + "\" holds no token id");
  return ids;
}

Status CheckFlags(const GenerateFlags& f) {
  if (!f.Given("model")) return InvalidArgument("--model DIR is required (a checkpoint or Hugging Face model directory)");
  const int prompts = f.Given("prompt") + f.Given("prompt-file") + f.Given("tokens");
  if (prompts == 0) return InvalidArgument("give the prompt: --prompt TEXT, --prompt-file FILE or --tokens IDS");
  if (prompts > 1) return InvalidArgument("--prompt, --prompt-file and --tokens exclude each other: give one");
  if (f.max_new_tokens < 1)
    return InvalidArgument("--max-new-tokens " + std::to_string(f.max_new_tokens) + ": must be at least 1");
  if (f.Given("threads") && (f.threads < 0 || f.threads > 4096))
    return InvalidArgument("--threads " + std::to_string(f.threads) + ": must be from 0 (all) to 4096");
  SamplingOptions s{f.temperature, f.top_k, f.top_p, f.seed};
  return CheckSamplingOptions(s);
}

// The prompt's ids: text as bytes for a byte-level model, else --tokens.
Result<std::vector<int32_t>> PromptIds(const GenerateFlags& f, const InferenceModel& m) {
  const int64_t V = m.spec.vocab_size;
  if (f.Given("tokens")) return ParseIds(f.tokens, V);
  const char* flag = f.Given("prompt") ? "--prompt" : "--prompt-file";
  if (V != 256)
    return InvalidArgument(std::string(flag) + ": " + m.dir + " has a vocabulary of " + std::to_string(V) +
                           " tokens, not bytes: " +
                           (m.has_tokenizer ? "its tokenizer.json turns text into ids: python -m strata generate --model "
                                            : "give the ids: --tokens IDS (a tokenizer.json would let python -m strata "
                                              "generate take text: python -m strata generate --model ") +
                           m.dir + " --prompt ..." + (m.has_tokenizer ? "" : ")"));
  std::string text = f.prompt;
  if (f.Given("prompt-file")) {
    std::ifstream in(f.prompt_file, std::ios::binary);
    if (!in) return ErrnoStatus("--prompt-file: cannot read", f.prompt_file);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  if (text.empty()) return InvalidArgument(std::string(flag) + ": the prompt is empty");
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

Status Run(const GenerateFlags& f) {
  RETURN_IF_ERROR(CheckFlags(f));
  ASSIGN_OR_RETURN(const DType dtype, DTypeFlag(f.dtype));
  ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend, BackendNamed(f.backend, f.threads));
  ASSIGN_OR_RETURN(InferenceModel m, LoadInferenceModel(f.model, backend.get(), dtype, "--model"));
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt, PromptIds(f, m));
  const int64_t P = static_cast<int64_t>(prompt.size()), room = m.spec.max_seq - P;
  if (room < 1)
    return InvalidArgument("the prompt's " + std::to_string(P) + " tokens leave none of the model's " +
                           std::to_string(m.spec.max_seq) + " positions to generate in");
  if (f.Given("max-new-tokens") && f.max_new_tokens > room)
    return InvalidArgument("--max-new-tokens " + std::to_string(f.max_new_tokens) + ": the prompt's " +
                           std::to_string(P) + " tokens leave " + std::to_string(room) + " of the model's " +
                           std::to_string(m.spec.max_seq) + " positions");
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = std::min(f.max_new_tokens, room);
  r.sampling = SamplingOptions{f.temperature, f.top_k, f.top_p, f.seed};
  r.stop_token = f.ignore_eos ? -1 : m.eos_token_id();
  models::Decoder::Options o;
  o.capacity = P + r.max_new_tokens;
  o.max_rows = P;
  ASSIGN_OR_RETURN(std::unique_ptr<models::Decoder> d,
                   models::Decoder::Create(backend.get(), m.spec, dtype, m.unit_params(), o));
  const bool text = m.spec.vocab_size == 256 && !f.print_ids;
  if (text)  // the prompt, then its continuation as it comes
    for (int32_t t : r.prompt) std::fputc(t, stdout);
  std::fflush(stdout);
  bool first = true;
  ASSIGN_OR_RETURN(GenerateStats st, Generate(*d, r, [&](int32_t t) {
    if (text) std::fputc(t, stdout);
    else if (f.print_ids) std::fprintf(stdout, "%d\n", t);
    else std::fprintf(stdout, first ? "%d" : " %d", t);
    first = false;
    std::fflush(stdout);
    return std::ferror(stdout) ? IoError("cannot write to stdout", errno, "stdout") : Status::OK();
  }));
  if (!f.print_ids) std::fputc('\n', stdout);
  std::fflush(stdout);
  const double rate = st.decode_seconds > 0 ? static_cast<double>(st.new_tokens) / st.decode_seconds : 0;
  std::fprintf(stderr, "generate: %lld prompt tokens in %.3f s, %lld new tokens in %.3f s (%.1f tokens/s)%s on %s, %s\n",
               static_cast<long long>(st.prompt_tokens), st.prefill_seconds, static_cast<long long>(st.new_tokens),
               st.decode_seconds, rate, st.stopped ? ", stopped at the end-of-text token" : "",
               backend->name().c_str(), std::string(DTypeName(dtype)).c_str());
  return Status::OK();
}

}  // namespace

int RunGenerateCommand(int argc, char** argv) {
  GenerateFlags f;
  const po::options_description desc = Describe(&f);
  if (Status s = ParseCommandOptions("generate", argc, argv, desc, &f.given); !s.ok()) {
    std::cerr << s.message() << "\n";
    return 2;
  }
  if (f.given.count("help")) {
    std::cout << "usage: strata generate --model DIR [--prompt TEXT | --prompt-file F | --tokens IDS] [options]\n"
              << desc << "\n";
    return 0;
  }
  const Status s = Run(f);
  if (s.ok()) return 0;
  std::cerr << "strata generate: " << s.ToString() << "\n";
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace strata
