#pragma once
// What the racecheck's three sources share (nothing else includes it): racecheck.cpp (the shadow and
// happens-before core), racecheck_hopper.cpp (the Hopper rules), racecheck_reports.cpp (the reports).
// The model they implement is described in racecheck.h.
#include "racecheck.h"

namespace selfattn::sim::detail::race {

// ---- happens-before ------------------------------------------------------------------------------

// Whether the access recorded as `earlier` is ordered before an access by `now` (not in flight;
// both of the running block).
inline bool ordered(const BlockState& b, Stamp earlier, Stamp now) {
  const unsigned e = thread_of(earlier), n = thread_of(now);
  if (e >= b.threads.size()) {
    // A landed TMA write (its barrier's agent): ordered only through a phase it counted, acquired by
    // this thread or by one a __syncthreads since put before it (on_barrier joins the agents'
    // entries). A __syncthreads alone is no such promise: nothing may have waited for the write.
    if (!b.vector_clocks) return false;  // never: agents come with the vector clocks
    const VectorClock& vc = b.clocks[n];
    return e < vc.size() && clock_of(earlier) <= vc[e];
  }
  if (epoch_of(earlier) < epoch_of(now)) return true;  // a __syncthreads lies between them
  if (e == n) return true;  // program order
  if (__builtin_expect(b.vector_clocks, 0)) {
    const VectorClock& vc = b.clocks[n];
    return e < vc.size() && clock_of(earlier) <= vc[e];
  }
  if ((e ^ n) / kWarpSize != 0) return false;
  const WarpClocks& w = b.warps[n / kWarpSize];
  return w.epoch == epoch_of(now) && clock_of(earlier) <= w.vc[n % kWarpSize][e % kWarpSize];
}

// Records a shared-memory hazard as the block's, unless it already has one (racecheck.cpp).
void found_shared(BlockState& b, size_t offset, Stamp earlier, uint64_t earlier_site, Stamp later,
                  uint64_t later_site, bool missing_proxy_fence = false);

// ---- what a site records (see site() in racecheck.h) ---------------------------------------------
// The access's Kind.
inline Kind kind_of(uint64_t site) { return Kind(site >> 56); }
// Whether an access of that Kind writes the bytes.
inline bool writes(Kind kind) { return kind == Kind::write || kind == Kind::cp_async_write || kind == Kind::tma_write; }

}  // namespace selfattn::sim::detail::race
