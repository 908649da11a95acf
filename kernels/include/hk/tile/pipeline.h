// hk/tile/pipeline.h: the stage ring under sm_90a matrix kernels, with warp-specialised
// producer and consumer warpgroups.
//
// A matrix kernel walks K in steps; each step's operand blocks go through a ring of kStages
// stages in shared memory. Warpgroup 0 produces: it copies step i's blocks into stage i % kStages
// and says so on that stage's `full` barrier. Warpgroups 1..kConsumers consume: each waits for
// `full`, issues its wgmma over the stage, and once they have read it (wgmma.wait_group) says so
// on the stage's `empty` barrier, which the producer waits for before it refills the stage
// kStages steps later. So copies run kStages - 2 steps ahead of the multiplies, and neither
// side waits for the other except when the ring is full or empty.
//
// A kernel is a Program with these hooks, and the layer does the rest (roles, registers,
// barriers, the ring's memory):
//   template <bool kAsync> void load(Stage&, unsigned step, unsigned thread)
//       start the copies of step `step` (0-based in the block's K range) into the stage, as
//       thread `thread` of the producer's 128: with cp.async (kAsync), or with ordinary loads and
//       stores for rows that are not 16-byte aligned; `bool async_rows()` chooses, once.
//   void multiply(const Stage&, unsigned consumer)
//       issue the consumer warpgroup's wgmma over the stage (the layer fences and commits).
//   void finish(unsigned consumer)
//       the epilogue: the accumulators are complete (hk::tile::wgmma::pin them first).
//
// Why cp.async and not the tensor memory accelerator (TMA, cp.async.bulk.tensor): TMA needs a
// tensor map built on the host for each matrix of each call, and a launch here carries only the
// kernel's declared arguments (pointer, sizes, leading dimensions), checked against its ABI;
// adding host-built maps would change every GEMM's ABI on one target. cp.async writes the same
// swizzled tiles from the same arguments, zero-fills partial blocks itself, and keeps one ABI.
// Its writes are in the generic proxy and wgmma reads through the async proxy, so a producer
// thread fences (fence.proxy.async) after its copies land and before it arrives on `full`.
//
// Register budget: the producer gives registers back (setmaxnreg.dec, to 40 by default) so the
// consumers may take the rest of the block's allocation (setmaxnreg.inc; 232 each for two
// consumers). This needs a kernel capped at one block of (1 + kConsumers) * 128 threads an SM
// (HK_LAUNCH_BOUNDS_MIN_BLOCKS(threads, 1)); ptxas reports that cap (168 registers for two
// consumers) and compiles each role's code within its own count, though not predictably: which
// split leaves a kernel without spills is found by trying (the build fails on spills).
#pragma once

#include "../device.h"
#include "copy.h"
#include "wgmma.h"

#if HK_SM90A

namespace hk::tile {

// An mbarrier (a shared-memory barrier object that threads arrive on and wait for by phase).
class Mbarrier {
 public:
  HK_DEVICE void init(unsigned arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(address()), "r"(arrivals)
                 : "memory");
  }
  // One arrival, ordering the thread's earlier writes before a waiter's later reads.
  HK_DEVICE void arrive() {
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(address())
                 : "memory");
  }
  // Waits until the phase of parity `phase` (0 for the first, 1 for the second, ...) is complete.
  HK_DEVICE void wait(unsigned phase) {
    unsigned done = 0;
    do {
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
          "selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(address()), "r"(phase & 1)
          : "memory");
    } while (!done);
  }

 private:
  HK_DEVICE unsigned address() const { return wgmma::detail::shared_address(&word_); }
  unsigned long long word_;
};

// Makes barriers this thread initialised visible to the block's other threads (and the async
// proxy) before they use them: once, after the inits, followed by a block barrier.
HK_DEVICE void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Orders this thread's generic-proxy shared-memory writes (stores, cp.async) before later
// async-proxy reads (wgmma) that a barrier lets another thread make.
HK_DEVICE void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Turns at the tensor cores for two consumer warpgroups (a ping-pong): each waits for its turn
// before it issues a cluster of products and hands the turn over once they are issued (not
// done), so one's products are queued right behind the other's and each one's register work
// (a softmax, an epilogue) runs while the other's products occupy the tensor cores. (On the
// H200 the attention forward measured the same with and without turns: unsynchronised, its two
// consumers already fell into this order. Turns make it the schedule rather than a tendency.)
//
// Named barriers 1 and 2 (0 is the block barrier), one a consumer: it waits with its 128
// threads (bar.sync) for the other's 128 to arrive (bar.arrive). Consumer 1 hands consumer 0 the
// first turn; consumer 0 takes the last turn handed to it before it exits, so that no barrier
// is left half arrived. Both must take the same number of turns.
struct ConsumerTurns {
  static constexpr unsigned kFirstBarrier = 1, kThreads = 2 * kWarpgroupThreads;
  unsigned consumer;  // 0 or 1

  HK_DEVICE explicit ConsumerTurns(unsigned consumer_) : consumer(consumer_) {
    if (consumer == 1) pass();
  }
  HK_DEVICE void wait() const {
    asm volatile("bar.sync %0, %1;" ::"r"(kFirstBarrier + consumer), "n"(kThreads) : "memory");
  }
  HK_DEVICE void pass() const {
    asm volatile("bar.arrive %0, %1;" ::"r"(kFirstBarrier + (consumer ^ 1)), "n"(kThreads)
                 : "memory");
  }
  HK_DEVICE void finish() const {
    if (consumer == 0) wait();
  }
};

template <class Stage, unsigned kStages_, unsigned kConsumers_, unsigned kProducerRegisters_ = 40>
struct Ring {
  static constexpr unsigned kStages = kStages_, kConsumers = kConsumers_;
  static constexpr unsigned kThreads = (1 + kConsumers) * kWarpgroupThreads;
  // wgmma's 128-byte swizzle works on address bits, so each stage starts on 1024 bytes.
  static constexpr unsigned kAlign = 1024;
  static_assert(sizeof(Stage) % kAlign == 0, "stages of whole 1024-byte units");
  Stage stage[kStages];
  Mbarrier full[kStages], empty[kStages];
  // Registers a producer thread keeps (its copies' addresses), and what a consumer thread may
  // then take: the rest of what the launch gave the block, in setmaxnreg's steps of 8, at most
  // 256. The pool is the launch's allocation (65536 / kThreads rounded down to 8 a thread: 168
  // for three warpgroups, 504 a lane of each warp across the three), not the SM's 65536: a
  // setmaxnreg.inc past the pool waits forever for registers no one frees (a producer of 64
  // and consumers of 224 hung on the H200).
  static constexpr unsigned kProducerRegisters = kProducerRegisters_;
  static constexpr unsigned kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr unsigned kPool = kLaunchRegisters * (1 + kConsumers);
  static constexpr unsigned kConsumerRegisters =
      (kPool - kProducerRegisters) / kConsumers / 8 * 8 > 256
          ? 256
          : (kPool - kProducerRegisters) / kConsumers / 8 * 8;
  static_assert(kProducerRegisters % 8 == 0 && kProducerRegisters >= 24 &&
                    kProducerRegisters <= kLaunchRegisters &&
                    kProducerRegisters + kConsumers * kConsumerRegisters <= kPool,
                "a register split setmaxnreg can make within the launch's allocation");
  // The dynamic shared memory a kernel's contract must give: the ring, and slack to align it.
  static constexpr unsigned kSharedBytes = sizeof(Stage) * kStages + 2 * kStages * 8 + kAlign;

  // The ring, in the launch's dynamic shared memory.
  static HK_DEVICE Ring& in_dynamic_shared();
};

// A kernel's shared state S (tiles wgmma reads first in it), at the first 1024-byte boundary of
// the launch's dynamic shared memory (which the launch aligns to 16 only): the contract gives
// sizeof(S) + 1024.
template <class S> HK_DEVICE S& aligned_dynamic_shared() {
  extern __shared__ __attribute__((aligned(16))) unsigned char pipeline_shared[];
  constexpr unsigned kAlign = 1024;
  const unsigned at = wgmma::detail::shared_address(pipeline_shared);
  return *reinterpret_cast<S*>(pipeline_shared + (kAlign - at % kAlign) % kAlign);
}

template <class Stage, unsigned kStages_, unsigned kConsumers_, unsigned kProducerRegisters_>
HK_DEVICE Ring<Stage, kStages_, kConsumers_, kProducerRegisters_>&
Ring<Stage, kStages_, kConsumers_, kProducerRegisters_>::in_dynamic_shared() {
  return aligned_dynamic_shared<Ring>();
}

// A position in a ring: the stage of a step and the parity of the phase its barriers are in,
// advanced step by step (i % kStages and i / kStages for a ring of 6 cost the producer registers
// it does not have).
template <unsigned kStages> struct StageCursor {
  unsigned slot = 0, phase = 0;
  HK_DEVICE void advance() {
    if (++slot == kStages) {
      slot = 0;
      phase ^= 1;
    }
  }
};

// The register split of a warp-specialised block (see the header): the producer warpgroup
// gives registers back, the consumers take them. Each warpgroup calls its own, once, first.
template <class RingT> HK_DEVICE void as_producer() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(RingT::kProducerRegisters));
}
template <class RingT> HK_DEVICE void as_consumer() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(RingT::kConsumerRegisters));
}

namespace detail {
// The producer: step i into stage i % kStages once the consumers emptied it. With cp.async
// (kAsync) a step's copies are awaited kLag steps later, so kLag + 1 steps' copies are in
// flight; ordinary loads have landed when load() returns. kLag is kStages - 2 at most: a
// consumer frees step j's stage only once it has step j + 1 (its wgmma over j may still run
// while it issues j + 1's), and the producer must publish step j + 1 before it waits for the
// stage of step j + kStages, which is step j's; publishing j + 1 at iteration j + 1 + kLag
// needs j + 1 + kLag < j + kStages.
template <bool kAsync, class RingT, class Program>
HK_DEVICE void produce(RingT& ring, Program& program, unsigned steps, unsigned thread) {
  constexpr unsigned kLag = kAsync ? RingT::kStages - 2 : 0;
  StageCursor<RingT::kStages> write, done;  // the step being copied, the next one to publish
  const auto publish = [&]() HK_INLINE {
    ring.full[done.slot].arrive();
    done.advance();
  };
  for (unsigned i = 0; i < steps; ++i, write.advance()) {
    // From the second round on, the stage's previous step must have been consumed.
    if (i >= RingT::kStages) ring.empty[write.slot].wait(write.phase ^ 1);
    program.template load<kAsync>(ring.stage[write.slot], i, thread);
    if constexpr (kAsync) {
      async_commit();
      if (i >= kLag) {
        async_wait<kLag>();
        fence_async_shared();
        publish();
      }
    } else {
      fence_async_shared();
      publish();
    }
  }
  if constexpr (kAsync) {
    async_wait<0>();
    fence_async_shared();
    for (unsigned i = steps > kLag ? steps - kLag : 0; i < steps; ++i) publish();
  }
}

// A consumer: multiplies step i once it is full; frees the stage of step i - 1 once its own
// wgmma over it are done (one group may stay in flight, so issue runs ahead of the math).
template <class RingT, class Program>
HK_DEVICE void consume(RingT& ring, Program& program, unsigned steps, unsigned consumer) {
  const bool leader = thread_idx_x() % kWarpgroupThreads == 0;
  StageCursor<RingT::kStages> read;
  unsigned previous = 0;  // the stage of step i - 1
  for (unsigned i = 0; i < steps; ++i, read.advance()) {
    ring.full[read.slot].wait(read.phase);
    wgmma::fence();
    program.multiply(ring.stage[read.slot], consumer);
    wgmma::commit();
    wgmma::wait<1>();
    if (i > 0 && leader) ring.empty[previous].arrive();
    previous = read.slot;
  }
  wgmma::wait<0>();
}
}  // namespace detail

// Runs `program` over `steps` K steps with the ring in dynamic shared memory (see the header).
// Every thread of the block calls it; a block with no steps must not (it would still finish).
template <class RingT, class Program> HK_DEVICE void run_pipeline(Program& program, unsigned steps) {
  RingT& ring = RingT::in_dynamic_shared();
  const unsigned thread = thread_idx_x();
  if (thread == 0) {
#pragma unroll
    for (unsigned s = 0; s < RingT::kStages; ++s) {
      ring.full[s].init(kWarpgroupThreads);
      ring.empty[s].init(RingT::kConsumers);
    }
    fence_barrier_init();
  }
  block_sync();
  const unsigned role = thread / kWarpgroupThreads;
  if (role == 0) {
    as_producer<RingT>();
    if (program.async_rows())
      detail::produce<true>(ring, program, steps, thread);
    else
      detail::produce<false>(ring, program, steps, thread);
  } else {
    as_consumer<RingT>();
    detail::consume(ring, program, steps, role - 1);
    program.finish(role - 1);
  }
}

// The operand half of a C = A·Bᵀ program (A [M][K], B [N][K], both K-major): a kTileM x kTileN
// block of C, K in steps of one 128-byte swizzled row (64 16-bit or 128 8-bit elements),
// consumers of 64 rows each, multiplying with wgmma m64n{kTileN}. A kernel derives from it and
// adds its own start (the accumulators' first values) and finish (the epilogue).
template <typename T, unsigned kTileM_, unsigned kTileN_, unsigned kStages_> struct WgmmaNt {
  static constexpr unsigned kTileM = kTileM_, kTileN = kTileN_, kStages = kStages_;
  static constexpr unsigned kTileK = 128 / sizeof(T);
  struct Stage {
    SharedTile<T, kTileM, kTileK> a;
    SharedTile<T, kTileN, kTileK> b;
  };
  using Ring = hk::tile::Ring<Stage, kStages, kTileM / 64>;
  static constexpr unsigned kThreads = Ring::kThreads;
  using Acc = typename wgmma::Kind<T>::Acc;

  GlobalMatrix<T> ga, gb;
  unsigned row0, col0;  // the block's corner in C
  Acc acc[kTileN / 2];

  static HK_DEVICE unsigned steps(unsigned k) { return (k + kTileK - 1) / kTileK; }

  HK_DEVICE bool async_rows() const { return ga.vector_rows() && gb.vector_rows(); }

  template <bool kAsync> HK_DEVICE void load(Stage& s, unsigned step, unsigned thread) {
    const unsigned k0 = step * kTileK;
    if constexpr (kAsync) {
      copy_async_lean<kWarpgroupThreads>(s.a, ga, row0, k0, thread);
      copy_async_lean<kWarpgroupThreads>(s.b, gb, col0, k0, thread);
    } else {
      copy_elements_lean<kWarpgroupThreads>(s.a, ga, row0, k0, thread);
      copy_elements_lean<kWarpgroupThreads>(s.b, gb, col0, k0, thread);
    }
  }

  HK_DEVICE void multiply(const Stage& s, unsigned consumer) {
#pragma unroll
    for (unsigned kk = 0; kk < kTileK; kk += wgmma::Kind<T>::kK)
      wgmma::mma<T, kTileN>(acc, wgmma::descriptor(s.a, 64 * consumer, kk),
                            wgmma::descriptor(s.b, 0, kk), 1);
  }

  // Calls f(row, column, v) for the pairs of neighbouring sums acc[v], acc[v + 1] of the
  // calling consumer thread (row, column: the first one's place in C).
  template <typename F> HK_DEVICE void for_each_pair(unsigned consumer, F f) const {
#pragma unroll
    for (unsigned v = 0; v < kTileN / 2; v += 2)
      f(row0 + 64 * consumer + wgmma::Layout::row(v), col0 + wgmma::Layout::col(v), v);
  }
};

// The epilogue's stores: C[row][column] = value(v, row, column) for every sum v of the calling
// consumer thread inside m x n, two neighbouring columns as one 4- or 8-byte store where C's
// rows allow (ldc even, c aligned): about a tenth faster than one at a time on the H100.
template <typename Out, class Program, typename F>
HK_DEVICE void store_pairs(Out* c, unsigned m, unsigned n, unsigned ldc, const Program& program,
                           unsigned consumer, F value) {
  using Word = __typeof__(__builtin_choose_expr(sizeof(Out) == 2, 0u, 0ull));
  static_assert(sizeof(Word) == 2 * sizeof(Out), "C of 16- or 32-bit elements");
  const bool pairs = ldc % 2 == 0 && reinterpret_cast<unsigned long long>(c) % sizeof(Word) == 0;
  program.for_each_pair(consumer, [&](unsigned row, unsigned column, unsigned v) HK_INLINE {
    if (row >= m) return;
    Out* to = c + static_cast<unsigned long long>(row) * ldc + column;
    // Columns past n are never valued: a value may read per-column data (scales, bias).
    const Pack<Out, 2> two{{from_float<Out>(column < n ? value(v, row, column) : 0.0f),
                            from_float<Out>(column + 1 < n ? value(v + 1, row, column + 1) : 0.0f)}};
    if (pairs && column + 1 < n) {
      *reinterpret_cast<Word*>(to) = __builtin_bit_cast(Word, two);
    } else {
      if (column < n) to[0] = two.elem[0];
      if (column + 1 < n) to[1] = two.elem[1];
    }
  });
}

}  // namespace hk::tile

#endif  // HK_SM90A
