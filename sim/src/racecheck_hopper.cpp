// The racecheck's Hopper rules (see racecheck.h, the model's items on mbarriers, TMA and wgmma):
// block-wide vector clocks, released into and acquired from mbarrier phases; the TMA agents and
// their writes, in flight from the issue until they land; fence.proxy.async; wgmma's shared-memory
// reads, in flight until performed, and the fence they need after generic-proxy writes. The core
// they build on (the shadow, the happens-before test, barriers) is racecheck.cpp.
#include "racecheck_internal.h"

#include <algorithm>
#include <string>

namespace selfattn::sim::detail::race {

namespace {

// Writes by threads through the generic proxy: an async-proxy read of them needs fence.proxy.async
// (cp.async is a generic-proxy operation of the issuing thread, PTX ISA "cp.async").
bool generic_proxy_write(Kind kind) { return kind == Kind::write || kind == Kind::cp_async_write; }

}  // namespace

// ---- Hopper: vector clocks, TMA writes, the async proxy ----------------------------------------------

void use_vector_clocks(BlockState& b) {
  if (b.vector_clocks) return;
  const unsigned threads = unsigned(b.threads.size());
  b.clocks.resize(threads);
  for (unsigned t = 0; t < threads; ++t) {
    VectorClock& vc = b.clocks[t];
    vc.assign(threads, 0);
    // What the warp clocks know in this barrier interval carries over; the thread's own entry
    // goes on from its stamp's clock, so its earlier records keep their meaning.
    const WarpClocks& w = b.warps[t / kWarpSize];
    if (w.epoch == b.epoch) {
      for (unsigned k = 0; k < kWarpSize && t / kWarpSize * kWarpSize + k < threads; ++k) {
        vc[t / kWarpSize * kWarpSize + k] = w.vc[t % kWarpSize][k];
      }
    }
    vc[t] = clock_of(b.threads[t]->stamp);
  }
  b.vector_clocks = true;
}

void release_into(BlockState& b, unsigned thread, VectorClock& into) {
  VectorClock& vc = b.clocks[thread];
  join(into, vc);
  vc[thread] = std::min(vc[thread] + 1, kMaxClock);
  b.threads[thread]->stamp = make_stamp(b.epoch, thread, vc[thread]);
}

void acquire_from(BlockState& b, unsigned thread, const VectorClock& from) { join(b.clocks[thread], from); }

unsigned new_agent(BlockState& b, uint32_t barrier_offset) {
  const size_t id = b.threads.size() + b.agent_barrier.size();
  if (id >= kMaxThreadIds) {
    throw Error("sim: the racecheck has thread ids for " + std::to_string(kMaxThreadIds - b.threads.size()) +
                " mbarriers in a block of " + std::to_string(b.threads.size()) + " threads; the kernel initialises more");
  }
  b.agent_barrier.push_back(barrier_offset);
  b.agent_clock.push_back(0);
  return unsigned(id);
}

void tma_issued(ThreadState& issuer, size_t offset, size_t bytes, uintptr_t pc) {
  shared_access(issuer, offset, bytes, Kind::tma_write, pc);
}

uint32_t tma_landed(BlockState& b, unsigned agent, size_t offset, size_t bytes, uintptr_t pc) {
  uint32_t& clock = b.agent_clock[agent - b.threads.size()];
  clock = std::min(clock + 1, kMaxClock);
  const Stamp landed = make_stamp(b.epoch, agent, clock);
  const uint64_t where = site(pc, Kind::tma_write);
  const size_t end = std::min(offset + bytes, b.threads.empty() ? 0 : b.threads[0]->smem_bytes);
  for (size_t i = offset; i < end; ++i) {
    // Whatever touched the bytes since the issue was reported then; the write happens now.
    Cell& c = b.cells[i];
    c.write = landed;
    c.read[0] = c.read[1] = 0;
    b.sites[i].write = where;
  }
  return clock;
}

void proxy_fence(ThreadState& t) {
  BlockState& b = *t.block;
  use_vector_clocks(b);
  const unsigned thread = thread_of(t.stamp);
  t.last_fence = t.stamp;
  // Its own entry ticks: an access after the fence has a larger stamp than the fence, one before
  // it a smaller or equal one (the fence-after-write test compares them).
  VectorClock& vc = b.clocks[thread];
  vc[thread] = std::min(vc[thread] + 1, kMaxClock);
  t.stamp = make_stamp(b.epoch, thread, vc[thread]);
}

void async_read_begin(BlockState& b, unsigned thread, size_t offset, size_t bytes, uintptr_t pc) {
  use_vector_clocks(b);
  const Stamp reader = b.threads[thread]->stamp;
  const Stamp mine = reader | kInFlight;
  const Stamp floor = Stamp(b.first_epoch) << 32;
  const uint64_t where = site(pc, Kind::wgmma_read);
  const unsigned block_threads = unsigned(b.threads.size());
  const size_t end = std::min(offset + bytes, b.threads[thread]->smem_bytes);
  for (size_t i = offset; i < end; ++i) {
    Cell& c = b.cells[i];
    if (c.write >= floor) {
      if ((c.write & kInFlight) || !ordered(b, c.write, reader)) {
        found_shared(b, i, c.write, b.sites[i].write, mine, where);
      } else if (generic_proxy_write(kind_of(b.sites[i].write)) && thread_of(c.write) < block_threads) {
        // The writer's last fence must follow the write (same thread: stamps grow in program
        // order) and precede the read in happens-before.
        const Stamp fence = b.threads[thread_of(c.write)]->last_fence;
        if (fence < (c.write & ~kInFlight) || !ordered(b, fence, reader)) {
          found_shared(b, i, c.write, b.sites[i].write, mine, where, /*missing_proxy_fence=*/true);
        }
      }
    }
    if (c.read[0] == mine || c.read[1] == mine) continue;
    // Kept unless both slots hold reads in flight (a third wgmma on the same bytes at once goes
    // unrecorded): a slot that is free or ordered before this read first, else a concurrent plain
    // read gives way (a later write racing only with it is then missed).
    auto in_flight = [&](int r) { return c.read[r] >= floor && (c.read[r] & kInFlight); };
    auto free_or_ordered = [&](int r) { return c.read[r] < floor || (!in_flight(r) && ordered(b, c.read[r], reader)); };
    int slot = free_or_ordered(0) ? 0 : free_or_ordered(1) ? 1 : !in_flight(0) ? 0 : !in_flight(1) ? 1 : -1;
    if (slot < 0) continue;
    c.read[slot] = mine;
    b.sites[i].read[slot] = where;
  }
}

void async_read_end(BlockState& b, unsigned thread, size_t offset, size_t bytes) {
  const Stamp now = b.threads[thread]->stamp;
  const Stamp floor = Stamp(b.first_epoch) << 32;
  const size_t end = std::min(offset + bytes, b.threads[thread]->smem_bytes);
  for (size_t i = offset; i < end; ++i) {
    Cell& c = b.cells[i];
    for (int r = 0; r < 2; ++r) {
      // The read is performed now: a read by `thread` at its current stamp.
      if (c.read[r] >= floor && (c.read[r] & kInFlight) && thread_of(c.read[r]) == thread &&
          kind_of(b.sites[i].read[r]) == Kind::wgmma_read) {
        c.read[r] = now;
      }
    }
  }
}
}  // namespace selfattn::sim::detail::race

// ---- what the primitives' sim twins call ----------------------------------------------------------

namespace selfattn::sim {

using detail::race::t_thread;

void fence_proxy_async() {
  detail::race::ThreadState* t = t_thread;
  if (t == nullptr || !t->checks) return;
  detail::race::proxy_fence(*t);
}

// The twins call these inside a warpgroup collective's combine, run by whichever thread arrived
// last: the block comes from the running thread, the reader is `thread`.
void racecheck_async_read_begin(unsigned thread, const void* address, size_t bytes, const void* site) {
  detail::race::ThreadState* t = t_thread;
  if (t == nullptr || !t->checks) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(address);
  if (p - t->smem_begin >= t->smem_bytes || thread >= t->block->threads.size()) return;
  detail::race::async_read_begin(*t->block, thread, p - t->smem_begin, bytes, reinterpret_cast<uintptr_t>(site));
}

void racecheck_async_read_end(unsigned thread, const void* address, size_t bytes) {
  detail::race::ThreadState* t = t_thread;
  if (t == nullptr || !t->checks) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(address);
  if (p - t->smem_begin >= t->smem_bytes || thread >= t->block->threads.size()) return;
  detail::race::async_read_end(*t->block, thread, p - t->smem_begin, bytes);
}

}  // namespace selfattn::sim
