#include "train/config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>
#include <type_traits>
#include <variant>

#include "comm/check.hpp"
#include "io/checkpoint.hpp"
#include "io/namelist.hpp"
#include "train/augment.hpp"

namespace ddp {
namespace {

using nml::Kind;
using nml::Value;

// Where a key's value lives; the alternative held is the key's type.
using Field = std::variant<int*, std::int64_t*, double*, bool*, std::string*, std::vector<std::string>*,
                           std::vector<double>*, std::vector<std::int64_t>*>;

template <auto Group, auto Member>
Field field(Config& c) {
  return &((c.*Group).*Member);
}

// What a key accepts beyond its type: numbers (each element of a real list too)
// within [lo, hi], ends open where flagged; strings among `choices`; lists of `count`.
struct Rule {
  double lo = -HUGE_VAL;
  bool lo_open = false;
  double hi = HUGE_VAL;
  bool hi_open = false;
  std::vector<std::string> choices;
  std::size_t count = 0;  // 0: any length
};

Rule any() { return {}; }
Rule at_least(double lo) {
  Rule r;
  r.lo = lo;
  return r;
}
Rule above(double lo) {
  Rule r = at_least(lo);
  r.lo_open = true;
  return r;
}
Rule unit_interval() {  // [0, 1)
  Rule r = at_least(0.0);
  r.hi = 1.0;
  r.hi_open = true;
  return r;
}
Rule between(double lo, double hi) {  // [lo, hi]
  Rule r = at_least(lo);
  r.hi = hi;
  return r;
}
Rule one_of(std::vector<std::string> choices) {
  Rule r;
  r.choices = std::move(choices);
  return r;
}
Rule pair_in_unit_interval() {
  Rule r = unit_interval();
  r.count = 2;
  return r;
}
Rule pair_at_least(double lo) {
  Rule r = at_least(lo);
  r.count = 2;
  return r;
}

struct Key {
  const char* group;
  const char* name;
  Field (*field)(Config&);
  Rule rule;
  bool required;
  const char* doc;
};

// Every key of the input file, in the order to_namelist() writes them.
const std::vector<Key>& keys() {
  using C = Config;
  using D = DataConfig;
  using M = ModelConfig;
  using T = TrainConfig;
  using I = IoConfig;
  using K = CommConfig;
  static const std::vector<Key> table = {
      {"data", "train_files", field<&C::data, &D::train_files>, any(), true,
       "HDF5 shard globs of the training set"},
      {"data", "val_files", field<&C::data, &D::val_files>, any(), false,
       "HDF5 shard globs of the validation set; empty: no validation"},
      {"data", "mode", field<&C::data, &D::mode>, one_of({"auto", "preload", "stream"}), false,
       "preload into memory, stream from disk, or auto by size"},
      {"data", "preload_budget_mb", field<&C::data, &D::preload_budget_mb>, at_least(0), false,
       "auto: preload when the training and validation sets together fit in this many MB"},
      {"data", "preload_shared", field<&C::data, &D::preload_shared>, any(), false,
       "a preloaded set is held once per node in shared memory (/dev/shm), read by the node's ranks; F: a "
       "copy "
       "on every rank"},
      {"data", "prefetch_batches", field<&C::data, &D::prefetch_batches>, at_least(0), false,
       "batches read ahead by the prefetch thread: streamed, or preloaded batches of 1 MiB or more"},
      {"data", "shuffle", field<&C::data, &D::shuffle>, any(), false,
       "reshuffle every epoch (seeded by seed + epoch)"},
      {"data", "drop_last", field<&C::data, &D::drop_last>, any(), false,
       "drop the tail instead of padding it to a multiple of the world size"},
      {"data", "image_size", field<&C::data, &D::image_size>, at_least(0), false,
       "uint8 images: side the model sees (centre crop, or random_resized_crop's output); 0: as stored"},
      {"data", "augment", field<&C::data, &D::augment>, any(), false,
       "uint8 images, training batches: 'flip', 'crop(pad=4)', 'random_resized_crop(scale=0.08,1)'"},
      {"data", "normalize", field<&C::data, &D::normalize>, any(), false,
       "uint8 images: mean of each channel, then std of each channel: (x/255 - mean) / std"},
      {"data", "seq_len", field<&C::data, &D::seq_len>, at_least(0), false,
       "token shards (/tokens): tokens per sample, each sample the window of seq_len + 1 tokens from i "
       "seq_len "
       "(inputs, then targets shifted by one); 0: shards of /x and /y"},
      {"model", "layers", field<&C::model, &M::layers>, any(), true,
       "layer list, e.g. 'linear(256)', 'relu', 'linear(10)'"},
      {"model", "loss", field<&C::model, &M::loss>, one_of({"auto", "cross_entropy", "mse"}), false,
       "auto: cross_entropy for integer labels, mse for float targets"},
      {"train", "epochs", field<&C::train, &T::epochs>, at_least(1), false, "passes over the training set"},
      {"train", "batch_size", field<&C::train, &T::batch_size>, at_least(1), false,
       "samples per rank per micro-step"},
      {"train", "accumulation_steps", field<&C::train, &T::accumulation_steps>, at_least(1), false,
       "micro-steps per optimizer step"},
      {"train", "precision", field<&C::train, &T::precision>, one_of({"fp32", "bf16", "fp16"}), false,
       "GEMM/convolution operands; weights, gradients, optimizer stay fp32"},
      {"train", "tf32", field<&C::train, &T::tf32>, any(), false,
       "GPU build, train.precision = 'fp32': the convolutions and GEMMs may run on TF32 tensor cores "
       "(operands rounded to a 10-bit mantissa, fp32 sums; Ampere or newer), as PyTorch's allow_tf32; "
       "F: true fp32"},
      {"train", "loss_scale", field<&C::train, &T::loss_scale>, above(0), false,
       "fp16: initial loss scale; halved on overflow (step skipped)"},
      {"train", "loss_scale_growth_interval", field<&C::train, &T::loss_scale_growth_interval>, at_least(1),
       false, "fp16: clean steps after which the loss scale doubles"},
      {"train", "optimizer", field<&C::train, &T::optimizer>, one_of({"sgd", "adamw"}), false,
       "update rule, as torch.optim"},
      {"train", "lr", field<&C::train, &T::lr>, above(0), false, "peak learning rate"},
      {"train", "momentum", field<&C::train, &T::momentum>, unit_interval(), false, "sgd: momentum factor"},
      {"train", "nesterov", field<&C::train, &T::nesterov>, any(), false,
       "sgd: Nesterov momentum (needs momentum > 0)"},
      {"train", "weight_decay", field<&C::train, &T::weight_decay>, at_least(0), false,
       "sgd: L2 added to the gradient; adamw: decoupled"},
      {"train", "decay_norm_and_bias", field<&C::train, &T::decay_norm_and_bias>, any(), false,
       "weight decay also on batch-norm parameters and biases (1-D tensors); F: on weights only"},
      {"train", "label_smoothing", field<&C::train, &T::label_smoothing>, unit_interval(), false,
       "cross_entropy: target (1 - s) on the label + s / classes on every class, as PyTorch's"},
      {"train", "betas", field<&C::train, &T::betas>, pair_in_unit_interval(), false,
       "adamw: decay rates of the moment estimates"},
      {"train", "eps", field<&C::train, &T::eps>, above(0), false, "adamw: added to the denominator"},
      {"train", "schedule", field<&C::train, &T::schedule>,
       one_of({"constant", "step", "multistep", "cosine", "plateau"}), false,
       "learning-rate schedule after warm-up"},
      {"train", "warmup_steps", field<&C::train, &T::warmup_steps>, at_least(0), false,
       "optimizer steps of linear warm-up"},
      {"train", "step_epochs", field<&C::train, &T::step_epochs>, at_least(1), false,
       "step: epochs between decays"},
      {"train", "milestones", field<&C::train, &T::milestones>, at_least(1), false,
       "multistep: lr is multiplied by gamma once more after each of these numbers of epochs (PyTorch's "
       "MultiStepLR milestones); increasing"},
      {"train", "gamma", field<&C::train, &T::gamma>, above(0), false,
       "step, multistep: decay factor; plateau: the factor of each reduction (< 1)"},
      {"train", "min_lr", field<&C::train, &T::min_lr>, at_least(0), false,
       "cosine: final learning rate; plateau: the rate is not reduced below it"},
      {"train", "plateau_metric", field<&C::train, &T::plateau_metric>,
       one_of({"val_loss", "val_acc", "val_acc5"}), false,
       "plateau: the validation metric whose stalling reduces the rate (val_loss lowest, accuracies "
       "highest)"},
      {"train", "plateau_patience", field<&C::train, &T::plateau_patience>, at_least(0), false,
       "plateau: epochs without a better plateau_metric that pass; the next one without multiplies lr by "
       "gamma"},
      {"train", "plateau_threshold", field<&C::train, &T::plateau_threshold>, unit_interval(), false,
       "plateau: an epoch is better where it beats the best by more than this fraction of it"},
      {"train", "plateau_cooldown", field<&C::train, &T::plateau_cooldown>, at_least(0), false,
       "plateau: epochs after a reduction that count neither way"},
      {"train", "seed", field<&C::train, &T::seed>, any(), false,
       "initialisation, sampler permutation, dropout"},
      {"train", "log_every", field<&C::train, &T::log_every>, at_least(0), false,
       "optimizer steps between progress lines; 0: none"},
      {"train", "nonfinite", field<&C::train, &T::nonfinite>, one_of({"stop", "skip"}), false,
       "a non-finite loss or gradient (fp32, bf16): stop the run, or skip the step on every rank"},
      {"train", "patience", field<&C::train, &T::patience>, at_least(0), false,
       "early stopping: the run ends after this many epochs without a better io.keep_best metric; 0: off"},
      {"train", "min_delta", field<&C::train, &T::min_delta>, at_least(0), false,
       "early stopping: an epoch counts as better only where it beats the last that did by more than this"},
      {"train", "clip_grad_norm", field<&C::train, &T::clip_grad_norm>, at_least(0), false,
       "max total 2-norm of the averaged gradients, as torch.nn.utils.clip_grad_norm_; 0: off"},
      {"train", "cuda_graph", field<&C::train, &T::cuda_graph>, one_of({"off", "auto", "on"}), false,
       "GPU build: the step's forward, loss, backward and NCCL buckets as one CUDA graph, replayed; "
       "auto: where it can; on: an error where it cannot"},
      {"io", "run_dir", field<&C::io, &I::run_dir>, any(), false,
       "directory of metrics.jsonl and checkpoints/, held by one run at a time (its ddp_train.lock)"},
      {"io", "checkpoint_every", field<&C::io, &I::checkpoint_every>, at_least(0), false,
       "epochs between checkpoints; 0: none by epoch"},
      {"io", "checkpoint_every_steps", field<&C::io, &I::checkpoint_every_steps>, at_least(0), false,
       "optimizer steps between checkpoints; 0: none by step"},
      {"io", "checkpoint_every_minutes", field<&C::io, &I::checkpoint_every_minutes>, at_least(0), false,
       "minutes between checkpoints; 0: none by time"},
      {"io", "keep_checkpoints", field<&C::io, &I::keep_checkpoints>, at_least(1), false,
       "checkpoints kept in <run_dir>/checkpoints, newest first"},
      {"io", "keep_best", field<&C::io, &I::keep_best>, one_of(best_metric_names()), false,
       "also keep the checkpoint of the best validation so far (val_loss lowest; val_acc, val_acc5 highest) "
       "as <run_dir>/checkpoints/best.h5; an epoch that beats it is checkpointed"},
      {"io", "checkpoint_async", field<&C::io, &I::checkpoint_async>, any(), false,
       "rank 0 puts each checkpoint on disk on a thread while the ranks train on (made in memory first); "
       "the run's last checkpoint and a preemption's are on disk before it ends"},
      {"io", "resume", field<&C::io, &I::resume>, any(), false,
       "'auto': from run_dir's latest valid checkpoint; 'never'; or a checkpoint file"},
      {"io", "init_from", field<&C::io, &I::init_from>, any(), false,
       "checkpoint whose weights start a new run; '': none"},
      {"io", "allow_data_change", field<&C::io, &I::allow_data_change>, any(), false,
       "resume although the training set's sample count changed since the checkpoint"},
      {"io", "trace_samples", field<&C::io, &I::trace_samples>, any(), false,
       "debug: write each rank's trained sample indices to run_dir"},
      {"io", "sample_tokens", field<&C::io, &I::sample_tokens>, at_least(0), false,
       "token shards: after each validation the model continues the validation set's first half window "
       "by this many tokens, printed and appended to run_dir/samples.txt; 0: none"},
      {"io", "sample_temperature", field<&C::io, &I::sample_temperature>, at_least(0), false,
       "io.sample_tokens: the softmax temperature of each drawn token; 0: the most likely one"},
      {"io", "tensorboard", field<&C::io, &I::tensorboard>, any(), false,
       "TensorBoard scalars in run_dir/tb (tensorboard --logdir); F by default without protobuf"},
      {"io", "trace", field<&C::io, &I::trace>, any(), false,
       "timeline of trace_steps per rank in run_dir/trace (Perfetto; tools/merge_traces); also --trace"},
      {"io", "trace_steps", field<&C::io, &I::trace_steps>, pair_at_least(1), false,
       "first and last optimizer step of the timeline"},
      {"comm", "backend", field<&C::comm, &K::backend>, one_of({"auto", "mpi", "nccl"}), false,
       "collectives: auto (NCCL with GPUs, else MPI), mpi or nccl"},
      {"comm", "overlap", field<&C::comm, &K::overlap>, one_of({"poll", "thread", "none"}), false,
       "all-reduce buckets during backward, progressed by polling or a thread; none: after"},
      {"comm", "shared_memory", field<&C::comm, &K::shared_memory>, any(), false,
       "gradients summed in a shared-memory window, not by MPI_Allreduce, where every rank is on one node "
       "and gradients are in host memory (with comm.overlap = 'poll' or 'thread')"},
      {"comm", "zero", field<&C::comm, &K::zero>, between(0, 2), false,
       "ZeRO stage: 0 every rank keeps the whole optimizer state; 1 each keeps and updates its 1/W share, "
       "parameters all-gathered; 2 also gradients reduce-scattered to the shares"},
      {"comm", "bucket_mb", field<&C::comm, &K::bucket_mb>, above(0), false, "gradient bucket size in MB"},
      {"comm", "first_bucket_mb", field<&C::comm, &K::first_bucket_mb>, above(0), false,
       "size of the first bucket (the last layers), in MB"},
      {"comm", "timeout_s", field<&C::comm, &K::timeout_s>, at_least(0), false,
       "seconds in one collective before the watchdog names the missing ranks and aborts (a rank reading or "
       "writing files is waited for while it moves on); 0: no watchdog"},
      {"comm", "check_every", field<&C::comm, &K::check_every>, at_least(0), false,
       "steps between checks that every rank holds the same parameters (also before every checkpoint); 0: "
       "only at checkpoints"},
  };
  return table;
}

const std::vector<std::string> kGroups = {"data", "model", "train", "io", "comm"};

// Edit distance counting a swap of neighbours as one edit (optimal string alignment).
std::size_t distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// "; did you mean 'x'?" for the closest candidate, or "" when none is close.
std::string suggestion(const std::string& name, const std::vector<std::string>& candidates,
                       const std::string& prefix = "") {
  const std::size_t limit = name.size() <= 3 ? 1 : 2;
  std::string best;
  std::size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    std::size_t d = distance(name, c);
    if (d < best_d) {
      best = c;
      best_d = d;
    }
  }
  if (best.empty() && name.size() >= 3)
    for (const auto& c : candidates)
      if (c.rfind(name, 0) == 0 || name.rfind(c, 0) == 0) {
        best = c;
        break;
      }
  return best.empty() ? "" : "; did you mean '" + prefix + best + "'?";
}

// Where an assignment came from, for its error messages.
struct Site {
  std::string where;  // "inputs/x.nml:4" | "command line"
  std::string name;   // "train.lr"
  std::string shown;  // "train.lr = 0" | "train.lr=0" (the override as given)
  bool cli = false;

  [[noreturn]] void value_error(const std::string& what) const {
    throw InputError(where + ": " + shown + ": " + what);
  }
  [[noreturn]] void type_error(const std::string& expected, const std::string& got) const {
    if (cli) throw InputError(where + ": " + shown + ": expected " + expected);
    throw InputError(where + ": " + name + ": expected " + expected + ", got " + got);
  }
};

std::string format_number(double x) {
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof buf, x);  // shortest text that reads back exactly
  return std::string(buf, res.ptr);
}

std::string describe(const Rule& r) {
  const bool lo = std::isfinite(r.lo), hi = std::isfinite(r.hi);
  if (lo && hi)
    return std::string("in ") + (r.lo_open ? "(" : "[") + format_number(r.lo) + ", " + format_number(r.hi) +
           (r.hi_open ? ")" : "]");
  if (lo) return (r.lo_open ? "> " : ">= ") + format_number(r.lo);
  return (r.hi_open ? "< " : "<= ") + format_number(r.hi);
}

// "one of 'sgd', 'adamw'": a string key's choices, in errors and in the reference.
std::string choices_text(const std::vector<std::string>& choices) {
  std::string s;
  for (const auto& c : choices) s += (s.empty() ? "one of '" : ", '") + c + "'";
  return s;
}

void check_range(double x, const Rule& r, const Site& site, const char* subject = "must be") {
  const bool low = r.lo_open ? !(x > r.lo) : !(x >= r.lo);
  const bool high = r.hi_open ? !(x < r.hi) : !(x <= r.hi);
  if (low || high) site.value_error(std::string(subject) + " " + describe(r));
}

const Value& single(const std::vector<Value>& vs, const Site& site, const char* expected) {
  if (vs.size() != 1)
    site.type_error(expected, vs.empty() ? "no value" : std::to_string(vs.size()) + " values");
  return vs[0];
}

bool is_number(const Value& v) { return v.kind == Kind::Int || v.kind == Kind::Real; }

// One overload per field type: type check, range check, store.
void store(int& out, const std::vector<Value>& vs, const Rule& r, const Site& site) {
  const Value& v = single(vs, site, "an integer");
  if (v.kind != Kind::Int) site.type_error("an integer", v.text);
  if (v.i < std::numeric_limits<int>::min() || v.i > std::numeric_limits<int>::max())
    site.value_error("out of range for a 32-bit integer");
  check_range(static_cast<double>(v.i), r, site);
  out = static_cast<int>(v.i);
}

void store(std::int64_t& out, const std::vector<Value>& vs, const Rule& r, const Site& site) {
  const Value& v = single(vs, site, "an integer");
  if (v.kind != Kind::Int) site.type_error("an integer", v.text);
  check_range(static_cast<double>(v.i), r, site);
  out = v.i;
}

void store(double& out, const std::vector<Value>& vs, const Rule& r, const Site& site) {
  const Value& v = single(vs, site, "a real");
  if (!is_number(v)) site.type_error("a real", v.text);
  check_range(v.r, r, site);
  out = v.r;
}

void store(bool& out, const std::vector<Value>& vs, const Rule&, const Site& site) {
  const Value& v = single(vs, site, "a logical");
  if (v.kind != Kind::Logical) site.type_error("a logical", v.text);
  out = v.b;
}

void store(std::string& out, const std::vector<Value>& vs, const Rule& r, const Site& site) {
  const Value& v = single(vs, site, "a string");
  if (v.kind != Kind::String) site.type_error("a string", v.text);
  if (!r.choices.empty() && std::find(r.choices.begin(), r.choices.end(), v.s) == r.choices.end())
    site.value_error("expected " + choices_text(r.choices));
  out = v.s;
}

void store(std::vector<std::string>& out, const std::vector<Value>& vs, const Rule&, const Site& site) {
  std::vector<std::string> list;
  for (const Value& v : vs) {
    if (v.kind != Kind::String) site.type_error("a list of strings", v.text);
    if (v.s.empty()) site.value_error("empty item in the list");
    list.push_back(v.s);
  }
  out = std::move(list);
}

// Lists of numbers (train.betas, io.trace_steps): each element typed and in range.
template <class T>
void store(std::vector<T>& out, const std::vector<Value>& vs, const Rule& r, const Site& site) {
  constexpr bool integers = std::is_integral_v<T>;
  if (r.count != 0 && vs.size() != r.count)
    site.value_error("expected " + std::to_string(r.count) + " values, got " + std::to_string(vs.size()));
  std::vector<T> list;
  for (const Value& v : vs) {
    if (integers ? v.kind != Kind::Int : !is_number(v))
      site.type_error(integers ? "a list of integers" : "a list of reals", v.text);
    const double x = integers ? static_cast<double>(v.i) : v.r;
    check_range(x, r, site, "every value must be");
    list.push_back(integers ? static_cast<T>(v.i) : static_cast<T>(v.r));
  }
  out = std::move(list);
}

std::string join_texts(const std::vector<Value>& vs) {
  std::string s;
  for (const Value& v : vs) s += (s.empty() ? "" : ", ") + v.text;
  return s;
}

// Index of (group, key) in the key table, or -1.
int find_key(const std::string& group, const std::string& name) {
  const auto& ks = keys();
  for (std::size_t k = 0; k < ks.size(); ++k)
    if (group == ks[k].group && name == ks[k].name) return static_cast<int>(k);
  return -1;
}

std::vector<std::string> key_names(const std::string& group) {
  std::vector<std::string> names;
  for (const Key& k : keys())
    if (group == k.group) names.push_back(k.name);
  return names;
}

// Overrides are typed by the field: string fields take their text unquoted,
// string lists split at top-level commas, everything else the namelist value grammar.
std::vector<Value> override_values(const std::string& text, const Field& f) {
  if (std::holds_alternative<std::string*>(f)) {
    Value v;
    v.text = text;
    v.s = nml::unquote(text).value_or(text);
    return {v};
  }
  const bool strings = std::holds_alternative<std::vector<std::string>*>(f);
  std::vector<Value> vs;
  for (const std::string& piece : nml::split_list(text)) {
    auto lit = strings ? std::nullopt : nml::parse_literal(piece);
    if (lit) {
      vs.push_back(*lit);
    } else {
      Value v;  // a string; a numeric field then reports the type error
      v.text = piece;
      v.s = nml::unquote(piece).value_or(piece);
      vs.push_back(v);
    }
  }
  return vs;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Namelist text of a field's current value; "" for an empty list.
struct FieldText {
  std::string operator()(const int* x) const { return std::to_string(*x); }
  std::string operator()(const std::int64_t* x) const { return std::to_string(*x); }
  std::string operator()(const double* x) const {
    std::string s = format_number(*x);
    // keep it a real literal so the echo reads as the type it is
    return s.find_first_of(".e") == std::string::npos ? s + ".0" : s;
  }
  std::string operator()(const bool* x) const { return *x ? ".true." : ".false."; }
  std::string operator()(const std::string* x) const { return nml::quote(*x); }
  std::string operator()(const std::vector<std::string>* x) const {
    std::string s;
    for (const auto& e : *x) s += (s.empty() ? "" : ", ") + nml::quote(e);
    return s;
  }
  template <class T>
  std::string operator()(const std::vector<T>* x) const {  // numbers, each as its scalar is written
    std::string s;
    for (const T& e : *x) s += (s.empty() ? "" : ", ") + (*this)(&e);
    return s;
  }
};

std::string format_field(const Field& f) { return std::visit(FieldText{}, f); }

// A key's type as the user writes its value.
struct TypeName {
  std::string operator()(const int*) const { return "integer"; }
  std::string operator()(const std::int64_t*) const { return "integer"; }
  std::string operator()(const double*) const { return "real"; }
  std::string operator()(const bool*) const { return "logical (T/F)"; }
  std::string operator()(const std::string*) const { return "string"; }
  std::string operator()(const std::vector<std::string>*) const { return "list of strings"; }
  std::string operator()(const std::vector<double>*) const { return "list of reals"; }
  std::string operator()(const std::vector<std::int64_t>*) const { return "list of integers"; }
};

bool is_list(const Field& f) {
  return std::holds_alternative<std::vector<std::string>*>(f) ||
         std::holds_alternative<std::vector<double>*>(f) ||
         std::holds_alternative<std::vector<std::int64_t>*>(f);
}

// What a key's rule accepts, in words: "> 0", "[0, 1)", "one of 'sgd', 'adamw'",
// "2 values, each in [0, 1)"; "" when the type alone says it.
std::string range_text(const Rule& r, const Field& f) {
  if (!r.choices.empty()) return choices_text(r.choices);
  const std::string range = std::isfinite(r.lo) || std::isfinite(r.hi) ? describe(r) : "";  // "in [0, 1)"
  if (r.count != 0) return std::to_string(r.count) + " values" + (range.empty() ? "" : ", each " + range);
  if (is_list(f) && !range.empty()) return "each " + range;
  return range.rfind("in ", 0) == 0 ? range.substr(3) : range;
}

// A default as the reference shows it: as the input file would write it, logicals
// as T/F, an empty list as "". A default that depends on how ddp_train was built
// is stated as its rule, so that the reference, and docs/input.md, fit every build.
std::string default_text(const Key& k, const Field& f) {
  if (std::string(k.group) == "io" && std::string(k.name) == "tensorboard")  // kTensorBoardBuilt
    return "T (F without protobuf)";
  if (const bool* const* b = std::get_if<bool*>(&f)) return **b ? "T" : "F";
  return format_field(f);
}

}  // namespace

Config parse_config(const std::string& text, const std::string& path,
                    const std::vector<std::string>& overrides) {
  Config cfg;
  cfg.source_path = path;
  cfg.source_text = text;
  const auto& ks = keys();
  std::vector<Site> set_by(ks.size());  // last assignment of each key; where empty: default

  auto assign = [&](int k, const std::vector<Value>& vs, const Site& site) {
    std::visit([&](auto* p) { store(*p, vs, ks[k].rule, site); }, ks[k].field(cfg));
    set_by[k] = site;
  };

  std::vector<const nml::Group*> seen;
  for (const nml::Group& g : nml::parse(text, path)) {
    const std::string where = path + ":" + std::to_string(g.line);
    if (std::find(kGroups.begin(), kGroups.end(), g.name) == kGroups.end())
      throw InputError(where + ": unknown group '&" + g.name + "'" + suggestion(g.name, kGroups, "&"));
    for (const nml::Group* other : seen)
      if (other->name == g.name)
        throw InputError(where + ": duplicate group &" + g.name + " (first at line " +
                         std::to_string(other->line) + ")");
    seen.push_back(&g);
    for (const nml::Entry& e : g.entries) {
      const std::string at = path + ":" + std::to_string(e.line);
      const int k = find_key(g.name, e.key);
      if (k < 0)
        throw InputError(at + ": unknown key '" + e.key + "' in &" + g.name +
                         suggestion(e.key, key_names(g.name)));
      const std::string name = g.name + "." + e.key;
      assign(k, e.values, Site{at, name, name + " = " + join_texts(e.values), false});
    }
  }

  for (const std::string& o : overrides) {
    const std::string where = "command line";
    const auto eq = o.find('=');
    const auto dot = o.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot > eq)
      throw InputError(where + ": " + o + ": expected group.key=value");
    const std::string group = lower(nml::trim(o.substr(0, dot)));
    const std::string key = lower(nml::trim(o.substr(dot + 1, eq - dot - 1)));
    if (std::find(kGroups.begin(), kGroups.end(), group) == kGroups.end())
      throw InputError(where + ": " + o + ": unknown group '" + group + "'" + suggestion(group, kGroups));
    const int k = find_key(group, key);
    if (k < 0)
      throw InputError(where + ": " + o + ": unknown key '" + key + "' in &" + group +
                       suggestion(key, key_names(group)));
    const Site site{where, group + "." + key, o, true};
    const std::vector<Value> vs = override_values(nml::trim(o.substr(eq + 1)), ks[k].field(cfg));
    if (ks[k].required && vs.empty()) site.value_error("must not be empty");
    assign(k, vs, site);
  }

  for (std::size_t k = 0; k < ks.size(); ++k)
    if (ks[k].required && set_by[k].where.empty())
      throw InputError(path + ": &" + ks[k].group + " " + ks[k].name + " is required");

  // Checks across keys, once every value is final.
  try {
    parse_augment(cfg.data.augment);
  } catch (const InputError& e) {
    set_by[find_key("data", "augment")].value_error(e.what());
  }
  const std::vector<double>& norm = cfg.data.normalize;
  if (norm.size() % 2 != 0)
    set_by[find_key("data", "normalize")].value_error(
        std::to_string(norm.size()) + " values; expected a mean per channel, then a std per channel");
  for (std::size_t i = norm.size() / 2; i < norm.size(); ++i)
    if (!(norm[i] > 0))
      set_by[find_key("data", "normalize")].value_error("std " + format_number(norm[i]) + " (value " +
                                                        std::to_string(i + 1) + ") must be > 0");
  const TrainConfig& t = cfg.train;
  if (t.nesterov && t.momentum <= 0)
    set_by[find_key("train", "nesterov")].value_error("needs train.momentum > 0");
  if (cfg.io.resume.empty())
    set_by[find_key("io", "resume")].value_error("expected 'auto', 'never' or a checkpoint file");
  if (t.patience > 0 && cfg.io.keep_best == "none")
    set_by[find_key("train", "patience")].value_error(
        "needs io.keep_best, the validation metric whose improvement it waits for");
  if (t.min_delta > 0 && t.patience == 0)
    set_by[find_key("train", "min_delta")].value_error("needs train.patience, the early stopping it tunes");
  if (cfg.io.keep_best != "none" && cfg.data.val_files.empty())
    set_by[find_key("io", "keep_best")].value_error(
        "needs data.val_files (the best checkpoint is chosen by validation)");
  if (cfg.io.sample_tokens > 0 && (cfg.data.val_files.empty() || cfg.data.seq_len == 0))
    set_by[find_key("io", "sample_tokens")].value_error(
        "needs token shards (data.seq_len) with data.val_files: the prompt is the validation set's first "
        "window");
  if (cfg.io.tensorboard && !kTensorBoardBuilt)
    set_by[find_key("io", "tensorboard")].value_error(
        "this ddp_train was built without protobuf (apt-get install libprotobuf-dev protobuf-compiler, "
        "then configure again); set io.tensorboard = F");
  if (cfg.io.trace_steps[0] > cfg.io.trace_steps[1])
    set_by[find_key("io", "trace_steps")].value_error("the first step must not come after the last");
  if (t.schedule == "multistep" && t.milestones.empty())
    set_by[find_key("train", "schedule")].value_error(
        "needs train.milestones, the epoch counts after which lr is multiplied by train.gamma");
  if (t.schedule != "multistep" && !t.milestones.empty())
    set_by[find_key("train", "milestones")].value_error(
        "is for train.schedule = 'multistep'; this run's is '" + t.schedule + "'");
  for (std::size_t i = 1; i < t.milestones.size(); ++i)
    if (t.milestones[i] <= t.milestones[i - 1])
      set_by[find_key("train", "milestones")].value_error("must increase (" +
                                                          std::to_string(t.milestones[i]) + " after " +
                                                          std::to_string(t.milestones[i - 1]) + ")");
  if (t.schedule == "plateau" && cfg.data.val_files.empty())
    set_by[find_key("train", "schedule")].value_error(
        "needs data.val_files (the rate is reduced where validation stalls)");
  if (t.schedule == "plateau" && t.gamma >= 1)
    set_by[find_key("train", "gamma")].value_error(
        "must be < 1 for train.schedule = 'plateau', whose reductions multiply the rate by it");
  if ((t.schedule == "cosine" || t.schedule == "plateau") && t.min_lr > t.lr)
    set_by[find_key("train", "min_lr")].value_error("must be <= train.lr (" + format_number(t.lr) + ")");
  return cfg;
}

std::string Config::to_namelist() const {
  Config c = *this;  // the field accessors take a mutable Config
  std::ostringstream os;
  for (const std::string& group : kGroups) {
    os << "&" << group << "\n";
    for (const Key& k : keys()) {
      if (group != k.group) continue;
      const std::string value = format_field(k.field(c));
      if (value.empty()) {  // a namelist has no empty list: leave the default (empty) in place
        os << "  ! " << k.name << ": none; " << k.doc << "\n";
        continue;
      }
      const std::string assignment = std::string(k.name) + " = " + value;
      os << "  " << assignment << std::string(assignment.size() < 40 ? 40 - assignment.size() : 1, ' ')
         << "! " << k.doc << "\n";
    }
    os << "/\n";
  }
  return os.str();
}

std::vector<KeyDoc> key_reference() {
  Config defaults;  // the field accessors take a mutable Config
  std::vector<KeyDoc> docs;
  for (const Key& k : keys()) {
    const Field f = k.field(defaults);
    KeyDoc d;
    d.name = std::string(k.group) + "." + k.name;
    d.type = std::visit(TypeName{}, f);
    d.default_value = k.required ? "" : default_text(k, f);
    d.range = range_text(k.rule, f);
    d.required = k.required;
    d.meaning = k.doc;
    docs.push_back(std::move(d));
  }
  return docs;
}

}  // namespace ddp
