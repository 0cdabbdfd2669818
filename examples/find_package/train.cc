// SPDX-License-Identifier: Apache-2.0
// strata's trainer embedded in a program of its own (find_package(strata),
// strata::engine): a small GPT trained for a few steps on the CPU backend
// over a text file (argv[1], else one this program writes), every step's
// loss printed. Exits 1 unless the loss fell by more than 0.5.
//
//   train [TEXT_FILE]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include <strata/base/status.h>
#include <strata/engine/trainer.h>

namespace {

constexpr int64_t kSteps = 12;

// A corpus with structure for the byte-level model to find: 64 KiB of a few
// sentences in varying order.
strata::Status WriteCorpus(const std::string& path) {
  const char* sentences[] = {"the store keeps every tensor on one tier. ", "the optimizer updates on the cpu. ",
                             "the forward waits for its layer. ", "bytes move over pcie and nvme. "};
  std::ostringstream text;
  uint32_t x = 12345;
  while (text.tellp() < (64 << 10)) {
    x = x * 1103515245u + 12345u;
    text << sentences[(x >> 16) % 4];
  }
  std::ofstream f(path, std::ios::binary);
  f << text.str();
  f.close();
  if (!f) return strata::ErrnoStatus("write", path);
  return strata::Status::OK();
}

strata::Status Train(const std::string& data) {
  strata::TrainOptions o;
  strata::Config& c = o.config;
  c.model.n_layer = 2;
  c.model.n_embd = 64;
  c.model.n_head = 4;
  c.model.vocab_size = 256;  // bytes
  c.model.seq_len = 32;
  c.micro_batch = 8;
  c.grad_accum = 1;
  c.train_batch_size = 8;
  c.optimizer.lr = 2e-3;
  c.steps_per_print = 1000;  // quiet: this program prints its own line per step
  c.data.path = data;
  o.backend = "cpu";
  o.cpu_threads = 2;
  o.host_memory_limit = 256 << 20;
  o.gpu_memory_limit = 256 << 20;

  std::ostringstream log;
  ASSIGN_OR_RETURN(auto trainer, strata::Trainer::Create(o, log));
  double first = 0, last = 0;
  for (int64_t i = 0; i < kSteps; ++i) {
    ASSIGN_OR_RETURN(strata::StepReport r, trainer->Step());
    std::printf("step %lld: loss %.3f\n", static_cast<long long>(r.step), r.loss);
    (i == 0 ? first : last) = r.loss;
  }
  if (!(last < first - 0.5)) {
    return strata::Internal("the loss did not fall: " + std::to_string(first) + " -> " + std::to_string(last));
  }
  return strata::Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  std::string data;
  if (argc > 1) {
    data = argv[1];
  } else {
    char tmpl[] = "/var/tmp/strata-example-XXXXXX.txt";
    int fd = mkstemps(tmpl, 4);
    if (fd < 0) {
      std::perror("mkstemps");
      return 2;
    }
    close(fd);
    data = tmpl;
  }
  strata::Status s = argc > 1 ? strata::Status::OK() : WriteCorpus(data);
  if (s.ok()) s = Train(data);
  if (argc <= 1) unlink(data.c_str());
  if (!s.ok()) {
    std::fprintf(stderr, "train: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
