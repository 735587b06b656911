// Checksums of expert copies (storage/home.h): XXH3-64 of a byte range, from Debian's libxxhash
// header. A copy of an expert on another drive is checked on every read, so the hash must cost
// far less than the read: XXH3 runs at memory speed (the AVX2 build where the CPU has it; its
// value is the same on every implementation, so a home written on one machine checks on any).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace deltafin {

// XXH3-64 (seed 0) of `n` bytes at `data`.
uint64_t checksum64(const void* data, size_t n);
// The same as 16 lowercase hex digits (how manifests store it), and back; parse returns false
// on anything else.
std::string checksum_hex(uint64_t h);
bool parse_checksum_hex(const std::string& text, uint64_t* out);

namespace checksum_detail {
uint64_t xxh3_generic(const void* data, size_t n);
uint64_t xxh3_avx2(const void* data, size_t n);  // only where the CPU has AVX2
}  // namespace checksum_detail

}  // namespace deltafin
