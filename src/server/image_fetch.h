// The one place the server fetches something a client named: an http(s) image URL, only when
// `serve --allow-image-urls` is given (off by default: a server that fetches any URL it is handed
// can be pointed at hosts only it can reach). libcurl (already linked for `deltafin pull`) with
// every limit set on the handle, so no option of the library's defaults can widen them:
// - http and https only, for the first request and for every redirect (at most 3), so a
//   redirect cannot lead to file:, ftp: or any other scheme;
// - one deadline for the whole fetch (connecting, redirects and body) and a shorter one to
//   connect;
// - the size cap checked on Content-Length before the body and on every block received, so a
//   server that lies about the length is cut off at the cap;
// - a final status of 200, and nothing kept but the bytes (no cookies, no files, no
//   credentials sent).
// What comes back is still hostile: the caller checks it as it checks a data URL.
#pragma once

#include <cstdint>
#include <string>

namespace deltafin::server {

// The body of `url`; throws InvalidArgument (one line beginning with `name`) when the URL is not
// http(s), the fetch fails, times out, answers other than 200, or is over `max_bytes`.
std::string fetch_image_url(const std::string& url, const std::string& name, uint64_t max_bytes,
                            double seconds);

}  // namespace deltafin::server
