#pragma once
// How a convolution's algorithms are chosen from cuDNN's ranking (cuda/conv.cpp):
// host logic over cuDNN's result structs, apart so that a unit test runs it on a
// machine without a GPU (tests/unit/test_conv_search.cpp).

#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "comm/check.hpp"

namespace ddp::cuda {

// The first result cuDNN ranks best that ran (Find) or is supported (Get), among
// the deterministic ones where there is one: some algorithms sum with atomics, and
// a run that cannot be repeated bit for bit cannot show that a resume equals a
// straight run.
//
// In bf16/fp16 the FFT and Winograd algorithms are left out: they transform the
// operands in the narrow type, and their results stray far beyond its rounding.
//
// deterministic = false (DDP_CUDNN_DETERMINISTIC=0) drops the first rule: the
// first that ran or is supported, as PyTorch's cudnn.benchmark takes it.
inline bool transforms(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
inline bool transforms(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
inline bool transforms(cudnnConvolutionBwdFilterAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

template <class Perf>
const Perf& best(const Perf* perf, int count, const char* what, bool narrow, bool deterministic = true) {
  for (int pass = deterministic ? 0 : 1; pass < 3; ++pass)
    for (int i = 0; i < count; ++i) {
      const Perf& p = perf[i];
      if (p.status != CUDNN_STATUS_SUCCESS) continue;
      if (pass < 2 && narrow && transforms(p.algo)) continue;
      if (pass < 1 && p.determinism != CUDNN_DETERMINISTIC) continue;
      return p;
    }
  DDP_FATAL("cuDNN offers no " << what << " algorithm for this shape");
}

// cuDNN's timed search (Find) runs each algorithm once, so one search's ranking is
// one sample of each, and the first run of a kernel in a process may also load it
// (CUDA loads modules lazily). The floor of ResNet-50's convolutions (the same calls
// timed back to back, each run with its own search's choices) came out at 21.7 and
// 31.6 ms in two runs of one call on one H100. So the search runs once to warm up,
// then kSearchRounds times, and each algorithm is ranked by its median time, as
// PyTorch's benchmark mode ranks them (cuDNN's frontend: the median of three).
// An algorithm that failed in any round counts as failed.
constexpr int kSearchRounds = 3;
constexpr int kMaxAlgos = 16;

template <class Perf, class Find>
std::vector<Perf> timed_search(Find find) {
  std::map<int, std::vector<Perf>> rounds;    // by algorithm
  for (int r = 0; r <= kSearchRounds; ++r) {  // round 0 warms up
    Perf perf[kMaxAlgos];
    int count = 0;
    find(perf, &count);
    for (int i = 0; i < count && r > 0; ++i) rounds[int(perf[i].algo)].push_back(perf[i]);
  }
  std::vector<Perf> ranked;
  for (auto& [algo, runs] : rounds) {
    std::sort(runs.begin(), runs.end(), [](const Perf& a, const Perf& b) { return a.time < b.time; });
    Perf median = runs[runs.size() / 2];
    for (const Perf& run : runs)
      if (run.status != CUDNN_STATUS_SUCCESS) median.status = run.status;
    if (runs.size() < std::size_t(kSearchRounds)) median.status = CUDNN_STATUS_NOT_SUPPORTED;
    ranked.push_back(median);
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Perf& a, const Perf& b) {
    const bool a_ran = a.status == CUDNN_STATUS_SUCCESS, b_ran = b.status == CUDNN_STATUS_SUCCESS;
    return a_ran != b_ran ? a_ran : a.time < b.time;
  });
  return ranked;
}

// The log's word on a choice: whether it is nondeterministic.
template <class Perf>
const char* determinism_word(const Perf& chosen) {
  return chosen.determinism != CUDNN_DETERMINISTIC ? ", nondeterministic" : "";
}

// The same rules for cuDNN's graph API (cuda/conv_graph.cpp), where an engine says
// what it does by its numerical notes instead of an algorithm number. Left out:
// - an engine that narrows its inputs (DOWN_CONVERT_INPUTS: fp32 operands summed as
//   fp16 or bf16), as PyTorch leaves it out;
// - on fp32 operands, one on tensor cores (TF32) unless train.tf32 asks for them;
// - in bf16/fp16, the FFT and Winograd transforms (as `transforms` above), and an
//   engine that sums in the narrow type (REDUCED_PRECISION_REDUCTION): the sums stay
//   fp32, as the legacy API's are and as the stated tolerances assume, unless
//   narrow_sums (DDP_CUDNN_NARROW_SUMS=1: PyTorch allows such engines);
// - unless nondeterministic ones are allowed, one that sums with atomics.
// Unlike `best`, nothing left out is taken as a last resort: where no engine passes,
// the legacy API's choice (with its own last resorts) runs that convolution.
struct EngineRules {
  bool fp32 = true;           // fp32 operands (else bf16/fp16)
  bool tf32 = false;          // fp32 may run on TF32 tensor cores (train.tf32)
  bool deterministic = true;  // DDP_CUDNN_DETERMINISTIC unset or 1
  bool narrow_sums = false;   // bf16/fp16 engines may sum in the narrow type
};

inline bool engine_allowed(const std::vector<cudnnBackendNumericalNote_t>& notes, const EngineRules& rules) {
  for (cudnnBackendNumericalNote_t note : notes) switch (note) {
      case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
        return false;
      case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
        if (rules.fp32 && !rules.tf32) return false;
        break;
      case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION:
        if (!rules.fp32 && !rules.narrow_sums) return false;
        break;
      case CUDNN_NUMERICAL_NOTE_FFT:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6:
      case CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13:
        if (!rules.fp32) return false;
        break;
      case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
        if (rules.deterministic) return false;
        break;
      default:
        break;
    }
  return true;
}

// The order of a timed search over graph-API plans: by median time over the rounds,
// those that failed any round last. times_ms[i] holds candidate i's rounds; a
// negative time is a failed run.
inline std::vector<int> rank_by_median(const std::vector<std::vector<float>>& times_ms) {
  std::vector<float> median(times_ms.size(), -1.0f);
  for (std::size_t i = 0; i < times_ms.size(); ++i) {
    std::vector<float> t = times_ms[i];
    if (t.empty() || *std::min_element(t.begin(), t.end()) < 0) continue;
    std::sort(t.begin(), t.end());
    median[i] = t[t.size() / 2];
  }
  std::vector<int> order(times_ms.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const bool a_ran = median[a] >= 0, b_ran = median[b] >= 0;
    return a_ran != b_ran ? a_ran : median[a] < median[b];
  });
  return order;
}

// A timed search's (Find's) word on a choice: its time (and whether it is
// nondeterministic), and the fastest that ran whatever its kind (nondeterministic, or
// a transform left out in bf16/fp16), so the log shows what the rules above cost.
template <class Perf>
std::string search_times(const Perf* perf, int count, const Perf& chosen) {
  const Perf* fastest = nullptr;
  for (int i = 0; i < count; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].time >= 0 &&
        (!fastest || perf[i].time < fastest->time))
      fastest = &perf[i];
  char text[160];
  const char* kind = determinism_word(chosen);
  if (!fastest || fastest->algo == chosen.algo)
    std::snprintf(text, sizeof text, ", %.3f ms%s, the fastest", double(chosen.time), kind);
  else
    std::snprintf(text, sizeof text, ", %.3f ms%s; fastest algo %d %.3f ms%s", double(chosen.time), kind,
                  int(fastest->algo), double(fastest->time),
                  fastest->determinism != CUDNN_DETERMINISTIC ? " (nondeterministic)" : "");
  return text;
}

// A timed search's choice (timed_search, then best) and, in `times`, the log's word
// on it (search_times).
template <class Perf, class Find>
auto timed_choice(Find find, const char* what, bool narrow, bool deterministic, std::string* times) {
  const std::vector<Perf> ranked = timed_search<Perf>(find);
  const Perf& chosen = best(ranked.data(), int(ranked.size()), what, narrow, deterministic);
  *times = search_times(ranked.data(), int(ranked.size()), chosen);
  return chosen.algo;
}

}  // namespace ddp::cuda
