#pragma once
// The one header of View aliases. Activations are flat buffers plus a shape whose
// first dimension is the batch. A buffer is allocated for the largest batch seen
// and reused after, so a smaller (last) batch uses a prefix of it and a steady-state
// step allocates nothing.

#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/backend.hpp"  // Layout

namespace ddp {

using ExecSpace = Kokkos::DefaultExecutionSpace;
// Kernels take their functor as a launch parameter (Kokkos's light-weight launch),
// not through constant memory, whose staging waits on an event and copies from a
// host buffer at each launch: no CUDA graph could capture that (train.cuda_graph).
// No effect on the host.
using LaunchHint = Kokkos::Experimental::WorkItemProperty::HintLightWeight_t;
using Range = Kokkos::RangePolicy<ExecSpace, LaunchHint>;
// Ranges over (rows, columns) and (a, rows, columns) of row-major data, the last index
// the fast one on the GPU too: Kokkos's CUDA tiles put threadIdx.x on the first index
// whatever the iteration order, and its default tiles (16 x 2) gave a warp 16 rows of
// 2 columns; tiles of one row by 256 columns (rank 3: 64, a block's z being at most
// 64 threads, which Kokkos clamps to while its loop still strides by the tile) give
// it 32 neighbouring columns. The host keeps Kokkos's own tiles.
using Rows2 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<2>, LaunchHint>;
using Rows3 = Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>, LaunchHint>;
inline Rows2 rows_range(std::int64_t rows, std::int64_t columns) {
#if defined(KOKKOS_ENABLE_CUDA)
  return Rows2({0, 0}, {rows, columns}, {1, 256});
#else
  return Rows2({0, 0}, {rows, columns});
#endif
}
inline Rows3 rows_range(std::int64_t a, std::int64_t rows, std::int64_t columns) {
#if defined(KOKKOS_ENABLE_CUDA)
  return Rows3({0, 0, 0}, {a, rows, columns}, {1, 1, 64});
#else
  return Rows3({0, 0, 0}, {a, rows, columns});
#endif
}
using View1 = Kokkos::View<float*>;
using ConstView1 = Kokkos::View<const float*>;
using LabelView = Kokkos::View<std::int32_t*>;
using Shape = std::vector<std::int64_t>;

// Product of the dimensions; 1 for a scalar shape {}.
std::int64_t shape_numel(const Shape& shape);
// "(1, 28, 28)"
std::string shape_str(const Shape& shape);

struct Tensor {
  View1 data;   // at least storage_numel() elements; only that prefix is meaningful
  Shape shape;  // (B, sample...), in PyTorch's order whatever the layout
  Layout layout = Layout::nchw;
  // The elements' type: fp32, or bf16/fp16 packed two to a float of `data` where the
  // model keeps an activation narrow (model/elements.hpp reads and writes them).
  Precision type = Precision::fp32;

  std::int64_t numel() const { return shape.empty() ? 0 : shape_numel(shape); }
  // Elements the layout occupies: numel() but for a blocked layout's padding channels.
  std::int64_t storage_numel() const;
  // Floats of `data` those elements take: half as many (rounded up) where narrow.
  std::int64_t storage_floats() const {
    return type == Precision::fp32 ? storage_numel() : (storage_numel() + 1) / 2;
  }
  std::int64_t batch() const { return shape[0]; }
  std::int64_t sample_numel() const {
    std::int64_t n = 1;
    for (std::size_t i = 1; i < shape.size(); ++i) n *= shape[i];
    return n;
  }
};

// Ends the run with one line (DDP_REQUIRE) where t is not of `type` in nchw, naming the
// layer and the tensor: "attention: the input is bf16 in nchw, not fp32 in nchw".
void require_nchw(const Tensor& t, Precision type, const char* layer, const char* what);

// The floats a (batch, sample...) tensor in `layout` of `type` takes (storage_floats):
// what the start-up memory plan counts for a buffer that is not there yet.
std::int64_t planned_floats(std::int64_t batch, const Shape& sample, Layout layout, Precision type);

// A new buffer of n floats (zeroed unless `uninitialised`) whose first float lies at
// a different offset within a 4 KB page from the buffers made before it, on the host.
// Large allocations all start at the same page offset (page-aligned plus the same
// header), and a load from one buffer that follows a store to another at the same
// offset modulo 4 KB waits as if it depended on it (4K aliasing): a GEMM reading
// one and writing the other, or the optimizer reading the gradients and writing the
// parameters, runs up to 1.75x slower, as allocation history decides. Consecutive
// buffers start 1,088 bytes apart modulo 4 KB (64 offsets in turn; up to 4 KB more
// memory each). On a GPU: a plain View (its kernels want 256-byte aligned operands).
View1 make_buffer(const std::string& label, std::int64_t n, bool uninitialised = false);
// Off: the host's buffers too are plain Views of n floats, as a GPU's are (the memory
// plan's tests count the floats a layer allocates, exactly). On unless set.
void set_buffer_skew(bool on);

// Make t a (batch, sample...) tensor in `layout` of elements of `type`. Its buffer
// grows (a new View named `label`) only when too small; the shape vector keeps its
// capacity, so a repeated call allocates nothing.
void resize(Tensor& t, std::int64_t batch, const Shape& sample, const char* label,
            Layout layout = Layout::nchw, Precision type = Precision::fp32);
// Make t the shape, layout and type of `like` (same rules), or of `type`.
void resize_like(Tensor& t, const Tensor& like, const char* label);
void resize_like(Tensor& t, const Tensor& like, Precision type, const char* label);

// Scratch shared by every layer of the process. A layer's temporaries (a transformer
// block's gradients between its parts and the outputs only its sums take; attention's
// dO, dQKV and dS, and on its block path one block's scores) live only while its
// forward or backward runs, and layers run one at a time, so one buffer a slot serves
// them all, grown to the largest asked. ViT-B/16's peak on the CPU build grows by 156
// MB a sample, by 275 with buffers of each layer's own: at batch 256 some 30 GB less.
// Slots in use at once in one call are distinct. A layer points its views at its
// slots as the call starts (resize then finds them large enough) and lets go of them
// as it ends (SharedScratch), so that a slot grown later frees its old buffer.
// Released at Kokkos's finalize.
enum class ScratchSlot {
  // TransformerBlock's: backward's gradients between its parts
  block_df,
  block_dc,
  block_dr,
  block_da,
  // Attention's: backward's gradients, the block path's scores
  attention_do,
  attention_dqkv,
  attention_ds,
  attention_block_scores,
  // The copies of GEMM operands narrowed once (NarrowedOnce): attention's qkv, dO and
  // dS; a layer's output gradient (attention's, then its dqkv; Linear's)
  narrow_qkv,
  narrow_do,
  narrow_ds,
  narrow_dy,
  count
};
// Slot `slot`, at least `floats` long (a new buffer named `label` where shorter).
View1 shared_scratch(ScratchSlot slot, std::int64_t floats, const char* label);
// The floats each slot is asked for at most: the start-up memory plan's
// (Layer::scratch_floats).
using SlotFloats = std::array<std::int64_t, std::size_t(ScratchSlot::count)>;
// Tests: the slots' buffers let go (none may be held), so the next calls make them anew.
void release_shared_scratch();

// A call's hold on its slots: each view points at its slot (at least the floats
// given) while this lives, and is emptied when it ends, so the views must outlive it
// (a layer's members, or locals made before it).
class SharedScratch {
 public:
  SharedScratch() = default;
  SharedScratch(const SharedScratch&) = delete;
  SharedScratch& operator=(const SharedScratch&) = delete;
  ~SharedScratch();
  // A slot already held (a call nested in another holding it) is an error.
  void hold(View1& v, ScratchSlot slot, std::int64_t floats, const char* label);

 private:
  struct Held {
    View1* view;
    ScratchSlot slot;
    const float* at;  // the slot's buffer when held
  };
  std::array<Held, std::size_t(ScratchSlot::count)> held_{};
  std::size_t n_ = 0;
};

// The floats [from, from + n) narrowed once to `precision`'s operand type, in `slot`,
// for the several GEMMs of a call that read them: while this lives, the backend's
// GEMMs read an operand at that precision lying within them from the copy instead of
// narrowing it again (ComputeBackend::narrow_copy). Before, each product of
// attention's keep path narrowed a span of nearly all of qkv (ViT-B/16 at batch 256:
// some 7.5 GB of conversions a layer). Where the backend keeps no copies (the host:
// oneDNN narrows inside its kernels; fp32) nothing is made or held. The floats must
// not change while it lives.
class NarrowedOnce {
 public:
  // at_least: the floats the slot is held for, where a call's copies differ in size
  // (attention's dS a block), so the slot does not grow within a pass and free a
  // buffer a recorded benchmark replay (kernel_trace) still points at.
  NarrowedOnce(ScratchSlot slot, const float* from, std::int64_t n, Precision precision, const char* label,
               std::int64_t at_least = 0);
  ~NarrowedOnce();
  NarrowedOnce(const NarrowedOnce&) = delete;
  NarrowedOnce& operator=(const NarrowedOnce&) = delete;

 private:
  View1 copy_;  // before hold_: the hold empties it as it ends
  SharedScratch hold_;
  const float* from_ = nullptr;  // null: no copy made
};

// Holds that ended with their view on a buffer of its own: a call resized it past
// what it asked its slot for (an allocation every call, outside the slot). 0 where
// every layer asks for enough; SharedScratch's test checks it.
std::int64_t shared_scratch_outgrown();

}  // namespace ddp
