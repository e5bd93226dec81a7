// Fused attention (flash attention's algorithm), see flash_attention.hpp. Built for
// every architecture in CMAKE_CUDA_ARCHITECTURES (bf16 WMMA needs sm_80 or later).
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>

#include "cuda/cuda_check.hpp"
#include "cuda/flash_attention.hpp"
#include "model/kernel_trace.hpp"

namespace ddp::cuda {

namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

// bf16 WMMA needs sm_80: the device code below is compiled for those architectures
// only; the kernels' bodies are a trap elsewhere (flash_attention_supported keeps them
// from being launched there).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define DDP_FLASH_DEVICE_CODE 1
#else
#define DDP_FLASH_DEVICE_CODE 0
#endif

// Rows of a tile (queries or keys): 4 warps of 16 rows each.
constexpr int kTile = 64;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

// Leading dimensions in shared memory, each row padded past a multiple of 128 bytes:
// WMMA's loads and stores take 8 rows of 16 bytes at once (or 8 rows of 32 for
// fp32), which at a pitch of 128 or 256 bytes all fall in the same 4 of the 32
// banks (8-way conflicts); 16 more bytes a row put the 8 bf16 rows on 8 different
// 4-bank groups, and 32 more the scores' fp32 rows, stored a half-warp at a time, 4
// rows on 4 different 8-bank groups. (The results' fp32 rows take 16 more only: read
// and written once a tile in forward, once a block in backward, where 32 would cost
// a block an SM at head size 32.) Each stays a multiple of 8 elements (bf16) or 4
// (fp32), as WMMA's ldm must be, and 16 rows of each a multiple of 32 bytes, so every
// fragment's pointer keeps WMMA's 256-bit alignment.
template <int HS>
__host__ __device__ constexpr int tile_ld() {  // bf16 (kTile, HS) tiles: Q, K, V, dO
  return HS + 8;
}
constexpr int kScoreLd = kTile + 8;  // fp32 (16, kTile) per warp: scores, P, dP
constexpr int kProbLd = kTile + 8;   // bf16 (16, kTile) per warp: P, dS
template <int HS>
__host__ __device__ constexpr int result_ld() {  // fp32 (16, HS) per warp: O, dK, dV, dQ
  return HS + 4;
}

#if DDP_FLASH_DEVICE_CODE
constexpr int kRows = 16;  // a warp's rows, WMMA's M

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// dst (kTile, HS) bf16, ld tile_ld = rows t0.. of an fp32 matrix whose row t starts
// at src + t * ld, the HS columns from there; rows at or past T are 0. All threads.
// `vec`: src and ld multiples of 16 bytes (the host checks the pointers; ld and the
// columns' offsets are multiples of HS), so 4 columns a load.
template <int HS>
__device__ void load_tile(bf16* dst, const float* src, long ld, int t0, int T, bool vec) {
  constexpr int LT = tile_ld<HS>();
  if (vec) {
    for (int e = threadIdx.x; e < kTile * HS / 4; e += kThreads) {
      const int r = e / (HS / 4), c = (e - r * (HS / 4)) * 4, t = t0 + r;
      const float4 v = t < T ? *reinterpret_cast<const float4*>(src + long(t) * ld + c)
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      // One 8-byte store (row r's start on 16 bytes, c a multiple of 4), each pair's
      // low half its first: dst[c] = x, dst[c + 1] = y, ...
      const __nv_bfloat162 xy = __floats2bfloat162_rn(v.x, v.y), zw = __floats2bfloat162_rn(v.z, v.w);
      uint2 both;
      both.x = *reinterpret_cast<const unsigned*>(&xy);
      both.y = *reinterpret_cast<const unsigned*>(&zw);
      *reinterpret_cast<uint2*>(dst + r * LT + c) = both;
    }
    return;
  }
  for (int e = threadIdx.x; e < kTile * HS; e += kThreads) {
    const int r = e / HS, c = e - r * HS, t = t0 + r;
    dst[r * LT + c] = __float2bfloat16_rn(t < T ? src[long(t) * ld + c] : 0.0f);
  }
}

// out (16, 64) fp32, row-major with ld kScoreLd = a (16, HS) b^T, b (64, HS): a's and
// b's rows row-major with ld tile_ld. One warp.
template <int HS>
__device__ void rows_times_rows_t(const bf16* a, const bf16* b, float* out) {
  constexpr int LT = tile_ld<HS>();
  for (int n = 0; n < kTile / 16; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < HS / 16; ++k) {
      FragA fa;
      FragBCol fb;  // b^T (HS, 64): element (k, j) is b[j LT + k]
      wmma::load_matrix_sync(fa, a + k * 16, LT);
      wmma::load_matrix_sync(fb, b + n * 16 * LT + k * 16, LT);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, kScoreLd, wmma::mem_row_major);
  }
}

// acc[n] += p (16, 64) v (64, HS) for the HS / 16 column blocks n: p row-major with
// ld kProbLd, v row-major with ld tile_ld. One warp.
template <int HS>
__device__ void add_rows_times(FragAcc (&acc)[HS / 16], const bf16* p, const bf16* v) {
  constexpr int LT = tile_ld<HS>();
  for (int n = 0; n < HS / 16; ++n)
    for (int k = 0; k < kTile / 16; ++k) {
      FragA fa;
      FragBRow fb;
      wmma::load_matrix_sync(fa, p + k * 16, kProbLd);
      wmma::load_matrix_sync(fb, v + k * 16 * LT + n * 16, LT);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
}

#endif  // DDP_FLASH_DEVICE_CODE

// Shared memory of the forward kernel, in bytes.
template <int HS>
constexpr int forward_smem() {
  return 3 * kTile * tile_ld<HS>() * 2   // Q, K, V tiles, bf16
         + kTile * kScoreLd * 4          // the warps' scores, fp32
         + kTile * kProbLd * 2           // their probabilities, bf16
         + kTile * result_ld<HS>() * 4;  // their outputs, fp32
}

// One block per (query tile, head, sample); warp w owns queries q0 + 16 w ...; lane
// l works on row l / 2 of them, on the half (l % 2) of a key tile's columns.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const float* __restrict__ qkv, float* __restrict__ o, float* __restrict__ stats, int T,
                   int heads, bool causal, float scale, bool vec) {
#if DDP_FLASH_DEVICE_CODE
  constexpr int LT = tile_ld<HS>(), LR = result_ld<HS>();
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s = q_s + kTile * LT;
  bf16* v_s = k_s + kTile * LT;
  float* s_s = reinterpret_cast<float*>(v_s + kTile * LT);
  bf16* p_s = reinterpret_cast<bf16*>(s_s + kTile * kScoreLd);
  float* o_s = reinterpret_cast<float*>(p_s + kTile * kProbLd);

  const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  const long d = long(heads) * HS, d3 = 3 * d;
  const float* base = qkv + long(b) * T * d3 + long(h) * HS;  // Q; K at + d, V at + 2d
  float* s_w = s_s + warp * kRows * kScoreLd;
  bf16* p_w = p_s + warp * kRows * kProbLd;
  float* o_w = o_s + warp * kRows * LR;
  const int qi = q0 + warp * kRows + r;  // this lane's query

  load_tile<HS>(q_s, base, d3, q0, T, vec);
  for (int e = lane; e < kRows * LR; e += 32) o_w[e] = 0.0f;
  float m_row = -INFINITY, l_row = 0.0f;
  const int kv_end = causal ? min(T, q0 + kTile) : T;
  for (int k0 = 0; k0 < kv_end; k0 += kTile) {
    __syncthreads();  // every warp done with the last K and V tiles (and, first, Q is in)
    load_tile<HS>(k_s, base + d, d3, k0, T, vec);
    load_tile<HS>(v_s, base + 2 * d, d3, k0, T, vec);
    __syncthreads();
    rows_times_rows_t<HS>(q_s + warp * kRows * LT, k_s, s_w);
    __syncwarp();
    // The online softmax of this lane's row over its 32 keys of the tile, each lane
    // starting at its row's own column (jj), the row's two halves 16 apart: the
    // lanes' fp32 words in different banks (the bf16 stores of P still meet 2-way).
    float* srow = s_w + r * kScoreLd + half * 32;
    float mx = -INFINITY;
    for (int j = 0; j < 32; ++j) {
      const int jj = (j + r + 16 * half) & 31, kj = k0 + half * 32 + jj;
      const float s = kj < T && (!causal || kj <= qi) ? srow[jj] * scale : -INFINITY;
      srow[jj] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m_row, mx);
    const bool none = m_new == -INFINITY;  // no key seen yet (a padding row's)
    const float alpha = none ? 1.0f : expf(m_row - m_new);
    float sum = 0.0f;
    bf16* prow = p_w + r * kProbLd + half * 32;
    for (int j = 0; j < 32; ++j) {
      const int jj = (j + r + 16 * half) & 31;
      const float p = none ? 0.0f : expf(srow[jj] - m_new);
      prow[jj] = __float2bfloat16_rn(p);
      sum += p;
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l_row = alpha * l_row + sum;
    m_row = m_new;
    float* orow = o_w + r * LR + half * (HS / 2);
    for (int c = 0; c < HS / 2; ++c) orow[(c + r) % (HS / 2)] *= alpha;
    __syncwarp();
    // O_w += P_w (16, 64) V (64, HS), through the accumulators
    FragAcc acc[HS / 16];
    for (int n = 0; n < HS / 16; ++n) wmma::load_matrix_sync(acc[n], o_w + n * 16, LR, wmma::mem_row_major);
    add_rows_times<HS>(acc, p_w, v_s);
    for (int n = 0; n < HS / 16; ++n) wmma::store_matrix_sync(o_w + n * 16, acc[n], LR, wmma::mem_row_major);
    __syncwarp();
  }
  if (qi < T) {
    const float inv = 1.0f / l_row;
    float* out = o + (long(b) * T + qi) * d + long(h) * HS;
    for (int c = half * (HS / 2); c < (half + 1) * (HS / 2); ++c) out[c] = o_w[r * LR + c] * inv;
    if (half == 0) {
      float* st = stats + ((long(b) * heads + h) * T + qi) * 2;
      st[0] = m_row;
      st[1] = inv;
    }
  }
#else
  __trap();
#endif
}

// delta (B, heads, T) = dO . O per query row, in fp32 in the order of the columns.
__global__ void delta_kernel(const float* __restrict__ o, const float* __restrict__ d_o,
                             float* __restrict__ delta, long rows, int T, int heads, int hs) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < rows; i += long(gridDim.x) * blockDim.x) {
    const long t = i % T, bh = i / T, h = bh % heads, b = bh / heads;
    const long at = (b * T + t) * heads * hs + h * hs;
    float s = 0.0f;
    for (int c = 0; c < hs; ++c) s += d_o[at + c] * o[at + c];
    delta[i] = s;
  }
}

// Shared memory of either backward kernel, in bytes.
template <int HS>
constexpr int backward_smem() {
  return 4 * kTile * tile_ld<HS>() * 2  // two tiles of rows and two of columns, bf16
         + 2 * kTile * kScoreLd * 4     // the warps' P and dP, fp32
         + kTile * kProbLd * 2          // their P, then dS, bf16
         + kTile * result_ld<HS>() * 4  // their results, fp32
         + 3 * kTile * 4;               // the query tile's m, 1 / sum and delta
}

#if DDP_FLASH_DEVICE_CODE
// P (16, 64) of this warp's rows against a tile's 64 columns, from the scores in
// s_w (fp32, overwritten by P), into p_w (bf16) too where given. `keys_are_rows`: the warp's
// rows are keys and the columns queries (dK, dV), else the other way (dQ). m, inv:
// the query tile's statistics (the columns' or the rows'); row0, col0: the first
// row's and column's token.
__device__ void probabilities(float* s_w, bf16* p_w, const float* m, const float* inv, bool keys_are_rows,
                              int row0, int col0, int T, bool causal, float scale) {
  const int lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  for (int j = 0; j < 32; ++j) {
    // rotated, the halves 16 apart: the fp32 words and the statistics in different
    // banks (the bf16 stores of P, 2-way)
    const int c = half * 32 + ((j + r + 16 * half) & 31), row = row0 + r, col = col0 + c;
    const int key = keys_are_rows ? row : col, query = keys_are_rows ? col : row, qa = keys_are_rows ? c : r;
    const bool seen = key < T && query < T && (!causal || key <= query);
    const float p = seen ? expf(s_w[r * kScoreLd + c] * scale - m[qa]) * inv[qa] : 0.0f;
    s_w[r * kScoreLd + c] = p;
    if (p_w != nullptr) p_w[r * kProbLd + c] = __float2bfloat16_rn(p);
  }
}

// p_w (bf16) = dS = P (dP - delta) of this warp's rows, P in s_w, dP in dp_w (fp32);
// delta of the queries (the columns' when keys_are_rows, else the rows').
__device__ void score_gradients(const float* s_w, const float* dp_w, bf16* p_w, const float* delta,
                                bool keys_are_rows) {
  const int lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  for (int j = 0; j < 32; ++j) {
    const int c = half * 32 + ((j + r + 16 * half) & 31), qa = keys_are_rows ? c : r;
    p_w[r * kProbLd + c] = __float2bfloat16_rn(s_w[r * kScoreLd + c] * (dp_w[r * kScoreLd + c] - delta[qa]));
  }
}

// The query tile's statistics and delta into shared memory (0 past T). All threads.
__device__ void load_row_stats(float* m_s, float* inv_s, float* delta_s, const float* stats,
                               const float* delta, long row_base, int q0, int T) {
  for (int e = threadIdx.x; e < kTile; e += kThreads) {
    const int t = q0 + e;
    m_s[e] = t < T ? stats[(row_base + t) * 2] : 0.0f;
    inv_s[e] = t < T ? stats[(row_base + t) * 2 + 1] : 0.0f;
    delta_s[e] = t < T ? delta[row_base + t] : 0.0f;
  }
}

// dst rows t0 + 16 w + i (i < 16, those before T), HS columns at dst + t ld: the
// warp's results in res_w (16, HS, ld result_ld) fp32 times `scale`.
template <int HS>
__device__ void store_rows(float* dst, long ld, const float* res_w, int t0, int T, float scale) {
  const int lane = threadIdx.x % 32;
  for (int e = lane; e < kRows * HS; e += 32) {
    const int i = e / HS, c = e - i * HS, t = t0 + i;
    if (t < T) dst[long(t) * ld + c] = res_w[i * result_ld<HS>() + c] * scale;
  }
}

// A backward kernel's shared memory (backward_smem), carved up; `warp`'s parts of
// the per-warp buffers.
template <int HS>
struct BackwardShared {
  bf16* tile[4];           // four (kTile, HS) bf16 tiles (ld tile_ld): the block's two, the loop's two
  float *s_w, *dp_w;       // the warp's P and dP, (16, kTile) fp32, ld kScoreLd
  bf16* p_w;               // its P, then dS, bf16, ld kProbLd
  float* res_w;            // its results, (16, HS) fp32, ld result_ld
  float *m, *inv, *delta;  // the query tile's statistics, kTile each
  __device__ BackwardShared(unsigned char* smem, int warp) {
    constexpr int LT = tile_ld<HS>(), LR = result_ld<HS>();
    bf16* t = reinterpret_cast<bf16*>(smem);
    for (int i = 0; i < 4; ++i) tile[i] = t + i * kTile * LT;
    float* s_s = reinterpret_cast<float*>(t + 4 * kTile * LT);
    float* dp_s = s_s + kTile * kScoreLd;
    bf16* p_s = reinterpret_cast<bf16*>(dp_s + kTile * kScoreLd);
    float* res_s = reinterpret_cast<float*>(p_s + kTile * kProbLd);
    m = res_s + kTile * LR;
    inv = m + kTile;
    delta = inv + kTile;
    s_w = s_s + warp * kRows * kScoreLd;
    dp_w = dp_s + warp * kRows * kScoreLd;
    p_w = p_s + warp * kRows * kProbLd;
    res_w = res_s + warp * kRows * LR;
  }
};

#endif  // DDP_FLASH_DEVICE_CODE

// One block per (key tile, head, sample): dK and dV of its 64 keys, summed over the
// query tiles in order. Warp w owns keys k0 + 16 w ...
template <int HS>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(const float* __restrict__ qkv, const float* __restrict__ d_o, const float* __restrict__ stats,
                const float* __restrict__ delta, float* __restrict__ dqkv, int T, int heads, bool causal,
                float scale, bool vec) {
#if DDP_FLASH_DEVICE_CODE
  constexpr int LT = tile_ld<HS>(), LR = result_ld<HS>();
  extern __shared__ __align__(128) unsigned char smem[];
  const int k0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z, warp = threadIdx.x / 32;
  const BackwardShared<HS> sh(smem, warp);
  bf16 *k_s = sh.tile[0], *v_s = sh.tile[1], *q_s = sh.tile[2], *do_s = sh.tile[3];
  float *s_w = sh.s_w, *dp_w = sh.dp_w, *m_s = sh.m, *inv_s = sh.inv, *delta_s = sh.delta;
  bf16* p_w = sh.p_w;
  const long d = long(heads) * HS, d3 = 3 * d, row_base = (long(b) * heads + h) * T;
  const float* base = qkv + long(b) * T * d3 + long(h) * HS;
  const float* do_base = d_o + long(b) * T * d + long(h) * HS;
  const bf16* k_w = k_s + warp * kRows * LT;
  const bf16* v_w = v_s + warp * kRows * LT;

  load_tile<HS>(k_s, base + d, d3, k0, T, vec);
  load_tile<HS>(v_s, base + 2 * d, d3, k0, T, vec);
  FragAcc dk[HS / 16], dv[HS / 16];
  for (int n = 0; n < HS / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  // Causal: queries before k0 see none of these keys.
  for (int q0 = causal ? k0 : 0; q0 < T; q0 += kTile) {
    __syncthreads();  // every warp done with the last query tile (and, first, K and V are in)
    load_tile<HS>(q_s, base, d3, q0, T, vec);
    load_tile<HS>(do_s, do_base, d, q0, T, vec);
    load_row_stats(m_s, inv_s, delta_s, stats, delta, row_base, q0, T);
    __syncthreads();
    rows_times_rows_t<HS>(k_w, q_s, s_w);  // S^T (16 keys, 64 queries) = K_w Q^T
    __syncwarp();
    probabilities(s_w, p_w, m_s, inv_s, true, k0 + warp * kRows, q0, T, causal, scale);
    __syncwarp();
    add_rows_times<HS>(dv, p_w, do_s);       // dV_w += P^T dO
    rows_times_rows_t<HS>(v_w, do_s, dp_w);  // dP^T (16 keys, 64 queries) = V_w dO^T
    __syncwarp();
    score_gradients(s_w, dp_w, p_w, delta_s, true);
    __syncwarp();
    add_rows_times<HS>(dk, p_w, q_s);  // dK_w += dS^T Q (times scale at the end)
  }
  float* res_w = sh.res_w;
  float* dst = dqkv + long(b) * T * d3 + long(h) * HS;
  for (int n = 0; n < HS / 16; ++n) wmma::store_matrix_sync(res_w + n * 16, dk[n], LR, wmma::mem_row_major);
  __syncwarp();
  store_rows<HS>(dst + d, d3, res_w, k0 + warp * kRows, T, scale);
  __syncwarp();
  for (int n = 0; n < HS / 16; ++n) wmma::store_matrix_sync(res_w + n * 16, dv[n], LR, wmma::mem_row_major);
  __syncwarp();
  store_rows<HS>(dst + 2 * d, d3, res_w, k0 + warp * kRows, T, 1.0f);
#else
  __trap();
#endif
}

// One block per (query tile, head, sample): dQ of its 64 queries, summed over the key
// tiles in order. Warp w owns queries q0 + 16 w ...
template <int HS>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(const float* __restrict__ qkv, const float* __restrict__ d_o, const float* __restrict__ stats,
              const float* __restrict__ delta, float* __restrict__ dqkv, int T, int heads, bool causal,
              float scale, bool vec) {
#if DDP_FLASH_DEVICE_CODE
  constexpr int LT = tile_ld<HS>(), LR = result_ld<HS>();
  extern __shared__ __align__(128) unsigned char smem[];
  const int q0 = blockIdx.x * kTile, h = blockIdx.y, b = blockIdx.z, warp = threadIdx.x / 32;
  const BackwardShared<HS> sh(smem, warp);
  bf16 *q_s = sh.tile[0], *do_s = sh.tile[1], *k_s = sh.tile[2], *v_s = sh.tile[3];
  float *s_w = sh.s_w, *dp_w = sh.dp_w, *m_s = sh.m, *inv_s = sh.inv, *delta_s = sh.delta;
  bf16* p_w = sh.p_w;
  const long d = long(heads) * HS, d3 = 3 * d, row_base = (long(b) * heads + h) * T;
  const float* base = qkv + long(b) * T * d3 + long(h) * HS;
  const bf16* q_w = q_s + warp * kRows * LT;
  const bf16* do_w = do_s + warp * kRows * LT;

  load_tile<HS>(q_s, base, d3, q0, T, vec);
  load_tile<HS>(do_s, d_o + long(b) * T * d + long(h) * HS, d, q0, T, vec);
  load_row_stats(m_s, inv_s, delta_s, stats, delta, row_base, q0, T);
  FragAcc dq[HS / 16];
  for (int n = 0; n < HS / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  const int kv_end = causal ? min(T, q0 + kTile) : T;
  for (int k0 = 0; k0 < kv_end; k0 += kTile) {
    __syncthreads();  // every warp done with the last K and V tiles (first: Q, dO, statistics in)
    load_tile<HS>(k_s, base + d, d3, k0, T, vec);
    load_tile<HS>(v_s, base + 2 * d, d3, k0, T, vec);
    __syncthreads();
    rows_times_rows_t<HS>(q_w, k_s, s_w);  // S (16 queries, 64 keys) = Q_w K^T
    __syncwarp();
    // the warp's rows' statistics: m_s and inv_s from this warp's first row on
    // (no bf16 P: dQ needs only dS)
    probabilities(s_w, nullptr, m_s + warp * kRows, inv_s + warp * kRows, false, q0 + warp * kRows, k0, T,
                  causal, scale);
    rows_times_rows_t<HS>(do_w, v_s, dp_w);  // dP (16 queries, 64 keys) = dO_w V^T
    __syncwarp();
    score_gradients(s_w, dp_w, p_w, delta_s + warp * kRows, false);
    __syncwarp();
    add_rows_times<HS>(dq, p_w, k_s);  // dQ_w += dS K (times scale at the end)
  }
  float* res_w = sh.res_w;
  for (int n = 0; n < HS / 16; ++n) wmma::store_matrix_sync(res_w + n * 16, dq[n], LR, wmma::mem_row_major);
  __syncwarp();
  store_rows<HS>(dqkv + long(b) * T * d3 + long(h) * HS, d3, res_w, q0 + warp * kRows, T, scale);
#else
  __trap();
#endif
}

// WMMA's rules for the padded layouts, for every head size: ldm a multiple of 8
// (bf16) or 4 (fp32) elements; every fragment pointer (a warp's 16 rows on, 16
// columns on) and every buffer carved from shared memory on 32 bytes.
template <int HS>
constexpr bool wmma_layouts_hold() {
  return tile_ld<HS>() % 8 == 0 && kScoreLd % 4 == 0 && kProbLd % 8 == 0 && result_ld<HS>() % 4 == 0 &&
         (16 * tile_ld<HS>() * 2) % 32 == 0 && (16 * kScoreLd * 4) % 32 == 0 &&
         (16 * kProbLd * 2) % 32 == 0 && (16 * result_ld<HS>() * 4) % 32 == 0 &&
         (kTile * tile_ld<HS>() * 2) % 32 == 0 && (kTile * kScoreLd * 4) % 32 == 0 &&
         (kTile * kProbLd * 2) % 32 == 0 && (kTile * result_ld<HS>() * 4) % 32 == 0;
}
static_assert(wmma_layouts_hold<16>() && wmma_layouts_hold<32>() && wmma_layouts_hold<64>() &&
                  wmma_layouts_hold<128>(),
              "flash attention's padded shared-memory layouts break WMMA's alignment rules");
// What docs/models.md and flash_attention.hpp say of the largest.
static_assert(backward_smem<128>() == 150272 && forward_smem<128>() == 113664,
              "head size 128's shared memory");

// Whether a matrix's rows may be read 4 floats at a time (load_tile's vec): its
// start on 16 bytes; its rows' lengths (d, 3d) and the heads' offsets are multiples
// of the head size, itself of 16.
bool aligned16(const float* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// The kernel's shared memory above 48 KiB is asked for once per kernel.
template <class Kernel>
void allow_smem(Kernel kernel, int bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <int HS>
void forward_hs(const AttentionDims& a, const float* qkv, float* o, float* stats, cudaStream_t stream) {
  static const bool ready = (allow_smem(forward_kernel<HS>, forward_smem<HS>()), true);
  (void)ready;
  const dim3 grid(unsigned((a.T + kTile - 1) / kTile), unsigned(a.heads), unsigned(a.B));
  forward_kernel<HS><<<grid, kThreads, forward_smem<HS>(), stream>>>(
      qkv, o, stats, int(a.T), int(a.heads), a.causal, float(1.0 / std::sqrt(double(HS))), aligned16(qkv));
  CUDA_CHECK(cudaGetLastError());
}

template <int HS>
void backward_hs(const AttentionDims& a, const float* qkv, const float* d_o, const float* stats,
                 const float* delta, float* dqkv, cudaStream_t stream) {
  static const bool ready = (allow_smem(dkdv_kernel<HS>, backward_smem<HS>()),
                             allow_smem(dq_kernel<HS>, backward_smem<HS>()), true);
  (void)ready;
  const dim3 grid(unsigned((a.T + kTile - 1) / kTile), unsigned(a.heads), unsigned(a.B));
  const float scale = float(1.0 / std::sqrt(double(HS)));
  const bool vec = aligned16(qkv) && aligned16(d_o);
  dkdv_kernel<HS><<<grid, kThreads, backward_smem<HS>(), stream>>>(qkv, d_o, stats, delta, dqkv, int(a.T),
                                                                   int(a.heads), a.causal, scale, vec);
  CUDA_CHECK(cudaGetLastError());
  dq_kernel<HS><<<grid, kThreads, backward_smem<HS>(), stream>>>(qkv, d_o, stats, delta, dqkv, int(a.T),
                                                                 int(a.heads), a.causal, scale, vec);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool flash_attention_supported(std::int64_t head_size) {
  int smem = 0;
  switch (head_size) {
    case 16:
      smem = std::max(forward_smem<16>(), backward_smem<16>());
      break;
    case 32:
      smem = std::max(forward_smem<32>(), backward_smem<32>());
      break;
    case 64:
      smem = std::max(forward_smem<64>(), backward_smem<64>());
      break;
    case 128:
      smem = std::max(forward_smem<128>(), backward_smem<128>());
      break;
    default:
      return false;
  }
  static const int optin = [] {
    int device = 0, bytes = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return bytes;
  }();
  static const bool sm80 = [] {  // the binary this GPU runs has the kernels' code
    cudaFuncAttributes attributes{};
    CUDA_CHECK(cudaFuncGetAttributes(&attributes, forward_kernel<64>));
    return attributes.binaryVersion >= 80;
  }();
  return sm80 && smem <= optin;
}

void flash_attention_forward(const AttentionDims& a, const float* qkv, float* o, float* stats,
                             cudaStream_t stream) {
  if (a.B == 0 || a.T == 0) return;
  DDP_REQUIRE(a.B <= 65535 && a.heads <= 65535,
              "flash attention: " << a.B << " samples of " << a.heads
                                  << " heads: at most 65535 of each (a grid dimension)");
  const auto launch = kernel_trace::cuda_launch("flash attention forward", "bf16");
  switch (a.head_size) {
    case 16:
      return forward_hs<16>(a, qkv, o, stats, stream);
    case 32:
      return forward_hs<32>(a, qkv, o, stats, stream);
    case 64:
      return forward_hs<64>(a, qkv, o, stats, stream);
    case 128:
      return forward_hs<128>(a, qkv, o, stats, stream);
    default:
      DDP_FATAL("flash attention: head size " << a.head_size << " is not 16, 32, 64 or 128");
  }
}

void flash_attention_backward(const AttentionDims& a, const float* qkv, const float* o, const float* d_o,
                              const float* stats, float* delta, float* dqkv, cudaStream_t stream) {
  if (a.B == 0 || a.T == 0) return;
  DDP_REQUIRE(a.B <= 65535 && a.heads <= 65535,
              "flash attention: " << a.B << " samples of " << a.heads
                                  << " heads: at most 65535 of each (a grid dimension)");
  const auto launch = kernel_trace::cuda_launch("flash attention backward", "bf16");
  const long rows = long(a.B) * a.heads * a.T;
  const long blocks = (rows + 255) / 256;
  delta_kernel<<<unsigned(blocks < 65535 ? blocks : 65535), 256, 0, stream>>>(o, d_o, delta, rows, int(a.T),
                                                                              int(a.heads), int(a.head_size));
  CUDA_CHECK(cudaGetLastError());
  switch (a.head_size) {
    case 16:
      return backward_hs<16>(a, qkv, d_o, stats, delta, dqkv, stream);
    case 32:
      return backward_hs<32>(a, qkv, d_o, stats, delta, dqkv, stream);
    case 64:
      return backward_hs<64>(a, qkv, d_o, stats, delta, dqkv, stream);
    case 128:
      return backward_hs<128>(a, qkv, d_o, stats, delta, dqkv, stream);
    default:
      DDP_FATAL("flash attention: head size " << a.head_size << " is not 16, 32, 64 or 128");
  }
}

}  // namespace ddp::cuda
