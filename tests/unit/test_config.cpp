// The typed config: defaults, file values, overrides, every kind of error
// message, and the to_namelist() round trip.
#include <gtest/gtest.h>

#include "comm/check.hpp"
#include "train/config.hpp"

namespace {

const std::string kRequired =
    "&data train_files = 'd/train_*.h5' /\n"
    "&model layers = 'linear(10)' /\n";

ddp::Config parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return ddp::parse_config(text, "x.nml", overrides);
}

// The message of the InputError parse_config throws, or "" if it accepts the input.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const ddp::InputError& e) {
    return e.what();
  }
  return "";
}

// The required groups first (lines 1-2), then `train` on line 3.
std::string with_train(const std::string& body) { return kRequired + "&train " + body + " /\n"; }

void expect_same(const ddp::Config& a, const ddp::Config& b) {
  EXPECT_EQ(a.data.train_files, b.data.train_files);
  EXPECT_EQ(a.data.val_files, b.data.val_files);
  EXPECT_EQ(a.data.mode, b.data.mode);
  EXPECT_EQ(a.data.preload_budget_mb, b.data.preload_budget_mb);
  EXPECT_EQ(a.data.prefetch_batches, b.data.prefetch_batches);
  EXPECT_EQ(a.data.shuffle, b.data.shuffle);
  EXPECT_EQ(a.data.drop_last, b.data.drop_last);
  EXPECT_EQ(a.model.layers, b.model.layers);
  EXPECT_EQ(a.model.loss, b.model.loss);
  const ddp::TrainConfig &s = a.train, &t = b.train;
  EXPECT_EQ(s.epochs, t.epochs);
  EXPECT_EQ(s.batch_size, t.batch_size);
  EXPECT_EQ(s.accumulation_steps, t.accumulation_steps);
  EXPECT_EQ(s.optimizer, t.optimizer);
  EXPECT_EQ(s.lr, t.lr);  // exact: the text form must read back to the same double
  EXPECT_EQ(s.momentum, t.momentum);
  EXPECT_EQ(s.nesterov, t.nesterov);
  EXPECT_EQ(s.weight_decay, t.weight_decay);
  EXPECT_EQ(s.betas, t.betas);
  EXPECT_EQ(s.eps, t.eps);
  EXPECT_EQ(s.schedule, t.schedule);
  EXPECT_EQ(s.warmup_steps, t.warmup_steps);
  EXPECT_EQ(s.step_epochs, t.step_epochs);
  EXPECT_EQ(s.milestones, t.milestones);
  EXPECT_EQ(s.plateau_metric, t.plateau_metric);
  EXPECT_EQ(s.plateau_patience, t.plateau_patience);
  EXPECT_EQ(s.plateau_threshold, t.plateau_threshold);
  EXPECT_EQ(s.plateau_cooldown, t.plateau_cooldown);
  EXPECT_EQ(s.gamma, t.gamma);
  EXPECT_EQ(s.min_lr, t.min_lr);
  EXPECT_EQ(s.seed, t.seed);
  EXPECT_EQ(s.log_every, t.log_every);
  EXPECT_EQ(a.io.run_dir, b.io.run_dir);
}

TEST(Config, DefaultsComeFromTheStruct) {
  const ddp::Config c = parse(kRequired);
  ddp::Config want;
  want.data.train_files = {"d/train_*.h5"};
  want.model.layers = {"linear(10)"};
  expect_same(c, want);
  EXPECT_EQ(c.source_path, "x.nml");
  EXPECT_EQ(c.source_text, kRequired);
}

TEST(Config, FileValues) {
  const ddp::Config c = parse(
      "&DATA train_files = 'a_*.h5', 'b_*.h5', val_files = 'v.h5', mode = 'stream',\n"
      "      preload_budget_mb = 512, shuffle = F, drop_last = .true. /\n"
      "&model layers = 'conv2d(8, 3)', 'relu',\n"
      "                'linear(10)'  ! the head\n"
      "       loss = 'cross_entropy' /\n"
      "&train epochs = 3, batch_size = 32, optimizer = 'adamw', lr = 1.d-3,\n"
      "       betas = 0.8, 0.99, weight_decay = 1, seed = 12345678901 /\n"
      "&io run_dir = 'runs/a' /\n");
  EXPECT_EQ(c.data.train_files, (std::vector<std::string>{"a_*.h5", "b_*.h5"}));
  EXPECT_EQ(c.data.val_files, std::vector<std::string>{"v.h5"});
  EXPECT_EQ(c.data.mode, "stream");
  EXPECT_EQ(c.data.preload_budget_mb, 512.0);  // an integer is accepted for a real
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_TRUE(c.data.drop_last);
  EXPECT_EQ(c.model.layers, (std::vector<std::string>{"conv2d(8, 3)", "relu", "linear(10)"}));
  EXPECT_EQ(c.model.loss, "cross_entropy");
  EXPECT_EQ(c.train.epochs, 3);
  EXPECT_EQ(c.train.batch_size, 32);
  EXPECT_EQ(c.train.optimizer, "adamw");
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-3);
  EXPECT_EQ(c.train.betas, (std::vector<double>{0.8, 0.99}));
  EXPECT_EQ(c.train.weight_decay, 1.0);
  EXPECT_EQ(c.train.seed, 12345678901);
  EXPECT_EQ(c.io.run_dir, "runs/a");
}

TEST(Config, OverridesApplyAfterTheFile) {
  const ddp::Config c =
      parse(with_train("epochs = 5, lr = 0.1"),
            {"train.epochs=7", "io.run_dir=runs/try1", "model.layers=linear(10)", "train.lr=1.d-2",
             "train.momentum=0.9", "train.nesterov=T", "data.val_files=v_*.h5", "TRAIN.Batch_Size = 16"});
  EXPECT_EQ(c.train.epochs, 7);
  EXPECT_EQ(c.io.run_dir, "runs/try1");
  EXPECT_EQ(c.model.layers, std::vector<std::string>{"linear(10)"});
  EXPECT_DOUBLE_EQ(c.train.lr, 0.01);
  EXPECT_TRUE(c.train.nesterov);
  EXPECT_EQ(c.data.val_files, std::vector<std::string>{"v_*.h5"});
  EXPECT_EQ(c.train.batch_size, 16);
}

TEST(Config, OverrideListsSplitAtTopLevelCommas) {
  const ddp::Config c =
      parse(kRequired, {"model.layers=conv2d(8,3),relu, 'linear(10)'", "train.betas=0.5,0.6",
                        "io.run_dir='it''s, here'", "data.val_files="});
  EXPECT_EQ(c.model.layers, (std::vector<std::string>{"conv2d(8,3)", "relu", "linear(10)"}));
  EXPECT_EQ(c.train.betas, (std::vector<double>{0.5, 0.6}));
  EXPECT_EQ(c.io.run_dir, "it's, here");
  EXPECT_TRUE(c.data.val_files.empty());
}

TEST(Config, UnknownNamesSuggestTheClosest) {
  EXPECT_EQ(error_of(with_train("batchsize = 4")),
            "x.nml:3: unknown key 'batchsize' in &train; did you mean 'batch_size'?");
  EXPECT_EQ(error_of(with_train("ecochs = 4")),
            "x.nml:3: unknown key 'ecochs' in &train; did you mean 'epochs'?");
  EXPECT_EQ(error_of(with_train("warmup = 4")),
            "x.nml:3: unknown key 'warmup' in &train; did you mean 'warmup_steps'?");
  EXPECT_EQ(error_of(with_train("colour = 4")), "x.nml:3: unknown key 'colour' in &train");
  EXPECT_EQ(error_of(kRequired + "&trian epochs = 1 /"),
            "x.nml:3: unknown group '&trian'; did you mean '&train'?");
  EXPECT_EQ(error_of(kRequired + "&optim lr = 1 /"), "x.nml:3: unknown group '&optim'");
  EXPECT_EQ(error_of(kRequired, {"train.epoch=3"}),
            "command line: train.epoch=3: unknown key 'epoch' in &train; did you mean 'epochs'?");
  EXPECT_EQ(error_of(kRequired, {"trains.epochs=3"}),
            "command line: trains.epochs=3: unknown group 'trains'; did you mean 'train'?");
  EXPECT_EQ(error_of(kRequired, {"epochs=3"}), "command line: epochs=3: expected group.key=value");
}

TEST(Config, WrongTypes) {
  EXPECT_EQ(error_of(with_train("epochs = 2.5")), "x.nml:3: train.epochs: expected an integer, got 2.5");
  EXPECT_EQ(error_of(with_train("lr = 'fast'")), "x.nml:3: train.lr: expected a real, got 'fast'");
  EXPECT_EQ(error_of(with_train("nesterov = 1")), "x.nml:3: train.nesterov: expected a logical, got 1");
  EXPECT_EQ(error_of(with_train("optimizer = 5")), "x.nml:3: train.optimizer: expected a string, got 5");
  EXPECT_EQ(error_of(with_train("epochs = 1, 2")),
            "x.nml:3: train.epochs: expected an integer, got 2 values");
  EXPECT_EQ(error_of(with_train("betas = 0.9, 'x'")),
            "x.nml:3: train.betas: expected a list of reals, got 'x'");
  EXPECT_EQ(error_of("&data train_files = 1 /\n"),
            "x.nml:1: data.train_files: expected a list of strings, got 1");
  EXPECT_EQ(error_of(with_train("epochs = 3000000000")),
            "x.nml:3: train.epochs = 3000000000: out of range for a 32-bit integer");
  EXPECT_EQ(error_of(kRequired, {"train.epochs=abc"}), "command line: train.epochs=abc: expected an integer");
  EXPECT_EQ(error_of(kRequired, {"train.lr=1e-3x"}), "command line: train.lr=1e-3x: expected a real");
  EXPECT_EQ(error_of(kRequired, {"train.shuffle=yes"}),
            "command line: train.shuffle=yes: unknown key "
            "'shuffle' in &train");
  EXPECT_EQ(error_of(kRequired, {"data.shuffle=yes"}), "command line: data.shuffle=yes: expected a logical");
}

TEST(Config, OutOfRange) {
  EXPECT_EQ(error_of(with_train("batch_size = 0")), "x.nml:3: train.batch_size = 0: must be >= 1");
  EXPECT_EQ(error_of(with_train("epochs = 0")), "x.nml:3: train.epochs = 0: must be >= 1");
  EXPECT_EQ(error_of(with_train("accumulation_steps = -1")),
            "x.nml:3: train.accumulation_steps = -1: must be >= 1");
  EXPECT_EQ(error_of(with_train("lr = 0.0")), "x.nml:3: train.lr = 0.0: must be > 0");
  EXPECT_EQ(error_of(with_train("momentum = 1.0")), "x.nml:3: train.momentum = 1.0: must be in [0, 1)");
  EXPECT_EQ(error_of(with_train("momentum = -0.1")), "x.nml:3: train.momentum = -0.1: must be in [0, 1)");
  EXPECT_EQ(error_of(with_train("betas = 0.9")), "x.nml:3: train.betas = 0.9: expected 2 values, got 1");
  EXPECT_EQ(error_of(with_train("betas = 0.9, 1.0")),
            "x.nml:3: train.betas = 0.9, 1.0: every value must be in [0, 1)");
  EXPECT_EQ(error_of(kRequired, {"train.batch_size=0"}), "command line: train.batch_size=0: must be >= 1");
}

TEST(Config, Enumerations) {
  EXPECT_EQ(error_of(with_train("optimizer = 'adam'")),
            "x.nml:3: train.optimizer = 'adam': expected one of 'sgd', 'adamw'");
  EXPECT_EQ(error_of("&data train_files = 'a', mode = 'mmap' /"),
            "x.nml:1: data.mode = 'mmap': expected one of 'auto', 'preload', 'stream'");
  EXPECT_EQ(error_of(kRequired, {"train.schedule=linear"}),
            "command line: train.schedule=linear: expected one of 'constant', 'step', 'multistep', 'cosine', "
            "'plateau'");
}

TEST(Config, CrossFieldChecksSeeFinalValues) {
  EXPECT_EQ(error_of(with_train("nesterov = .true.")),
            "x.nml:3: train.nesterov = .true.: needs train.momentum > 0");
  EXPECT_EQ(error_of(kRequired, {"train.nesterov=true"}),
            "command line: train.nesterov=true: needs train.momentum > 0");
  // The override that supplies momentum comes after the file: still accepted.
  EXPECT_EQ(error_of(with_train("nesterov = .true."), {"train.momentum=0.9"}), "");
  EXPECT_EQ(error_of(with_train("schedule = 'cosine', lr = 0.1, min_lr = 0.5")),
            "x.nml:3: train.min_lr = 0.5: must be <= train.lr (0.1)");
}

// train.schedule = 'plateau' needs validation and a factor below 1; min_lr <= lr.
TEST(Config, PlateauChecks) {
  const std::string val =
      "&data train_files = 'd/train_*.h5', val_files = 'd/val.h5' /\n&model layers = 'linear(10)' /\n";
  EXPECT_EQ(error_of(with_train("schedule = 'plateau'")),
            "x.nml:3: train.schedule = 'plateau': needs data.val_files (the rate is reduced where validation "
            "stalls)");
  EXPECT_EQ(
      error_of(val + "&train schedule = 'plateau', gamma = 1 /\n"),
      "x.nml:3: train.gamma = 1: must be < 1 for train.schedule = 'plateau', whose reductions multiply the "
      "rate by it");
  EXPECT_EQ(error_of(val + "&train schedule = 'plateau', lr = 0.1, min_lr = 0.2 /\n"),
            "x.nml:3: train.min_lr = 0.2: must be <= train.lr (0.1)");
  EXPECT_EQ(error_of(val + "&train schedule = 'plateau', plateau_threshold = 1 /\n"),
            "x.nml:3: train.plateau_threshold = 1: must be in [0, 1)");
  EXPECT_EQ(error_of(val + "&train schedule = 'plateau', plateau_metric = 'loss' /\n"),
            "x.nml:3: train.plateau_metric = 'loss': expected one of 'val_loss', 'val_acc', 'val_acc5'");
  const ddp::Config c = parse(val +
                              "&train schedule = 'plateau', plateau_metric = 'val_acc', plateau_patience = 3,"
                              " plateau_threshold = 0.01, plateau_cooldown = 2 /\n");
  EXPECT_EQ(c.train.plateau_metric, "val_acc");
  EXPECT_EQ(c.train.plateau_patience, 3);
  EXPECT_EQ(c.train.plateau_threshold, 0.01);
  EXPECT_EQ(c.train.plateau_cooldown, 2);
}

// train.schedule = 'multistep' and its train.milestones: each needs the other, and the
// milestones increase; the one that comes last on the line is named.
TEST(Config, MultistepMilestones) {
  EXPECT_EQ(
      error_of(with_train("schedule = 'multistep'")),
      "x.nml:3: train.schedule = 'multistep': needs train.milestones, the epoch counts after which lr is "
      "multiplied by train.gamma");
  EXPECT_EQ(error_of(with_train("schedule = 'step', milestones = 30, 60")),
            "x.nml:3: train.milestones = 30, 60: is for train.schedule = 'multistep'; this run's is 'step'");
  EXPECT_EQ(error_of(with_train("schedule = 'multistep', milestones = 30, 30")),
            "x.nml:3: train.milestones = 30, 30: must increase (30 after 30)");
  EXPECT_EQ(error_of(kRequired, {"train.schedule=multistep", "train.milestones=60,30"}),
            "command line: train.milestones=60,30: must increase (30 after 60)");
  EXPECT_EQ(error_of(with_train("schedule = 'multistep', milestones = 0, 30")),
            "x.nml:3: train.milestones = 0, 30: every value must be >= 1");
  EXPECT_EQ(error_of(with_train("schedule = 'multistep', milestones = 30, 60, 80")), "");
  EXPECT_EQ(parse(with_train("schedule = 'multistep', milestones = 30, 60, 80")).train.milestones,
            (std::vector<std::int64_t>{30, 60, 80}));
}

// io.tensorboard: on by default where the build has protobuf; asking for it in a
// build without is one error that says what to install.
TEST(Config, TensorBoardNeedsProtobuf) {
  EXPECT_EQ(parse(kRequired).io.tensorboard, ddp::kTensorBoardBuilt);
  EXPECT_FALSE(parse(kRequired, {"io.tensorboard=false"}).io.tensorboard);
  if (ddp::kTensorBoardBuilt) {
    EXPECT_EQ(error_of(kRequired, {"io.tensorboard=true"}), "");
  } else {
    EXPECT_EQ(error_of(kRequired, {"io.tensorboard=true"}),
              "command line: io.tensorboard=true: this ddp_train was built without protobuf (apt-get install "
              "libprotobuf-dev protobuf-compiler, then configure again); set io.tensorboard = F");
  }
}

// io.trace_steps: the first and the last optimizer step of the timeline.
TEST(Config, TraceSteps) {
  const ddp::Config d = parse(kRequired);
  EXPECT_FALSE(d.io.trace);
  EXPECT_EQ(d.io.trace_steps, (std::vector<std::int64_t>{20, 30}));
  const ddp::Config c = parse(kRequired + "&io trace = T, trace_steps = 5, 5 /\n");
  EXPECT_TRUE(c.io.trace);
  EXPECT_EQ(c.io.trace_steps, (std::vector<std::int64_t>{5, 5}));
  EXPECT_EQ(parse(kRequired, {"io.trace_steps=100,200"}).io.trace_steps,
            (std::vector<std::int64_t>{100, 200}));
  EXPECT_EQ(error_of(kRequired + "&io trace_steps = 5 /\n"),
            "x.nml:3: io.trace_steps = 5: expected 2 values, got 1");
  EXPECT_EQ(error_of(kRequired + "&io trace_steps = 0, 3 /\n"),
            "x.nml:3: io.trace_steps = 0, 3: every value must be >= 1");
  EXPECT_EQ(error_of(kRequired + "&io trace_steps = 2.5, 3 /\n"),
            "x.nml:3: io.trace_steps: expected a list of integers, got 2.5");
  EXPECT_EQ(error_of(kRequired, {"io.trace_steps=9,3"}),
            "command line: io.trace_steps=9,3: the first step must not come after the last");
}

TEST(Config, RequiredKeys) {
  EXPECT_EQ(error_of("&model layers = 'relu' /"), "x.nml: &data train_files is required");
  EXPECT_EQ(error_of("&data train_files = 'a' /"), "x.nml: &model layers is required");
  EXPECT_EQ(error_of(""), "x.nml: &data train_files is required");
  EXPECT_EQ(error_of("", {"data.train_files=a.h5", "model.layers=relu"}), "");
  EXPECT_EQ(error_of(kRequired, {"data.train_files="}), "command line: data.train_files=: must not be empty");
}

TEST(Config, DuplicateGroup) {
  EXPECT_EQ(error_of(kRequired + "&data mode = 'stream' /"),
            "x.nml:3: duplicate group &data (first at line 1)");
}

TEST(Config, NamelistSyntaxErrorsPassThrough) {
  EXPECT_EQ(error_of(kRequired + "&train lr = 'x\n/"), "x.nml:3: unterminated string");
}

TEST(Config, ToNamelistRoundTrips) {
  const ddp::Config a = parse(
      "&data train_files = 'a_*.h5', 'b_*.h5', val_files = 'v.h5', mode = 'preload',\n"
      "      preload_budget_mb = 100.5, prefetch_batches = 2, shuffle = F, drop_last = T /\n"
      "&model layers = 'conv2d(8, 3)', 'relu', 'linear(10)', loss = 'mse' /\n"
      "&train epochs = 4, batch_size = 17, accumulation_steps = 3, optimizer = 'sgd',\n"
      "       lr = 0.1, momentum = 0.9, nesterov = T, weight_decay = 5e-4, betas = 0.85, 0.995,\n"
      "       eps = 1e-7, schedule = 'multistep', warmup_steps = 10, step_epochs = 2, milestones = 2, 30,\n"
      "       gamma = 0.5,\n"
      "       min_lr = 1e-5, seed = -3, log_every = 0 /\n",
      {"io.run_dir=runs/it's", "train.lr=0.30000000000000004"});
  const std::string text = a.to_namelist();
  const ddp::Config b = ddp::parse_config(text, "resolved.nml", {});
  expect_same(a, b);
  EXPECT_EQ(b.to_namelist(), text);
  // Groups in order, every key written.
  EXPECT_LT(text.find("&data"), text.find("&model"));
  EXPECT_LT(text.find("&model"), text.find("&train"));
  EXPECT_LT(text.find("&train"), text.find("&io"));
  EXPECT_NE(text.find("log_every = 0"), std::string::npos);
}

TEST(Config, DefaultsRoundTrip) {
  const ddp::Config a = parse(kRequired);
  const std::string text = a.to_namelist();
  const ddp::Config b = ddp::parse_config(text, "resolved.nml", {});
  expect_same(a, b);
  EXPECT_NE(text.find("lr = 0.01"), std::string::npos) << text;
  EXPECT_NE(text.find("val_files"), std::string::npos) << text;  // empty, but listed
}

}  // namespace
