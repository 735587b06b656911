// OpenAI-shaped API errors. Everything the server refuses, from a bad field to a full queue, is
// an ApiError carrying the HTTP status and the four fields OpenAI clients read
// (`{"error":{"message","type","param","code"}}`); the HTTP layer turns it into a response, or
// into an SSE error event once a stream has started. Keeping status and shape in one value means
// no code path can produce an error body of a different shape.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

namespace deltafin::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string type,
           std::optional<std::string> param = std::nullopt,
           std::optional<std::string> code = std::nullopt)
      : std::runtime_error(message),
        status_(status),
        type_(std::move(type)),
        param_(std::move(param)),
        code_(std::move(code)) {}
  // A copy gets its own message. std::runtime_error shares one reference-counted string among
  // its copies, and libstdc++ counts it where ThreadSanitizer cannot see; the scheduler's thread
  // hands ApiError copies to connection threads, and TSan reported the last copy's release (in
  // whichever thread it fell) as a race with the other thread's read of the message. Not sharing
  // the string between threads costs one small copy per error.
  ApiError(const ApiError& o)
      : std::runtime_error(std::string(o.what())),
        status_(o.status_),
        type_(o.type_),
        param_(o.param_),
        code_(o.code_),
        retry_after_(o.retry_after_) {}
  ApiError& operator=(const ApiError& o) {
    if (this == &o) return *this;
    std::runtime_error::operator=(std::runtime_error(std::string(o.what())));
    status_ = o.status_;
    type_ = o.type_;
    param_ = o.param_;
    code_ = o.code_;
    retry_after_ = o.retry_after_;
    return *this;
  }

  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::optional<std::string>& param() const { return param_; }
  const std::optional<std::string>& code() const { return code_; }
  // Seconds for a Retry-After header (429 and 503), 0 for none.
  int retry_after() const { return retry_after_; }
  ApiError& with_retry_after(int s) {
    retry_after_ = s;
    return *this;
  }

  nlohmann::ordered_json to_json() const {
    nlohmann::ordered_json e;
    e["message"] = what();
    e["type"] = type_;
    e["param"] = param_ ? nlohmann::ordered_json(*param_) : nlohmann::ordered_json(nullptr);
    e["code"] = code_ ? nlohmann::ordered_json(*code_) : nlohmann::ordered_json(nullptr);
    return {{"error", e}};
  }

 private:
  int status_;
  std::string type_;
  std::optional<std::string> param_, code_;
  int retry_after_ = 0;
};

// 400 invalid_request_error naming the field (`param`) at fault.
template <typename... Args>
[[noreturn]] void bad_request(const std::string& param, fmt::format_string<Args...> f,
                              Args&&... args) {
  throw ApiError(400, fmt::format(f, std::forward<Args>(args)...), "invalid_request_error",
                 param.empty() ? std::nullopt : std::optional<std::string>(param));
}

}  // namespace deltafin::server
