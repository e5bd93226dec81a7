// How the GPU build chooses a convolution's algorithm from cuDNN's ranking
// (cuda/conv_search.hpp): the timed search's rounds and median, and the rules on
// determinism and on transforms in bf16/fp16. Host logic over cuDNN's structs, so
// it runs here without a GPU; the cuDNN calls themselves are the GPU tests'.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/conv_search.hpp"

namespace {

using Perf = cudnnConvolutionFwdAlgoPerf_t;
constexpr auto kGemm = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
constexpr auto kPrecomp = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
constexpr auto kDirect = CUDNN_CONVOLUTION_FWD_ALGO_GEMM;
constexpr auto kWinograd = CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;

Perf perf(cudnnConvolutionFwdAlgo_t algo, float ms, bool deterministic = true,
          cudnnStatus_t status = CUDNN_STATUS_SUCCESS) {
  Perf p{};
  p.algo = algo;
  p.status = status;
  p.time = status == CUDNN_STATUS_SUCCESS ? ms : -1.0f;
  p.determinism = deterministic ? CUDNN_DETERMINISTIC : CUDNN_NON_DETERMINISTIC;
  return p;
}

// A cuDNN Find that answers round r (0: the warm-up) with rounds[r], as cuDNN's Find
// would: the algorithms in its order, the count written back; *calls counts the rounds.
auto find(const std::vector<std::vector<Perf>>& rounds, int* calls) {
  return [&rounds, calls](Perf* out, int* count) {
    const auto& answer = rounds.at(std::size_t(*calls));
    ++*calls;
    *count = int(answer.size());
    std::copy(answer.begin(), answer.end(), out);
  };
}

std::vector<Perf> search(const std::vector<std::vector<Perf>>& rounds, int* calls) {
  return ddp::cuda::timed_search<Perf>(find(rounds, calls));
}

TEST(ConvSearch, RanksByTheMedianOfTheRoundsAfterAWarmUp) {
  // The warm-up favours kPrecomp (kGemm loading, say); one sample of round 1 would
  // pick kGemm; means would pick kPrecomp (kGemm 2.37 ms); medians: kGemm 1.1 ms,
  // kPrecomp 1.2 ms.
  const std::vector<std::vector<Perf>> rounds = {
      {perf(kPrecomp, 0.1f), perf(kGemm, 100.0f)},
      {perf(kGemm, 1.0f), perf(kPrecomp, 1.2f)},
      {perf(kPrecomp, 1.2f), perf(kGemm, 5.0f)},
      {perf(kGemm, 1.1f), perf(kPrecomp, 1.3f)},
  };
  int calls = 0;
  const std::vector<Perf> ranked = search(rounds, &calls);
  EXPECT_EQ(calls, 1 + ddp::cuda::kSearchRounds);
  ASSERT_EQ(ranked.size(), 2u);
  EXPECT_EQ(ranked[0].algo, kGemm);
  EXPECT_FLOAT_EQ(ranked[0].time, 1.1f);
  EXPECT_EQ(ranked[1].algo, kPrecomp);
  EXPECT_FLOAT_EQ(ranked[1].time, 1.2f);
  EXPECT_EQ(&ddp::cuda::best(ranked.data(), int(ranked.size()), "forward", false), &ranked[0]);
  // The same as the one call the convolution makes: the choice and the log's word.
  calls = 0;
  std::string times;
  const auto chosen = ddp::cuda::timed_choice<Perf>(find(rounds, &calls), "forward", false, true, &times);
  EXPECT_EQ(chosen, kGemm);
  EXPECT_EQ(times, ", 1.100 ms, the fastest");
}

TEST(ConvSearch, AnAlgorithmThatFailedOrWasMissingInARoundCountsAsFailed) {
  // kDirect is the fastest where it runs but fails in round 3; kWinograd is missing
  // from round 2: both rank after kGemm, which ran every time, and are not chosen.
  const std::vector<std::vector<Perf>> rounds = {
      {perf(kDirect, 0.5f), perf(kWinograd, 0.6f), perf(kGemm, 2.0f)},
      {perf(kDirect, 0.5f), perf(kWinograd, 0.6f), perf(kGemm, 2.0f)},
      {perf(kDirect, 0.5f), perf(kGemm, 2.0f)},
      {perf(kWinograd, 0.6f), perf(kGemm, 2.0f), perf(kDirect, 0, true, CUDNN_STATUS_EXECUTION_FAILED)},
  };
  int calls = 0;
  const std::vector<Perf> ranked = search(rounds, &calls);
  ASSERT_EQ(ranked.size(), 3u);
  EXPECT_EQ(ranked[0].algo, kGemm);
  EXPECT_EQ(ranked[0].status, CUDNN_STATUS_SUCCESS);
  for (std::size_t i = 1; i < ranked.size(); ++i) EXPECT_NE(ranked[i].status, CUDNN_STATUS_SUCCESS) << i;
  EXPECT_EQ(ddp::cuda::best(ranked.data(), int(ranked.size()), "forward", false).algo, kGemm);
}

TEST(ConvSearch, DeterministicFirstAndNoTransformsInANarrowType) {
  const std::vector<Perf> ranked = {perf(kWinograd, 0.5f), perf(kDirect, 0.8f, /*deterministic=*/false),
                                    perf(kGemm, 1.0f)};
  const auto& narrow = ddp::cuda::best(ranked.data(), 3, "forward", true);
  const auto& wide = ddp::cuda::best(ranked.data(), 3, "forward", false);
  EXPECT_EQ(narrow.algo, kGemm);    // Winograd left out in bf16/fp16, the nondeterministic one after
  EXPECT_EQ(wide.algo, kWinograd);  // fp32: the fastest deterministic one
  // Where only a nondeterministic one runs, it is taken.
  const std::vector<Perf> only = {perf(kDirect, 0.8f, false)};
  EXPECT_EQ(ddp::cuda::best(only.data(), 1, "forward", true).algo, kDirect);
  // The log's word on the choice: what it cost against the fastest of any kind.
  EXPECT_EQ(ddp::cuda::search_times(ranked.data(), 3, narrow),
            ", 1.000 ms; fastest algo " + std::to_string(int(kWinograd)) + " 0.500 ms");
  EXPECT_EQ(ddp::cuda::search_times(ranked.data(), 3, wide), ", 0.500 ms, the fastest");
  const std::vector<Perf> nondet_fastest = {perf(kDirect, 0.8f, false), perf(kGemm, 1.0f)};
  EXPECT_EQ(ddp::cuda::search_times(nondet_fastest.data(), 2, nondet_fastest[1]),
            ", 1.000 ms; fastest algo " + std::to_string(int(kDirect)) + " 0.800 ms (nondeterministic)");
}

TEST(ConvSearch, NondeterministicAllowedTakesTheFirstThatRan) {
  // DDP_CUDNN_DETERMINISTIC=0: the nondeterministic kDirect ranks first and is taken;
  // the transforms stay out in bf16/fp16, and what failed is never taken.
  const std::vector<Perf> ranked = {perf(kDirect, 0.8f, /*deterministic=*/false), perf(kGemm, 1.0f)};
  EXPECT_EQ(ddp::cuda::best(ranked.data(), 2, "forward", true, /*deterministic=*/false).algo, kDirect);
  EXPECT_EQ(ddp::cuda::best(ranked.data(), 2, "forward", true, /*deterministic=*/true).algo, kGemm);
  const std::vector<Perf> transform_first = {perf(kWinograd, 0.5f, false), perf(kDirect, 0.8f, false),
                                             perf(kGemm, 1.0f)};
  EXPECT_EQ(ddp::cuda::best(transform_first.data(), 3, "forward", true, false).algo, kDirect);
  EXPECT_EQ(ddp::cuda::best(transform_first.data(), 3, "forward", false, false).algo, kWinograd);
  const std::vector<Perf> failed_first = {perf(kDirect, 0, false, CUDNN_STATUS_NOT_SUPPORTED),
                                          perf(kGemm, 1.0f)};
  EXPECT_EQ(ddp::cuda::best(failed_first.data(), 2, "forward", false, false).algo, kGemm);
  // A timed search's choice with the flag, and the log's word on a nondeterministic choice.
  const std::vector<std::vector<Perf>> rounds(1 + ddp::cuda::kSearchRounds, ranked);
  int calls = 0;
  std::string times;
  const auto chosen = ddp::cuda::timed_choice<Perf>(find(rounds, &calls), "forward", true, false, &times);
  EXPECT_EQ(calls, 1 + ddp::cuda::kSearchRounds);
  EXPECT_EQ(chosen, kDirect);
  EXPECT_EQ(times, ", 0.800 ms, nondeterministic, the fastest");
  EXPECT_EQ(ddp::cuda::search_times(transform_first.data(), 3, transform_first[1]),
            ", 0.800 ms, nondeterministic; fastest algo " + std::to_string(int(kWinograd)) +
                " 0.500 ms (nondeterministic)");
}

}  // namespace

// The graph API's rules on an engine's numerical notes (conv_search.hpp,
// engine_allowed), one rule at a time, then together.
TEST(ConvSearch, GraphEngineRulesReadTheNumericalNotes) {
  using Notes = std::vector<cudnnBackendNumericalNote_t>;
  const ddp::cuda::EngineRules fp32{true, false, true}, fp32_tf32{true, true, true}, bf16{false, false, true},
      bf16_any{false, false, false};
  // no notes: every rule passes it
  for (const auto& r : {fp32, fp32_tf32, bf16, bf16_any}) EXPECT_TRUE(ddp::cuda::engine_allowed({}, r));
  // inputs narrowed to fp16/bf16: never
  for (const auto& r : {fp32, fp32_tf32, bf16, bf16_any})
    EXPECT_FALSE(ddp::cuda::engine_allowed(Notes{CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS}, r));
  // tensor cores: on fp32 operands only with TF32 asked for; always in bf16
  const Notes tc{CUDNN_NUMERICAL_NOTE_TENSOR_CORE};
  EXPECT_FALSE(ddp::cuda::engine_allowed(tc, fp32));
  EXPECT_TRUE(ddp::cuda::engine_allowed(tc, fp32_tf32));
  EXPECT_TRUE(ddp::cuda::engine_allowed(tc, bf16));
  // transforms, and sums in the narrow type: in fp32 only
  for (auto note : {CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION, CUDNN_NUMERICAL_NOTE_FFT,
                    CUDNN_NUMERICAL_NOTE_WINOGRAD, CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4,
                    CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6, CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13}) {
    EXPECT_TRUE(ddp::cuda::engine_allowed(Notes{note}, fp32)) << int(note);
    EXPECT_FALSE(ddp::cuda::engine_allowed(Notes{note}, bf16)) << int(note);
    EXPECT_FALSE(ddp::cuda::engine_allowed(Notes{note}, bf16_any)) << int(note);
  }
  // sums in the narrow type where asked for (DDP_CUDNN_NARROW_SUMS=1)
  const ddp::cuda::EngineRules bf16_narrow_sums{false, false, true, true};
  EXPECT_TRUE(
      ddp::cuda::engine_allowed(Notes{CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION}, bf16_narrow_sums));
  EXPECT_FALSE(ddp::cuda::engine_allowed(Notes{CUDNN_NUMERICAL_NOTE_FFT}, bf16_narrow_sums));
  // atomics: only where nondeterministic engines are allowed
  const Notes atomics{CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC};
  EXPECT_FALSE(ddp::cuda::engine_allowed(atomics, bf16));
  EXPECT_TRUE(ddp::cuda::engine_allowed(atomics, bf16_any));
  // notes that change nothing, beside one that does: the one decides
  const Notes harmless{CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP};
  EXPECT_TRUE(ddp::cuda::engine_allowed(harmless, fp32));
  Notes with_tc = harmless;
  with_tc.push_back(CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
  EXPECT_FALSE(ddp::cuda::engine_allowed(with_tc, fp32));
  EXPECT_TRUE(ddp::cuda::engine_allowed(with_tc, fp32_tf32));
}

// The graph API's timed search ranks its plans by the median of their rounds; one
// that failed any round goes last, whatever its other times.
TEST(ConvSearch, GraphPlansRankByMedianAndFailuresLast) {
  const std::vector<std::vector<float>> times{
      {0.9f, 0.2f, 0.95f},  // median 0.9 although its best round is the fastest of all
      {0.5f, 0.6f, 0.4f},   // median 0.5
      {0.1f, -1.0f, 0.1f},  // failed a round
      {},                   // never ran (no workspace to be had)
      {0.7f, 0.3f, 0.3f},   // median 0.3
  };
  EXPECT_EQ(ddp::cuda::rank_by_median(times), (std::vector<int>{4, 1, 0, 2, 3}));
  EXPECT_TRUE(ddp::cuda::rank_by_median({}).empty());
}
