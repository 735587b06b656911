// Fuzz body for what the Hugging Face hub answers `deltafin pull` (hub_listing): the tree
// listing's pages and the revision answer, through the same checks pull runs before it uses a
// listed path, id or size (src/cli/hub_listing.h; the CLI's other code needs libcurl and a
// network, so only this separable part is fuzzed). The input is split into pages at form feeds
// ('\f') so that checks across pages (a path listed twice, a file that is also a folder) are
// reached. Whatever is accepted must hold what pull relies on: a plain relative path outside
// .deltafin-pull, a 40-hex-digit oid, a 64-hex-digit sha256 or none, a bounded size, no path twice.
#include <set>
#include <string>
#include <string_view>

#include "cli/hub_listing.h"
#include "core/error.h"
#include "fuzz_targets.h"

namespace deltafin::fuzz {

namespace {

bool lower_hex(const std::string& s, size_t n) {
  if (s.size() != n) return false;
  for (char ch : s)
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  return true;
}

}  // namespace

void hub_listing(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  cli::HubListing listing("org/name");
  try {
    size_t b = 0;
    for (;;) {
      const size_t e = text.find('\f', b);
      listing.add_page(
          text.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b));
      if (e == std::string_view::npos) break;
      b = e + 1;
    }
  } catch (const Error&) {
    // A refused listing; the files accepted before it must still hold the invariants.
  }
  std::set<std::string> paths;
  fuzz_check(listing.files().size() <= cli::kMaxHubFiles, "more files than the limit");
  for (const cli::HubFile& f : listing.files()) {
    try {
      cli::check_repo_path(f.path);
    } catch (const Error&) {
      fuzz_check(false, "an accepted path fails check_repo_path");
    }
    fuzz_check(paths.insert(f.path).second, "a path accepted twice");
    fuzz_check(lower_hex(f.oid, 40), "an accepted oid is not 40 lowercase hex digits");
    fuzz_check(f.sha256.empty() || lower_hex(f.sha256, 64),
               "an accepted lfs.oid is not 64 lowercase hex digits");
    fuzz_check(f.size <= cli::kMaxHubFileBytes, "an accepted size is over the limit");
  }
  for (const std::string& p : paths)
    for (size_t s = p.find('/'); s != std::string::npos; s = p.find('/', s + 1))
      fuzz_check(paths.count(p.substr(0, s)) == 0, "a path accepted as a file and a folder");
  try {
    fuzz_check(lower_hex(cli::parse_revision_commit(text, "revision"), 40),
               "an accepted commit is not 40 lowercase hex digits");
  } catch (const Error&) {
  }
  const std::string quoted = cli::hub_quote(text);
  for (char ch : quoted)
    fuzz_check(ch >= 0x20 && ch < 0x7f, "hub_quote let a control or non-ASCII byte through");
}

}  // namespace deltafin::fuzz
