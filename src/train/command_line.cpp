#include "train/command_line.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "comm/check.hpp"
#include "train/config.hpp"
#include "train/version.hpp"

namespace ddp {

namespace {

// A term and what it means: an option, an exit status, a variable, a file.
struct Item {
  const char* tag;  // "--check", "75", "DDP_CONV_LAYOUT=plain"
  const char* text;
};

// The operands and options, in the order --help and the man page list them.
const Item kOptions[] = {
    {"input.nml",
     "the input file: a Fortran namelist with the groups &data, &model, &train, &io, &comm "
     "(ddp_train --keys lists their keys)"},
    {"group.key=value",
     "override one key of the input file, e.g. train.epochs=3 io.run_dir=runs/try1 "
     "(strings need no quotes; lists are comma-separated)"},
    {"--check",
     "validate the input, the data files and the model, then exit without training (exit status 0 "
     "when all is well)"},
    {"--evaluate",
     "measure the validation loss and accuracy (top-1, and top-5 with more than 5 classes) of the checkpoint "
     "a run would start from (io.resume, else io.init_from) on data.val_files, as the run's validation "
     "does, on any number of ranks; no training, nothing written to io.run_dir; rank 0 prints the result "
     "and an 'evaluation: {...}' JSON line"},
    {"--trace",
     "io.trace=T: a timeline of io.trace_steps per rank in <run_dir>/trace (Perfetto; "
     "tools/merge_traces merges the ranks)"},
    {"--keys", "every key of the input file: type, default, range and meaning"},
    {"--keys --markdown", "the same as a Markdown table (docs/input.md's)"},
    {"--man", "the manual page ddp_train(1) as roff (ddp_train --man | man -l -)"},
    {"--kokkos-help", "Kokkos's own options (--kokkos-*), which ddp_train passes on to Kokkos"},
    {"--help, -h", "the usage and these options"},
    {"--version", "version and build configuration"},
};

const char* kSynopsis = "ddp_train [options] input.nml [group.key=value ...]";
const char* kPurpose =
    "Data-parallel neural-network training on MPI ranks, configured by a Fortran namelist file.";
const char* kLaunch = "mpirun -np 2 ddp_train inputs/fashion_mlp.nml";
// DDP_TRAIN_ROOT: the installation prefix, which `module load ddp_train` sets.
const char* kManual = "$DDP_TRAIN_ROOT/share/doc/ddp_train/docs/index.md";

// `text` in lines of at most `width` columns; the lines after the first start
// with `indent` spaces (the first is where the caller has put it).
std::string wrap(const std::string& text, std::size_t width, std::size_t indent) {
  std::istringstream words(text);
  std::string out, word;
  std::size_t column = indent;
  bool first = true;
  while (words >> word) {
    if (!first && column + 1 + word.size() > width) {
      out += "\n" + std::string(indent, ' ');
      column = indent;
      first = true;
    }
    if (!first) {
      out += ' ';
      ++column;
    }
    out += word;
    column += word.size();
    first = false;
  }
  return out;
}

std::string pad(const std::string& s, std::size_t width) {
  return s.size() < width ? s + std::string(width - s.size(), ' ') : s + "  ";
}

std::string usage_text() {
  std::ostringstream os;
  os << "usage: " << kSynopsis << "\n"
     << "       ddp_train --keys [--markdown] | --man | --kokkos-help | --version\n\n"
     << wrap(kPurpose, 79, 0) << "\nLaunch with srun or mpirun, e.g.  " << kLaunch << "\n\n";
  constexpr std::size_t kColumn = 21;
  for (const Item& o : kOptions) os << "  " << pad(o.tag, kColumn - 2) << wrap(o.text, 79, kColumn) << "\n";
  os << "\n" << wrap(std::string("The manual: ") + kManual + " and man ddp_train.", 79, 0) << "\n";
  return os.str();
}

// --- the key reference (config.hpp's key_reference) as text, Markdown and roff ---

// "required", "none" (an empty list) or the default value.
std::string default_of(const KeyDoc& k) {
  if (k.required) return "required";
  return k.default_value.empty() ? "none" : k.default_value;
}

std::string keys_text() {
  const std::vector<KeyDoc> keys = key_reference();
  std::size_t name_w = 4, type_w = 4, default_w = 7;
  for (const KeyDoc& k : keys) {
    name_w = std::max(name_w, k.name.size());
    type_w = std::max(type_w, k.type.size());
    if (default_of(k).size() <= 12) default_w = std::max(default_w, default_of(k).size());
  }
  std::ostringstream os;
  os << "The keys of the input file, set in their group (&train lr = 0.05 /) or on the\n"
        "command line (train.lr=0.05). ddp_train --keys --markdown: the same as a table.\n\n";
  os << pad("KEY", name_w + 2) << pad("TYPE", type_w + 2) << pad("DEFAULT", default_w + 2) << "RANGE\n";
  for (const KeyDoc& k : keys) {
    std::string line = pad(k.name, name_w + 2) + pad(k.type, type_w + 2) + pad(default_of(k), default_w + 2);
    // A range that would run past 79 columns gets a line of its own.
    const bool own_line = line.size() + k.range.size() > 79;
    line += own_line ? "" : k.range;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    os << line << "\n"
       << (own_line ? "    " + k.range + "\n" : "") << "    " << wrap(k.meaning, 79, 4) << "\n";
  }
  return os.str();
}

// A table cell: `|` would end it, `<` start an HTML tag, `*` emphasis.
std::string markdown_cell(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '|' || c == '<' || c == '*') out += '\\';
    out += c;
  }
  return out;
}

std::string code_cell(const std::string& s) { return s.empty() ? "" : "`" + s + "`"; }

std::string keys_markdown() {
  std::ostringstream os;
  os << "| Key | Type | Default | Range | Meaning |\n|---|---|---|---|---|\n";
  for (const KeyDoc& k : key_reference())
    os << "| `" << k.name << "` | " << k.type << " | "
       << (k.default_value.empty() ? default_of(k) : code_cell(k.default_value)) << " | "
       << code_cell(k.range) << " | " << markdown_cell(k.meaning) << " |\n";
  return os.str();
}

// Text for a roff line: a backslash is \e, a dash \- (a real minus, which a reader
// can copy into a shell); a leading '.' or '\'' would start a request.
std::string roff(const std::string& s) {
  std::string out = !s.empty() && (s[0] == '.' || s[0] == '\'') ? "\\&" : "";
  for (char c : s) {
    if (c == '\\')
      out += "\\e";
    else if (c == '-')
      out += "\\-";
    else
      out += c;
  }
  return out;
}

// A `.TP` paragraph: a bold tag, its text, and a second line when given.
void roff_item(std::ostringstream& os, const std::string& tag, const std::string& text,
               const std::string& more = "") {
  os << ".TP\n.B " << roff(tag) << "\n" << roff(text) << "\n";
  if (!more.empty()) os << ".br\n" << roff(more) << "\n";
}

// The example input of the DESCRIPTION.
const char* kExample[] = {
    "&data  train_files = 'data/fashion-mnist/train_*.h5',",
    "       val_files = 'data/fashion-mnist/test_*.h5' /",
    "&model layers = 'linear(256)', 'relu', 'linear(10)' /",
    "&train epochs = 10, batch_size = 64, optimizer = 'sgd', lr = 0.05 /",
    "&io    run_dir = 'runs/fashion_mlp' /",
};

const Item kExitStatus[] = {
    {"0", "the run finished, --check passed, or --evaluate measured"},
    {"1",
     "an error: in the input file, the data, the model or a checkpoint, or a rank that failed or hung; one "
     "line on standard error says which"},
    {"75",
     "stopped by SIGUSR1 or SIGTERM (a Slurm preemption or time limit) after writing a checkpoint: requeue "
     "the job (EX_TEMPFAIL), and the next run resumes from that checkpoint"},
};

// What a user may set; the test hooks (DDP_TEST_*, DDP_INJECT_FAULT) are left out.
const Item kEnvironment[] = {
    {"OMP_NUM_THREADS, DDP_DNNL_THREADS",
     "threads of oneDNN's GEMMs and convolutions in each rank (CPU build): 1 unless one of them is set (one "
     "rank per core); DDP_DNNL_THREADS wins"},
    {"DDP_CONV_LAYOUT=plain|nhwc",
     "oneDNN's convolutions on NCHW/OIHW, or on channels-last with the activations kept so, not on its "
     "blocked layouts (CPU build; nhwc tests the GPU's bf16 layout on the host)"},
    {"CUDA_VISIBLE_DEVICES",
     "the GPU of each rank (GPU build): the one device visible, else MPI's node-local rank modulo the devices"},
    {"NCCL_HOSTID",
     "the host NCCL takes a rank to be on: ranks share a GPU when they hold the same one on the same host (GPU "
     "build)"},
    {"DDP_MPI_CUDA_AWARE=0|1",
     "whether MPI takes device buffers (GPU build, comm.backend = 'mpi'); unset: MPI is asked"},
    {"DDP_CUDNN_NARROW=0",
     "bf16/fp16 convolutions on rounded operands in cuDNN's fp32 kernels, activations fp32 (the CPU build's "
     "arithmetic), not on cuDNN's bf16/fp16 tensor-core kernels with the activations channels-last (GPU "
     "build)"},
    {"DDP_CUDNN_LOG=1", "one line per convolution shape with the cuDNN algorithms chosen (GPU build)"},
    {"DDP_CUBLASLT_EPILOGUE=0",
     "a linear layer's bias, a transformer block's residual sums and its tanh GELU in passes of their own "
     "after a plain cuBLAS GEMM, not in cuBLASLt's epilogue (GPU build)"},
    {"DDP_CUBLASLT_LOG=1",
     "one line per GEMM shape, types, epilogue and alignments as it first runs on cuBLASLt or is declined, "
     "and why (GPU build)"},
    {"DDP_ELEMENT_WARPS=n",
     "warps (of 32 threads) a block of the element-wise kernels (batch norm, relu, pooling, the residual "
     "add) holds, 1 to 16; 8 unless set (GPU build)"},
    {"DDP_ELEMENT_VECTORS=0",
     "the element-wise kernels on channels-last or flat tensors load one element at a time, not 8 (16 bytes "
     "of bf16) where the channels are a multiple of 8; the results are the same (for measuring)"},
    {"DDP_BN_RELU_MASK=input",
     "batch norm's backward computes its fused relu's mask again from its input, bn(x) > 0, instead of "
     "reading its output (a third fewer bytes read; for measuring the two against each other)"},
    {"DDP_CUDNN_BENCHMARK=1",
     "the convolution algorithms cuDNN lists are run and timed per shape and the fastest deterministic one "
     "runs, not its heuristics' choice; runs may then not repeat bit for bit (GPU build)"},
    {"DDP_CUDNN_DETERMINISTIC=0",
     "cuDNN may run a nondeterministic convolution algorithm where it ranks first, as PyTorch's "
     "cudnn.benchmark does; runs and resumes then do not repeat bit for bit (GPU build)"},
    {"DDP_CUDNN_BATCHNORM=1",
     "batch norm's training passes on bf16/fp16 channels-last activations in cuDNN's batch norm, not in "
     "ddp_train's own kernels (GPU build)"},
};

const Item kFiles[] = {
    {"<run_dir>/metrics.jsonl",
     "one JSON object per line (epoch, step, train_loss, val_loss, val_acc, samples_per_s, world_size), "
     "appended by rank 0"},
    {"<run_dir>/checkpoints/ckpt_<step>.h5",
     "HDF5 checkpoints (the model in PyTorch's names and layouts, the optimizer, the training position); the "
     "newest io.keep_checkpoints are kept"},
    {"<run_dir>/checkpoints/latest",
     "the name of the newest complete checkpoint, where io.resume = 'auto' starts"},
    {"<run_dir>/tb, <run_dir>/trace", "TensorBoard scalars (io.tensorboard) and timelines (io.trace)"},
    {"$DDP_TRAIN_ROOT/share/ddp_train/inputs, jobs", "ready input files and Slurm job templates"},
};

std::string man_page() {
  std::ostringstream os;
  os << ".TH DDP_TRAIN 1 \"\" \"ddp_train " << DDP_VERSION << "\" \"User Commands\"\n"
     << ".\\\" Generated by ddp_train --man from its option and key tables: do not edit.\n"
     << ".nh\n.ad l\n"  // no hyphenation, ragged right: option and key names stay whole
     << ".SH NAME\nddp_train \\- data\\-parallel neural\\-network training on MPI ranks\n"
     << ".SH SYNOPSIS\n"
     << ".B srun ddp_train\n"
     << roff("[options] input.nml [group.key=value ...]") << "\n.br\n"
     << ".B mpirun \\-np \\fIN\\fB ddp_train\n"
     << roff("[options] input.nml [group.key=value ...]") << "\n.br\n"
     << ".B ddp_train\n"
     << roff("--keys [--markdown] | --man | --kokkos-help | --help | --version") << "\n"
     << ".SH DESCRIPTION\n"
     << roff(
            "ddp_train trains a neural network on MPI ranks, data-parallel as PyTorch's "
            "DistributedDataParallel: "
            "every rank holds the whole model and a share of each batch, and the gradients are averaged "
            "across the ranks at every step. It is launched by srun or mpirun, one rank per core or per GPU, "
            "and configured by an input file, a Fortran namelist with the groups &data, &model, &train, &io "
            "and &comm (INPUT KEYS below), e.g.")
     << "\n.PP\n.RS\n.nf\n";
  for (const char* line : kExample) os << roff(line) << "\n";
  os << ".fi\n.RE\n.PP\n"
     << roff(
            "Rank 0 prints the resolved input, progress lines and the validation results, and appends them "
            "to <run_dir>/metrics.jsonl; checkpoints go to <run_dir>/checkpoints, and a run started again "
            "resumes from the latest. An error is reported in one line, and every rank exits.")
     << "\n.SH OPTIONS\n";
  for (const Item& o : kOptions) roff_item(os, o.tag, o.text);

  os << ".SH INPUT KEYS\n"
     << roff(
            "Each key is set in its group of the input file (&train lr = 0.05 /) or on the command line "
            "(train.lr=0.05). Logicals are T or F; strings are quoted in the file, not on the command line; "
            "lists are comma-separated. An unknown key, a wrong type or a value out of range is an error "
            "naming the file and line.")
     << "\n";
  std::string group;
  for (const KeyDoc& k : key_reference()) {
    const std::string g = k.name.substr(0, k.name.find('.'));
    if (g != group) os << ".SS &" << (group = g) << "\n";
    std::string what = k.type + (k.required ? ", required" : ", default " + default_of(k));
    if (!k.range.empty()) what += ", " + k.range;
    roff_item(os, k.name, what, k.meaning);
  }

  os << ".SH EXIT STATUS\n";
  for (const Item& i : kExitStatus) roff_item(os, i.tag, i.text);
  os << ".SH ENVIRONMENT\n";
  for (const Item& i : kEnvironment) roff_item(os, i.tag, i.text);
  os << ".SH FILES\n";
  for (const Item& i : kFiles) roff_item(os, i.tag, i.text);
  os << ".SH SEE ALSO\n"
     << roff(std::string("The manual: ") + kManual +
             ", and $DDP_TRAIN_ROOT/share/doc/ddp_train/README.md "
             "($DDP_TRAIN_ROOT: the installation prefix, which module load ddp_train sets).")
     << "\n.PP\n.BR mpirun (1),\n.BR srun (1),\n.BR sbatch (1)\n";
  return os.str();
}

void print_rank0(const Context& ctx, const std::string& text) {
  if (ctx.rank() == 0) std::fputs(text.c_str(), stdout);
}

}  // namespace

CommandLine parse_command_line(Context& ctx, int argc, char** argv) {
  CommandLine cli;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      print_rank0(ctx, usage_text());
      cli.exit_now = true;
      return cli;
    }
  }
  bool version = false, keys = false, markdown = false, man = false, kokkos_help = false;
  std::string problem;
  for (int i = 1; i < argc && problem.empty(); ++i) {
    const std::string arg = argv[i];
    if (arg == "--version") {
      version = true;
    } else if (arg == "--keys") {
      keys = true;
    } else if (arg == "--markdown") {
      markdown = true;
    } else if (arg == "--man") {
      man = true;
    } else if (arg == "--kokkos-help") {
      kokkos_help = true;
    } else if (arg.rfind("--kokkos-", 0) == 0) {
      // Kokkos's, taken out of argv by Context::start_kokkos
    } else if (arg == "--check") {
      cli.check = true;
    } else if (arg == "--evaluate") {
      cli.evaluate = true;
    } else if (arg == "--trace") {
      cli.overrides.push_back("io.trace=T");
    } else if (arg.rfind("-", 0) == 0) {
      problem = "unknown option '" + arg + "' (ddp_train --help lists the options)";
    } else if (cli.input_file.empty() && arg.find('=') == std::string::npos) {
      cli.input_file = arg;
    } else if (arg.find('=') != std::string::npos) {
      cli.overrides.push_back(arg);
    } else {
      problem = "unexpected argument '" + arg + "' (overrides look like group.key=value)";
    }
  }
  if (problem.empty() && markdown && !keys)
    problem = "--markdown goes with --keys: ddp_train --keys --markdown";
  if (problem.empty() && cli.check && cli.evaluate)
    problem = "--check and --evaluate go one at a time: --check checks what a run or --evaluate would read";
  if (!problem.empty()) fatal_all(ctx.world(), problem);

  cli.exit_now = true;
  if (version) {
    print_rank0(ctx, version_text());
  } else if (keys) {
    print_rank0(ctx, markdown ? keys_markdown() : keys_text());
  } else if (man) {
    print_rank0(ctx, man_page());
  } else if (kokkos_help) {
    // Kokkos prints its options as Kokkos::initialize reads them, on rank 0 alone.
    if (ctx.rank() == 0) {
      std::string flag = "--kokkos-help";
      char* args[] = {argv[0], flag.data(), nullptr};
      int n = 2;
      char** p = args;
      ctx.start_kokkos(n, p);
    }
  } else if (cli.input_file.empty()) {
    fatal_all(ctx.world(), std::string("no input file given (usage: ") + kSynopsis + "; ddp_train --help)");
  } else {
    cli.exit_now = false;
  }
  return cli;
}

}  // namespace ddp
