// The browser page of `deltafin serve` (web/: chat and engine view), compiled into the binary.
//
// cmake/embed_web.cmake turns every file of web/ into a byte array of a generated source at
// build time, so the server needs no files next to it, the page can never be out of step with
// the binary, and nothing is fetched from the network. The HTTP server looks assets up by path.
#pragma once

#include <cstddef>
#include <span>

namespace deltafin::server {

struct WebAsset {
  const char* path;          // "/index.html"
  const char* content_type;  // "text/html; charset=utf-8"
  const unsigned char* data;
  size_t size;
};

// Every embedded file (defined in the generated web_assets.cpp).
std::span<const WebAsset> web_assets();

}  // namespace deltafin::server
