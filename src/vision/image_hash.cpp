// An image's content hash. SHA-256 (OpenSSL's libcrypto, a dependency the build already has for
// `pull` and the server) rather than a fast non-cryptographic hash: the prefix store shares a
// state between requests whose images hash alike, and those requests may come from different
// clients, so a collision must not be constructible. Hashing costs far less than decoding.
#include <openssl/evp.h>

#include "core/error.h"
#include "vision/image.h"

namespace deltafin::vision {

std::array<uint8_t, 32> image_sha256(std::span<const uint8_t> bytes) {
  std::array<uint8_t, 32> out{};
  unsigned int n = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), out.data(), &n, EVP_sha256(), nullptr) != 1 ||
      n != out.size())
    fail("SHA-256 of an image failed (libcrypto)");
  return out;
}

}  // namespace deltafin::vision
