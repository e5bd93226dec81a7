#pragma once
// ddp_train's command line: the options, one table that --help and the man page
// both print; the input file and its overrides; and the options that print and
// exit (--help, --version, --keys, --man, --kokkos-help), read before Kokkos is
// started, so that they need no GPU and no launcher.

#include <string>
#include <vector>

#include "comm/context.hpp"

namespace ddp {

struct CommandLine {
  std::string input_file;
  std::vector<std::string> overrides;  // "group.key=value"
  bool check = false;                  // --check: validate input, data and model, do not train
  bool evaluate = false;               // --evaluate: a checkpoint's validation metrics, do not train
  bool exit_now = false;               // --help, --version, --keys, --man, --kokkos-help: printed
  int exit_code = 0;
};

// Rank 0 prints what an informational option asks for; a bad command line is one
// `error:` line on every rank's exit. --kokkos-* options are left in argv for
// Context::start_kokkos; --kokkos-help starts Kokkos on rank 0, which prints its own.
CommandLine parse_command_line(Context& ctx, int argc, char** argv);

}  // namespace ddp
