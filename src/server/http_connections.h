// The server's connections: accepting them, reading each request under a deadline, and keeping
// a connection open for the next (pipelined) request.
//
// cpp-httplib 0.11 parses requests and writes responses well, but its connection handling does
// not hold up to clients that misbehave: it reads with a per-read timeout only (a client that
// trickles a byte a second holds a thread forever), runs connections on a fixed thread pool (20
// such clients leave /health unanswered), makes a new read buffer per request on a kept-alive
// connection (so pipelined requests after the first are lost), binds with SO_REUSEPORT (a second
// server on the same port starts and shares the traffic) and advertises "max=5" as a constant.
// Its request parser is reachable as Server::process_request(Stream&, ...), so this file keeps
// the parser and supplies the rest:
//
//  - one thread per connection, up to max_connections, so a slow client only ever holds its own
//    thread; past the cap, health_reserve more connections may each ask one thing, /health (so
//    an operator's health check is answered when the cap is full: anything else gets a 503), and
//    beyond those an immediate 503;
//  - a DeadlineStream over the socket with one buffer for the connection's life (pipelining), a
//    deadline for the request line and headers (header_timeout_s from the first byte) and a cap
//    on their size, and a deadline for the body that the server sets once it knows the size;
//  - keep-alive: the next request must start within idle_timeout_s; at most keep_alive_max
//    requests per connection, and the Keep-Alive header says how many remain;
//  - the listening socket bound without SO_REUSEPORT (a second server gets "address in use");
//  - the body's framing checked before it is read (framing_error(): RFC 9112 §6): a request with
//    both Content-Length and Transfer-Encoding, conflicting Content-Lengths, a transfer coding
//    other than chunked, a body on a method that takes none, or a header name that is not a
//    token is refused and its connection closed, because where its body ends is in doubt and the
//    bytes after it must not be read as another request (request smuggling).
//
// The HTTP handlers reach their connection through current_connection() (a thread-local set
// while a request is processed): to set the body deadline, to learn that a read timed out (408)
// or the headers were too long (431), to ask that the connection be closed after the response
// (HTTP/1.0 streams, refused bodies), and to learn that it is a reserve connection (/health only).
// A `prepare` hook given to the loop sees each request, mutable, after its headers and before
// routing (the server checks its Range there, where the ranges can still be changed).
#pragma once

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

namespace deltafin::server {

// Every limit the connection layer applies (docs/SERVER.md lists them).
struct ConnectionLimits {
  double header_timeout_s = 10;         // request line + headers, from their first byte
  double body_floor_s = 10;             // a body may always take this long ...
  double body_min_bytes_per_s = 65536;  // ... plus its size at this rate
  double idle_timeout_s = 5;            // a kept-alive connection waits this long for a request
  double write_timeout_s = 30;          // one write that makes no progress for this long fails
  size_t max_header_bytes = 64 * 1024;  // request line + headers
  int max_connections = 512;            // open at once (each has its own thread)
  int health_reserve = 8;               // more connections past the cap, for /health only
  int keep_alive_max = 100;             // requests per connection
};

// A refusal decided before routing: the handlers answer it instead of routing the request.
struct Refusal {
  int status = 0;  // 0: none
  std::string code, message;
  std::string content_range;  // for a 416: "bytes */SIZE"
  bool close = false;         // close the connection after the answer
};

// Why the framing of `req`'s body (RFC 9112 §6) is refused, or nothing when it is sound.
std::optional<Refusal> framing_error(const httplib::Request& req);

// What a request's handlers know about (and ask of) their connection.
struct ConnectionContext {
  enum class Phase { headers, body, handling };
  Phase phase = Phase::headers;
  double deadline = 0;  // for reads in the current phase (now_seconds())
  size_t header_bytes = 0;
  bool timed_out = false;        // a read passed its deadline (the response is a 408)
  bool header_overflow = false;  // the headers passed max_header_bytes (431)
  bool close_after = false;      // close the connection after this response
  int remaining = 0;             // requests this connection may make after this one
  const ConnectionLimits* limits = nullptr;
  int fd = -1;           // the connection's socket (the handlers' ConnectionProbe polls it)
  bool reserve = false;  // past max_connections: only /health is answered, then it closes
  Refusal refusal;       // set by the prepare hook: answered instead of routing

  // The headers are read; the body (of `bytes`, or up to `bytes` when its size is not declared)
  // may take body_floor_s + bytes / body_min_bytes_per_s.
  void begin_body(uint64_t bytes);
  // The request is read: no read deadline while the handler runs.
  void begin_handling();
};

// The connection of the request this thread is processing (nullptr outside one).
ConnectionContext* current_connection();

// httplib::Server with its request parser reachable.
class ExposedServer : public httplib::Server {
 public:
  using httplib::Server::process_request;
};

class ConnectionLoop {
 public:
  // Sees each request after its headers, before routing (httplib's setup_request).
  using Prepare = std::function<void(httplib::Request&, ConnectionContext&)>;

  ConnectionLoop(ExposedServer& server, const ConnectionLimits& limits, Prepare prepare = {});
  ~ConnectionLoop();

  // Binds host:port (0: any free port) without SO_REUSEPORT; returns the port. Throws Error
  // naming the address and the reason ("address already in use").
  int bind(const std::string& host, int port);
  // Accepts connections on a background thread.
  void start();
  // Stops accepting, ends every connection (their reads and writes fail) and waits for them.
  void stop();

 private:
  void accept_loop();
  void serve(int fd, bool reserve);

  ExposedServer& server_;
  ConnectionLimits limits_;
  Prepare prepare_;
  int listen_fd_ = -1;
  std::thread acceptor_;
  std::atomic<bool> stopping_{false};
  std::mutex m_;
  std::condition_variable cv_;
  std::set<int> open_;    // connection sockets being served (reserve ones included)
  int reserve_open_ = 0;  // of which past max_connections (/health only)
};

}  // namespace deltafin::server
