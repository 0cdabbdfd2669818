// SPDX-License-Identifier: Apache-2.0
// strata generate and strata eval: the command lines (engine/generate_cli.cc,
// engine/eval_cli.cc). Each returns the process's exit status: 0, 2 for a
// bad argument (named in the message), 1 for any other error.
//
//   strata generate --model DIR [--prompt TEXT | --prompt-file F | --tokens IDS]
//                   [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]
//                   [--print-ids] [--ignore-eos] [--backend B] [--dtype D] [--threads N]
//   strata eval --model DIR --data FILE [--batches N] [--batch B] [--seq T]
//               [--data-format F] [--backend B] [--dtype D] [--threads N]
#pragma once

namespace strata {

int RunGenerateCommand(int argc, char** argv);
int RunEvalCommand(int argc, char** argv);

}  // namespace strata
