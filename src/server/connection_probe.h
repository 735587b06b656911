// Noticing that an HTTP client went away while its request waits or runs.
//
// cpp-httplib 0.11 gives a handler no way to ask whether its connection is still open, and a
// write only fails after the peer is gone *and* something was written. A request waiting in the
// queue or in a long prefill writes nothing, so the probe finds the connection's socket itself:
// the one socket of this process whose local port and peer address match the request's (found
// once, in /proc/self/fd or by trying descriptors), and then polls it without blocking. Only
// positive evidence counts as a disconnect: a hang-up, an error, or end of stream on a read
// peek (so a client that half-closes its side after sending the request counts as gone; HTTP
// clients do not do that). If the socket cannot be found, the probe says "connected" and the
// request still ends by a failed write or its timeout. Under Deltafin's own connection loop the
// handler knows its socket (ConnectionContext::fd) and the probe is given it: no search, so the
// probe never touches (fstat) a descriptor that another connection's thread may be closing.
#pragma once

#include <string>

namespace deltafin::server {

class ConnectionProbe {
 public:
  // fd: the connection's socket when the caller knows it (>= 0), else it is searched for.
  ConnectionProbe(std::string remote_addr, int remote_port, int local_port, int fd = -1);
  // True when the client has closed the connection (or it broke).
  bool closed();

 private:
  bool matches(int fd) const;
  void find();

  std::string remote_addr_;
  int remote_port_, local_port_;
  int fd_ = -1;
  bool searched_ = false;
};

}  // namespace deltafin::server
