// Connections under deadlines, a thread each, kept alive with one buffer (see http_connections.h).
#include "server/http_connections.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"

namespace deltafin::server {

namespace {

thread_local ConnectionContext* t_current = nullptr;

constexpr double kForever = std::numeric_limits<double>::infinity();

// Milliseconds until `deadline` for poll(): at least 0, at most 1 s (so a stopping server is
// noticed), -1 never.
int poll_ms(double deadline) {
  const double left = deadline - now_seconds();
  if (left <= 0) return 0;
  return static_cast<int>(std::min(1000.0, std::ceil(left * 1000.0)));
}

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  const int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                      : ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (rc != 0) return;
  char host[NI_MAXHOST] = {0};
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, nullptr, 0,
                    NI_NUMERICHOST) == 0) {
    ip = host;
  }
  if (addr.ss_family == AF_INET)
    port = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  else if (addr.ss_family == AF_INET6)
    port = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
}

// The socket as httplib's parser sees it: reads come from one buffer that lives as long as the
// connection (bytes of a pipelined next request stay in it) and fail once the context's
// deadline has passed or the headers grow past their cap.
class DeadlineStream : public httplib::Stream {
 public:
  DeadlineStream(int fd, ConnectionContext& ctx, const std::atomic<bool>& stopping)
      : fd_(fd), ctx_(ctx), stopping_(stopping) {}

  bool buffered() const { return pos_ < buf_.size(); }

  // Waits until a byte can be read or `deadline` passes; false on timeout, EOF or error.
  bool wait_readable(double deadline) {
    while (!buffered()) {
      if (stopping_.load()) return false;
      if (now_seconds() >= deadline) return false;
      pollfd p{fd_, POLLIN, 0};
      const int rc = ::poll(&p, 1, poll_ms(deadline));
      if (rc < 0 && errno != EINTR) return false;
      if (rc > 0) return fill() > 0;
    }
    return true;
  }

  bool is_readable() const override { return buffered() || readable_now(); }
  // httplib asks before each write of a response body: wait as long as one write may stall.
  bool is_writable() const override {
    const double deadline = now_seconds() + ctx_.limits->write_timeout_s;
    while (!stopping_.load() && now_seconds() < deadline) {
      pollfd p{fd_, POLLOUT, 0};
      const int rc = ::poll(&p, 1, poll_ms(deadline));
      if (rc < 0 && errno != EINTR) return false;
      if (rc > 0) return (p.revents & POLLOUT) != 0 && (p.revents & (POLLERR | POLLHUP)) == 0;
    }
    return false;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (size == 0) return 0;
    if (!buffered()) {
      if (!wait_readable(ctx_.deadline)) {
        if (now_seconds() >= ctx_.deadline) ctx_.timed_out = true;
        return -1;
      }
    }
    size_t n = std::min(size, buf_.size() - pos_);
    if (ctx_.phase == ConnectionContext::Phase::headers) {
      if (ctx_.header_bytes + n > ctx_.limits->max_header_bytes) {
        ctx_.header_overflow = true;
        return -1;
      }
      ctx_.header_bytes += n;
    }
    std::memcpy(ptr, buf_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    double stall_deadline = now_seconds() + ctx_.limits->write_timeout_s;
    while (done < size) {
      if (stopping_.load()) return -1;
      pollfd p{fd_, POLLOUT, 0};
      const int rc = ::poll(&p, 1, poll_ms(stall_deadline));
      if (rc < 0 && errno != EINTR) return -1;
      if (rc == 0) {
        if (now_seconds() >= stall_deadline) return -1;  // the client stopped reading
        continue;
      }
      if ((p.revents & (POLLERR | POLLHUP)) != 0) return -1;
      const ssize_t w = ::send(fd_, ptr + done, size - done, MSG_NOSIGNAL);
      if (w < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return -1;
      }
      done += static_cast<size_t>(w);
      stall_deadline = now_seconds() + ctx_.limits->write_timeout_s;
    }
    return static_cast<ssize_t>(done);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address_of(fd_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address_of(fd_, false, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  bool readable_now() const {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }

  ssize_t fill() {
    if (pos_ == buf_.size()) {
      buf_.clear();
      pos_ = 0;
    }
    char tmp[16384];
    ssize_t n;
    do {
      n = ::recv(fd_, tmp, sizeof tmp, 0);
    } while (n < 0 && errno == EINTR);
    if (n > 0) buf_.append(tmp, static_cast<size_t>(n));
    return n;
  }

  int fd_;
  ConnectionContext& ctx_;
  const std::atomic<bool>& stopping_;
  std::string buf_;
  size_t pos_ = 0;
};

// A response written without the parser (it never saw a request to answer): an OpenAI-shaped
// error, then the connection closes.
void write_raw_error(DeadlineStream& s, int status, const char* reason, const std::string& code,
                     const std::string& message) {
  const nlohmann::json body = {{"error",
                                {{"message", message},
                                 {"type", "invalid_request_error"},
                                 {"param", nullptr},
                                 {"code", code}}}};
  const std::string b = body.dump();
  const std::string head = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: "
      "close\r\n\r\n",
      status, reason, b.size());
  s.write(head.data(), head.size());
  s.write(b.data(), b.size());
}

// RFC 9110 §5.6.2: the characters of a token (a header name).
bool is_tchar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         (c != '\0' && std::strchr("!#$%&'*+-.^_`|~", c));
}

// A header value or name fit for an error message: short, printable.
std::string shown(const std::string& s) {
  std::string out;
  for (const char c : s.substr(0, 60)) {
    out += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  }
  return s.size() > 60 ? out + "..." : out;
}

Refusal framing_refusal(int status, const char* code, std::string message) {
  Refusal r;
  r.status = status;
  r.code = code;
  r.message = std::move(message);
  r.close = true;
  return r;
}

}  // namespace

std::optional<Refusal> framing_error(const httplib::Request& req) {
  for (const auto& [name, value] : req.headers) {
    if (name.empty() || !std::all_of(name.begin(), name.end(), is_tchar))
      return framing_refusal(400, "bad_request",
                             fmt::format("the header name \"{}\" is not a token (RFC 9110 §5.1: no "
                                         "whitespace before the colon, no folded lines)",
                                         shown(name)));
  }
  const size_t lengths = req.get_header_value_count("Content-Length");
  const size_t codings = req.get_header_value_count("Transfer-Encoding");
  if (lengths > 0 && codings > 0)
    return framing_refusal(
        400, "bad_request",
        "the request has both Content-Length and Transfer-Encoding, so where its body ends is in "
        "doubt; send one of them (RFC 9112 §6.1)");
  for (size_t i = 1; i < lengths; ++i) {
    const std::string a = req.get_header_value("Content-Length", 0),
                      b = req.get_header_value("Content-Length", i);
    if (a != b)
      return framing_refusal(400, "bad_request",
                             fmt::format("the request has Content-Length headers that disagree "
                                         "(\"{}\" and \"{}\"); send one (RFC 9112 §6.3)",
                                         shown(a), shown(b)));
  }
  if (codings > 0) {
    if (req.version == "HTTP/1.0")
      return framing_refusal(400, "bad_request",
                             "Transfer-Encoding is not defined for an HTTP/1.0 request; send "
                             "Content-Length (RFC 9112 §6.1)");
    std::string te = req.get_header_value("Transfer-Encoding");
    std::transform(te.begin(), te.end(), te.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (codings > 1 || te != "chunked")
      return framing_refusal(501, "unsupported_transfer_encoding",
                             fmt::format("Transfer-Encoding \"{}\"{} is not supported: a request "
                                         "body is sent with Content-Length or as chunked alone",
                                         shown(req.get_header_value("Transfer-Encoding")),
                                         codings > 1 ? " (in several headers)" : ""));
  }
  // httplib reads a body only for these methods; any other one's body would be read as the next
  // request on the connection.
  const bool takes_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
                          req.method == "DELETE";
  if (!takes_body &&
      (codings > 0 || (lengths > 0 && req.get_header_value("Content-Length") != "0")))
    return framing_refusal(
        400, "bad_request",
        fmt::format("a {} request takes no body here, but this one declares {}; send it without",
                    shown(req.method),
                    codings > 0
                        ? "Transfer-Encoding"
                        : "Content-Length " + shown(req.get_header_value("Content-Length"))));
  return std::nullopt;
}

void ConnectionContext::begin_body(uint64_t bytes) {
  phase = Phase::body;
  deadline = now_seconds() + limits->body_floor_s +
             static_cast<double>(bytes) / limits->body_min_bytes_per_s;
}

void ConnectionContext::begin_handling() {
  phase = Phase::handling;
  deadline = kForever;
}

ConnectionContext* current_connection() {
  return t_current;
}

ConnectionLoop::ConnectionLoop(ExposedServer& server, const ConnectionLimits& limits,
                               Prepare prepare)
    : server_(server), limits_(limits), prepare_(std::move(prepare)) {}

ConnectionLoop::~ConnectionLoop() {
  stop();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

// Why host:port cannot be bound ("Address already in use"), found by trying it.
static std::string bind_error(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    return ::gai_strerror(rc);
  std::string why = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    why = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0 ? "the address is unusable"
                                                     : std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return why;
}

int ConnectionLoop::bind(const std::string& host, int port) {
  // httplib binds, so that its server socket is set (its response writers stop when it is not),
  // with our socket options: SO_REUSEADDR only (a restart may bind over connections in
  // TIME_WAIT), never httplib's default SO_REUSEPORT, which lets a second server share the port.
  server_.set_socket_options([this](socket_t fd) {
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd_ = fd;
  });
  const int bound =
      port == 0 ? server_.bind_to_any_port(host) : (server_.bind_to_port(host, port) ? port : -1);
  if (bound < 0) {
    listen_fd_ = -1;
    fail(
        "cannot listen on {}:{}: {} (another server on this port, or not an address of this "
        "machine)",
        host, port, bind_error(host, port));
  }
  ::listen(listen_fd_, 512);  // httplib's backlog is 5
  return bound;
}

void ConnectionLoop::start() {
  acceptor_ = std::thread([this] { accept_loop(); });
}

void ConnectionLoop::stop() {
  if (stopping_.exchange(true)) {
    if (acceptor_.joinable()) acceptor_.join();
    return;
  }
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  std::unique_lock<std::mutex> lock(m_);
  for (const int fd : open_) ::shutdown(fd, SHUT_RDWR);
  cv_.wait(lock, [&] { return open_.empty(); });
}

void ConnectionLoop::accept_loop() {
  while (!stopping_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, 200);
    if (rc <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    const int yes = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    bool reserve = false;
    {
      std::lock_guard<std::mutex> lock(m_);
      const int ordinary = static_cast<int>(open_.size()) - reserve_open_;
      reserve = ordinary >= limits_.max_connections;
      if (stopping_.load() || (reserve && reserve_open_ >= limits_.health_reserve)) {
        ConnectionContext ctx;
        ctx.limits = &limits_;
        DeadlineStream s(fd, ctx, stopping_);
        write_raw_error(s, 503, "Service Unavailable", "too_many_connections",
                        fmt::format("the server has {} connections open, its limit (and {} more "
                                    "for /health); retry shortly",
                                    limits_.max_connections, limits_.health_reserve));
        ::close(fd);
        continue;
      }
      open_.insert(fd);
      if (reserve) ++reserve_open_;
    }
    std::thread([this, fd, reserve] { serve(fd, reserve); }).detach();
  }
}

void ConnectionLoop::serve(int fd, bool reserve) {
  ConnectionContext ctx;
  ctx.limits = &limits_;
  DeadlineStream strm(fd, ctx, stopping_);
  // A reserve connection asks one thing (/health) and closes, so it frees its place at once.
  const int requests = reserve ? 1 : limits_.keep_alive_max;
  // Before routing: a body whose framing is in doubt is refused (and its Range with it, so that
  // httplib does not cut the refusal into ranges); then the server's own check.
  const std::function<void(httplib::Request&)> setup = [&](httplib::Request& req) {
    if (auto f = framing_error(req)) {
      ctx.refusal = std::move(*f);
      req.ranges.clear();
      return;
    }
    if (prepare_) prepare_(req, ctx);
  };
  for (int count = 1; count <= requests && !stopping_.load(); ++count) {
    // The first request may take header_timeout_s to start; a kept-alive one idle_timeout_s.
    const double wait = count == 1 ? limits_.header_timeout_s : limits_.idle_timeout_s;
    if (!strm.wait_readable(now_seconds() + wait)) break;  // idle or gone: close quietly
    ctx = ConnectionContext{};
    ctx.limits = &limits_;
    ctx.fd = fd;
    ctx.deadline = now_seconds() + limits_.header_timeout_s;
    ctx.remaining = requests - count;
    ctx.reserve = reserve;
    const bool last = count == requests;
    bool closed = false;
    t_current = &ctx;
    bool ok = false;
    try {
      ok = server_.process_request(strm, last, closed, setup);
    } catch (const std::exception& e) {
      log_warn("[serve] a connection failed: {}", e.what());
    }
    t_current = nullptr;
    if (!ok && ctx.phase == ConnectionContext::Phase::headers && ctx.header_bytes > 0) {
      // The parser gave up before it could answer (the request line never ended).
      if (ctx.header_overflow) {
        write_raw_error(
            strm, 431, "Request Header Fields Too Large", "headers_too_large",
            fmt::format("the request line and headers exceed {} bytes", limits_.max_header_bytes));
      } else if (ctx.timed_out) {
        write_raw_error(strm, 408, "Request Timeout", "request_timeout",
                        fmt::format("the request headers did not arrive within {} s",
                                    limits_.header_timeout_s));
      }
    }
    if (!ok || closed || ctx.close_after || ctx.timed_out || ctx.header_overflow) break;
  }
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  std::lock_guard<std::mutex> lock(m_);
  open_.erase(fd);
  if (reserve) --reserve_open_;
  cv_.notify_all();
}

}  // namespace deltafin::server
