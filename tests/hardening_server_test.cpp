// Regression tests for the defects of issue 16 in `deltafin serve`, through the real server on a
// loopback port: slow and oversize requests, a second server on a taken port, pipelining,
// HTTP/1.0 streams, Keep-Alive counts, request validation, the 429 message and the log line of
// streams ended by the timeout. Raw sockets play the misbehaving clients.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "invalid_bodies.h"
#include "server_util.h"
#include "test_util.h"

namespace deltafin::test {
namespace {

using namespace std::chrono_literals;

// A TCP connection that sends exactly the bytes it is given.
class Socket {
 public:
  explicit Socket(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  bool send(const std::string& s) {
    return fd_ >= 0 &&
           ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
  }
  // Everything until the peer closes or `timeout_s` passes.
  std::string read_all(double timeout_s) {
    return pump(timeout_s, [] { return false; });
  }
  // Reads until `needle` has appeared `times` times (or the timeout).
  std::string read_until(const std::string& needle, double timeout_s, int times = 1) {
    return pump(timeout_s, [&] { return count(needle) >= times; });
  }
  bool closed() const { return closed_; }

 private:
  std::string pump(double timeout_s, const std::function<bool()>& done) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!done() && std::chrono::steady_clock::now() < end) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      got_.append(buf, static_cast<size_t>(n));
    }
    return got_;
  }
  int count(const std::string& needle) const {
    int n = 0;
    for (size_t at = got_.find(needle); at != std::string::npos; at = got_.find(needle, at + 1))
      ++n;
    return n;
  }
  int fd_ = -1;
  bool closed_ = false;
  std::string got_;
};

class Hardened : public ::testing::Test {
 protected:
  void start(std::vector<std::string> args = {}) {
    srv_ = std::make_unique<ServerProcess>(std::move(args));
    ASSERT_TRUE(srv_->ready()) << srv_->err();
  }
  void TearDown() override {
    if (srv_) {
      EXPECT_EQ(srv_->stop(), 0) << srv_->err();
    }
  }
  std::unique_ptr<ServerProcess> srv_;
};

const std::string kBody = R"({"prompt":"hi","max_tokens":2,"temperature":0})";

// 2: slow clients hold only their own connection; /health answers; oversize and missing
// Content-Length are answered at once; stalled requests get a 408 and are closed.
TEST_F(Hardened, SlowClientsDoNotHoldTheServer) {
  start();
  std::vector<std::unique_ptr<Socket>> slow;
  for (int i = 0; i < 20; ++i) {
    auto s = std::make_unique<Socket>(srv_->port());
    ASSERT_TRUE(s->ok());
    // Half send only part of the headers, half declare a body and send one byte of it.
    if (i % 2 == 0) {
      s->send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
    } else {
      s->send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{");
    }
    slow.push_back(std::move(s));
  }
  auto health = srv_->client(5);
  for (int i = 0; i < 5; ++i) {
    auto h = get(*health, "/health");
    EXPECT_EQ(h.status, 200) << h.body;
  }

  Socket huge(srv_->port());
  huge.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n");
  const std::string r413 = huge.read_all(5);
  EXPECT_EQ(r413.rfind("HTTP/1.1 413", 0), 0u) << r413;
  EXPECT_NE(r413.find("99999999999"), std::string::npos) << r413;

  Socket empty(srv_->port());
  empty.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string r400 = empty.read_until("}}", 5);
  EXPECT_EQ(r400.rfind("HTTP/1.1 400", 0), 0u) << r400;

  // The stalled ones are answered 408 and closed within the header/body deadlines.
  for (auto& s : slow) {
    const std::string r = s->read_all(30);
    EXPECT_EQ(r.rfind("HTTP/1.1 408", 0), 0u) << r;
    EXPECT_TRUE(s->closed());
  }
  auto h = get(*health, "/health");
  EXPECT_EQ(h.status, 200);
}

// 3: a second server on a taken port fails instead of sharing it.
TEST_F(Hardened, SecondServerOnTheSamePortFails) {
  start({"--api-key", "k1"});
  const auto r = run_deltafin(
      {"serve", "--model", server_model_dir(), "--port", std::to_string(srv_->port())}, "", 60);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("Address already in use"), std::string::npos) << r.err;
  auto c = srv_->client();
  EXPECT_EQ(get(*c, "/v1/models").status, 401);
}

// 9 and 22: pipelined requests are all answered, and Keep-Alive counts down what remains.
TEST_F(Hardened, PipelinedRequestsAndKeepAliveCount) {
  start();
  Socket s(srv_->port());
  std::string three;
  for (int i = 0; i < 3; ++i) three += "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  s.send(three);
  const std::string r = s.read_until("HTTP/1.1 200", 10, 3);
  size_t n = 0;
  for (size_t at = r.find("HTTP/1.1 200"); at != std::string::npos;
       at = r.find("HTTP/1.1 200", at + 1))
    ++n;
  EXPECT_EQ(n, 3u) << r;
  EXPECT_NE(r.find("max=99"), std::string::npos) << r;
  EXPECT_NE(r.find("max=97"), std::string::npos) << r;

  // The hundredth request on a connection is its last: its answer says so and the server closes.
  Socket many(srv_->port());
  std::string hundred;
  for (int i = 0; i < 100; ++i) hundred += "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  many.send(hundred);
  const std::string all = many.read_all(20);
  size_t answered = 0;
  for (size_t at = all.find("HTTP/1.1 200"); at != std::string::npos;
       at = all.find("HTTP/1.1 200", at + 1))
    ++answered;
  EXPECT_EQ(answered, 100u);
  EXPECT_NE(all.find("Connection: close"), std::string::npos);
  EXPECT_EQ(all.find("Connection: close"), all.rfind("Connection: close"));  // only the last
  EXPECT_TRUE(many.closed());
}

// 10: an HTTP/1.0 client gets its stream without chunked encoding, ended by the close.
TEST_F(Hardened, Http10StreamIsNotChunked) {
  start();
  Socket s(srv_->port());
  const std::string body = R"({"prompt":"hi","max_tokens":3,"temperature":0,"stream":true})";
  s.send("POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body);
  const std::string r = s.read_all(30);
  EXPECT_TRUE(s.closed());
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_EQ(r.find("Transfer-Encoding"), std::string::npos) << r;
  const size_t head_end = r.find("\r\n\r\n");
  ASSERT_NE(head_end, std::string::npos);
  sse_events(r.substr(head_end + 4));  // checks the frames and the final [DONE]
}

// 11 and 15: invalid requests are refused by name; the 429 message is consistent.
TEST_F(Hardened, InvalidRequestsAndTheBusyMessage) {
  start({"--parallel", "1", "--queue", "0"});
  auto c = srv_->client();
  for (const auto& [body, param] : invalid_chat_bodies()) {
    auto r = post_json(*c, "/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << body.dump() << " -> " << r.body;
    ASSERT_TRUE(is_error_shape(r.j)) << r.body;
    EXPECT_EQ(r.j["error"]["param"], param) << r.body;
  }

  RawClient hog(srv_->port());
  ASSERT_TRUE(
      hog.send_request("POST", "/v1/completions",
                       R"({"prompt":"hi","max_tokens":4000,"temperature":0,"stream":true})"));
  ASSERT_NE(hog.read_until("data: ", 30).find("200"), std::string::npos);
  auto busy = post_json(*c, "/v1/completions", json::parse(kBody));
  EXPECT_EQ(busy.status, 429) << busy.body;
  const std::string msg = busy.j["error"]["message"];
  EXPECT_EQ(msg.find("1 requests"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(--parallel 1)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(--queue 0)"), std::string::npos) << msg;
  hog.close_now();
}

// 14: a stream ended by --timeout is logged with the tokens it sent.
TEST(HardenedLog, TimedOutStreamIsLoggedWithItsTokens) {
  setenv("DELTAFIN_DEBUG_STEP_DELAY_MS", "100", 1);
  ServerProcess srv({"--timeout", "2"});
  unsetenv("DELTAFIN_DEBUG_STEP_DELAY_MS");
  ASSERT_TRUE(srv.ready()) << srv.err();
  auto c = srv.client();
  const json body = {{"prompt", "hi"}, {"max_tokens", 1000}, {"temperature", 0}, {"stream", true}};
  auto r = c->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find("timeout"), std::string::npos) << r->body;
  std::string log;
  for (int i = 0; i < 100; ++i) {
    log = srv.err();
    if (log.find("failed mid-stream") != std::string::npos) break;
    std::this_thread::sleep_for(50ms);
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("completion (\\d+) tokens, [0-9.]+ s\\n")))
      << log;
  EXPECT_GT(std::stoi(m[1].str()), 0) << log;
  EXPECT_EQ(log.find("prompt 0 tokens"), std::string::npos) << log;
  EXPECT_EQ(srv.stop(), 0);
}

// Issue 31 B8: a request stopped while its prompt is being prefilled (the client goes away) is
// logged with the prompt tokens it had prefilled, and says so; it was logged as "prompt 0 tokens"
// (the line was written before the engine had ended the request and counted its usage).
TEST(HardenedLog, RequestStoppedInPrefillIsLoggedWithWhatItPrefilled) {
  setenv("DELTAFIN_DEBUG_STEP_DELAY_MS", "100", 1);
  ServerProcess srv({"--prefill-chunk", "4", "--state-cache", "none"});
  unsetenv("DELTAFIN_DEBUG_STEP_DELAY_MS");
  ASSERT_TRUE(srv.ready()) << srv.err();
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "the mountains of the sea ";
  const std::regex line(
      "prompt (\\d+) of (\\d+) tokens, stopped in prefill \\(0 cached\\), completion 0 tokens");
  for (const bool stream : {false, true}) {
    const json body = {
        {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"stream", stream}};
    const std::string how = stream ? "stream not delivered" : "client closed the connection";
    RawClient client(srv.port());
    ASSERT_TRUE(client.send_request("POST", "/v1/completions", body.dump()));
    if (stream) {  // the headers come when the engine admits it: prefill is running
      ASSERT_NE(client.read_until("\r\n\r\n", 30).find(" 200 "), std::string::npos);
    }
    std::this_thread::sleep_for(600ms);
    client.close_now();
    std::string log;
    for (int i = 0; i < 200 && log.find(how) == std::string::npos; ++i) {
      std::this_thread::sleep_for(50ms);
      log = srv.err();
    }
    const size_t at = log.find(how);
    ASSERT_NE(at, std::string::npos) << log;
    const std::string logged = log.substr(at, log.find('\n', at) - at);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(logged, m, line)) << logged;
    EXPECT_GT(std::stoi(m[1].str()), 0) << logged;
    EXPECT_LT(std::stoi(m[1].str()), std::stoi(m[2].str())) << logged;
  }
  EXPECT_EQ(srv.stop(), 0);
}

}  // namespace
}  // namespace deltafin::test
