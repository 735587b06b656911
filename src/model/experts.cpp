#include "model/experts.h"

namespace deltafin {

ExpertStats operator-(const ExpertStats& a, const ExpertStats& b) {
  ExpertStats d;
  d.requests = a.requests - b.requests;
  d.hits = a.hits - b.hits;
  d.misses = a.misses - b.misses;
  d.bytes_read = a.bytes_read - b.bytes_read;
  d.bytes_served = a.bytes_served - b.bytes_served;
  d.prefetch_issued = a.prefetch_issued - b.prefetch_issued;
  d.prefetch_used = a.prefetch_used - b.prefetch_used;
  d.prefetch_wasted_bytes = a.prefetch_wasted_bytes - b.prefetch_wasted_bytes;
  d.io_wait_s = a.io_wait_s - b.io_wait_s;
  d.read_s = a.read_s - b.read_s;
  return d;
}

ExpertStats& operator+=(ExpertStats& a, const ExpertStats& b) {
  a.requests += b.requests;
  a.hits += b.hits;
  a.misses += b.misses;
  a.bytes_read += b.bytes_read;
  a.bytes_served += b.bytes_served;
  a.prefetch_issued += b.prefetch_issued;
  a.prefetch_used += b.prefetch_used;
  a.prefetch_wasted_bytes += b.prefetch_wasted_bytes;
  a.io_wait_s += b.io_wait_s;
  a.read_s += b.read_s;
  return a;
}

}  // namespace deltafin
