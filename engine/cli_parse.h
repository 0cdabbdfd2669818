// SPDX-License-Identifier: Apache-2.0
// What the subcommands of strata share on their command lines: options
// parsed without prefix guessing and an unknown one answered with the
// nearest known ("did you mean"), and the backend a --backend value names.
//
// Thread-safety: free functions.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "base/status.h"
#include "kernels/backend.h"

namespace strata {

// The nearest of `names` to `word` when it is near enough to be a typo; "" otherwise.
std::string Nearest(const std::string& word, const std::vector<std::string>& names);

// Parses argv (argv[0] the command's name) into `vm` by `desc`; InvalidArgument
// "strata CMD: unknown option --x; did you mean --y? (strata CMD --help)" or
// the parser's message.
Status ParseCommandOptions(const std::string& cmd, int argc, char** argv,
                           const boost::program_options::options_description& desc,
                           boost::program_options::variables_map* vm);

// "auto" (CUDA when a GPU is usable, else the CPU), "cpu" or "cuda";
// InvalidArgument naming --backend otherwise. `threads` for the CPU backend (0: all).
Result<std::unique_ptr<kernels::Backend>> BackendNamed(const std::string& name, int threads);

}  // namespace strata
