// Connection probe (see connection_probe.h).
#include "server/connection_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace deltafin::server {

namespace {

bool address_of(const sockaddr_storage& ss, std::string& addr, int& port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    if (inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf) == nullptr) return false;
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf) == nullptr) return false;
    port = ntohs(a->sin6_port);
  } else {
    return false;
  }
  addr = buf;
  return true;
}

}  // namespace

ConnectionProbe::ConnectionProbe(std::string remote_addr, int remote_port, int local_port, int fd)
    : remote_addr_(std::move(remote_addr)),
      remote_port_(remote_port),
      local_port_(local_port),
      fd_(fd),
      searched_(fd >= 0) {}

bool ConnectionProbe::matches(int fd) const {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage local{}, peer{};
  socklen_t ll = sizeof local, pl = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) return false;
  std::string la, pa;
  int lp = 0, pp = 0;
  if (!address_of(local, la, lp) || !address_of(peer, pa, pp)) return false;
  if (lp != local_port_ || pp != remote_port_) return false;
  // httplib may print an IPv4-mapped peer either way; the ports already pin the connection.
  return pa == remote_addr_ || pa.find(remote_addr_) != std::string::npos ||
         remote_addr_.find(pa) != std::string::npos;
}

void ConnectionProbe::find() {
  searched_ = true;
  if (remote_port_ <= 0 || local_port_ <= 0) return;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const int fd = std::atoi(e->d_name);
      if (fd != dirfd(d) && matches(fd)) {
        fd_ = fd;
        break;
      }
    }
    closedir(d);
    return;
  }
  const long max_fd = std::min(sysconf(_SC_OPEN_MAX), 65536L);
  for (int fd = 0; fd < max_fd; ++fd) {
    if (matches(fd)) {
      fd_ = fd;
      return;
    }
  }
}

bool ConnectionProbe::closed() {
  if (!searched_) find();
  if (fd_ < 0) return false;
  if (!matches(fd_)) return true;  // httplib closes the socket only after the handler returns
  pollfd p{fd_,
           POLLIN
#ifdef POLLRDHUP
               | POLLRDHUP
#endif
           ,
           0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLHUP | POLLERR)) != 0) return true;
#ifdef POLLRDHUP
  if ((p.revents & POLLRDHUP) != 0) return true;
#endif
  if ((p.revents & POLLIN) != 0) {
    char c;
    const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0;
  }
  return false;
}

}  // namespace deltafin::server
