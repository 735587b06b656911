// `deltafin pull` against a local mock of the Hugging Face hub (tests/pull/mock_hub.py: the
// listing with its pages, LFS hashes, resolve redirects, ranges, a token, and injected faults):
// a full download through dropped connections, 503s and a corrupted byte; a resume after SIGKILL
// at a random point; a full disk (a small tmpfs) that stops the run with a clear message and a
// resume once space is freed; a 401 without a token; refusals to write over what is not ours;
// --include and --draft. The result must equal the source checkpoint byte for byte and load.
// Then a hostile hub (the mock's patch_entries, extra_entries, endless_listing, next_other_host
// and cdn_other_host): ids that are file names, sizes of 2^63, a listing that never ends, paging
// links to another host, a symbolic link for pull's state folder; and repositories that stress
// the engine (the same bytes at several paths, more files than the process may open at once).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "model/inventory.h"
#include "test_util.h"

extern char** environ;

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using deltafin::test::run_deltafin;

std::string mock_hub_script() {
  return deltafin::test::data_dir() + "/../pull/mock_hub.py";
}

bool have_python() {
  return std::system("python3 -c 'import http.server' >/dev/null 2>&1") == 0;
}

// The source checkpoint: make-model's tiny shape in 15 shards of ~1 MB (made once).
const std::string& source_model() {
  static const std::string dir = [] {
    const std::string d = deltafin::test::temp_dir("pull-source") + "/tiny";
    const auto r =
        run_deltafin({"make-model", d, "--preset", "tiny", "--shard-size", "1M", "--quiet"});
    if (r.exit_code != 0) throw std::runtime_error("make-model failed: " + r.err);
    return d;
  }();
  return dir;
}

class MockHub {
 public:
  explicit MockHub(const std::vector<std::pair<std::string, std::string>>& repos,
                   const std::string& token = "", const std::vector<std::string>& extra = {}) {
    const std::string dir = deltafin::test::temp_dir("mock-hub");
    port_file_ = dir + "/port";
    std::vector<std::string> args{"python3", mock_hub_script(), "--port-file", port_file_};
    for (const auto& [name, root] : repos) {
      args.push_back("--repo");
      args.push_back(name + "=" + root);
    }
    if (!token.empty()) {
      args.push_back("--token");
      args.push_back(token);
    }
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawnp(&pid_, "python3", nullptr, nullptr, argv.data(), environ) != 0)
      throw std::runtime_error("cannot start the mock hub");
    for (int i = 0; i < 300 && !fs::exists(port_file_); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    port_ = std::stoi(deltafin::test::slurp(port_file_));
  }
  ~MockHub() {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void control(const json& faults) {
    httplib::Client c("127.0.0.1", port_);
    ASSERT_TRUE(c.Post("/_control", faults.dump(), "application/json"));
  }
  json stats() {
    httplib::Client c("127.0.0.1", port_);
    auto r = c.Get("/_stats");
    return r ? json::parse(r->body) : json::object();
  }
  // Bytes of file content the hub has sent so far.
  uint64_t sent() { return stats().value("body_bytes", uint64_t{0}); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string port_file_;
};

// The environment pull reads: the mock's endpoint, a token or none, no token file.
void hub_env(const MockHub& hub, const std::string& token = "") {
  ::setenv("HF_ENDPOINT", hub.endpoint().c_str(), 1);
  ::setenv("HF_HOME", deltafin::test::temp_dir("hf-home").c_str(), 1);
  if (token.empty()) {
    ::unsetenv("HF_TOKEN");
  } else {
    ::setenv("HF_TOKEN", token.c_str(), 1);
  }
}

std::vector<std::string> pull_args(const std::string& repo, const std::string& dir) {
  return {"pull", repo, "--dir", dir, "--chunk-size", "256K", "--connections", "4"};
}

// Every file of `src` is in `dst` with the same bytes.
void expect_same_files(const std::string& src, const std::string& dst) {
  size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    const std::string rel = fs::relative(e.path(), src).string();
    ASSERT_TRUE(fs::exists(dst + "/" + rel)) << rel;
    EXPECT_TRUE(deltafin::test::slurp(e.path().string()) == deltafin::test::slurp(dst + "/" + rel))
        << rel << " differs";
    ++n;
  }
  EXPECT_GT(n, 0u);
}

// The pulled folder loads and computes the same logits as the source.
void expect_same_model(const std::string& src, const std::string& dst) {
  const std::string out = deltafin::test::temp_dir("pull-logits");
  for (const auto& [dir, file] : {std::pair{src, out + "/a.f32"}, std::pair{dst, out + "/b.f32"}}) {
    const auto r =
        run_deltafin({"logits", "--model", dir, "--tokens", "5,17,200,3", "--out", file});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  EXPECT_TRUE(deltafin::test::slurp(out + "/a.f32") == deltafin::test::slurp(out + "/b.f32"));
  const auto d = run_deltafin({"doctor", "--model", dst, "--verify", "--json", "--threads", "1"});
  ASSERT_EQ(d.exit_code, 0) << d.err << d.out;
  const json j = json::parse(d.out);
  EXPECT_TRUE(j["checkpoint"]["hashes"]["mismatched"].empty());
  EXPECT_GT(j["checkpoint"]["hashes"]["checked"].get<int>(), 10);
}

uint64_t folder_bytes(const std::string& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file(ec)) n += e.file_size(ec);
  return n;
}

#define NEED_PYTHON() \
  if (!have_python()) GTEST_SKIP() << "python3 is needed for the mock hub"

}  // namespace

TEST(Pull, FullDownloadThroughFaults) {
  NEED_PYTHON();
  MockHub hub({{"test/tiny", source_model()}});
  hub_env(hub);
  // Dropped connections, 503s and one corrupted body, all on the way.
  hub.control({{"drop_after_bytes", 100000},
               {"drop_count", 6},
               {"error_status", 503},
               {"error_count", 5},
               {"corrupt_path", "model-00004-of-000015.safetensors"},
               {"corrupt_count", 1}});
  const std::string dir = deltafin::test::temp_dir("pull-full") + "/model";
  const auto r = run_deltafin(pull_args("test/tiny", dir));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, dir + "\n");
  const json s = hub.stats();
  EXPECT_EQ(s["dropped"], 6);
  EXPECT_EQ(s["errors"], 5);
  EXPECT_EQ(s["corrupted"], 1);
  EXPECT_GT(s["tree"].get<int>(), 1) << "the listing is paged";
  EXPECT_NE(r.err.find("model-00004-of-000015.safetensors: hash mismatch"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("1 fetched again after a hash mismatch"), std::string::npos) << r.err;
  expect_same_files(source_model(), dir);
  expect_same_model(source_model(), dir);
  EXPECT_FALSE(fs::exists(dir + "/.deltafin-pull/partial"));
  // A second run finds everything in place and fetches nothing.
  const uint64_t served = hub.stats()["body_bytes"];
  const auto again = run_deltafin(pull_args("test/tiny", dir));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(hub.stats()["body_bytes"].get<uint64_t>(), served);
}

TEST(Pull, ResumesAfterSigkill) {
  NEED_PYTHON();
  MockHub hub({{"test/tiny", source_model()}});
  hub_env(hub);
  const uint64_t total = folder_bytes(source_model());
  hub.control({{"slow_ms", 40}});  // ~1.6 MB/s per connection: the run takes seconds
  const std::string dir = deltafin::test::temp_dir("pull-kill") + "/model";
  std::random_device rd;
  const unsigned seed = rd();
  std::mt19937 rng(seed);
  // Kill it once the hub has sent between 20% and 80% of the bytes, at a random point. Counted
  // at the hub, not on disk: pull reserves each file's whole size when it opens it. 20% is more
  // than the 4 connections' chunks in flight (4 x 256K of ~12 MB), so some chunks are finished.
  const uint64_t at = total / 5 + rng() % (total * 3 / 5);
  {
    deltafin::test::Child child(pull_args("test/tiny", dir));
    for (int i = 0; i < 600 && hub.sent() < at; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    child.signal(SIGKILL);
    child.wait();
  }
  const uint64_t served_before = hub.stats()["body_bytes"];
  ASSERT_LT(served_before, total) << "seed " << seed << ": the run finished before it was killed";
  hub.control({{"slow_ms", 0}});
  const auto r = run_deltafin(pull_args("test/tiny", dir));
  ASSERT_EQ(r.exit_code, 0) << r.err << " (seed " << seed << ")";
  // What the killed run finished is kept: whole files (published, found by their hashes) or
  // chunks recorded in the maps of the files it had open.
  EXPECT_TRUE(r.err.find("fetched by an earlier run") != std::string::npos ||
              r.err.find("(0 kB already here") == std::string::npos)
      << r.err;
  const uint64_t resumed = hub.stats()["body_bytes"].get<uint64_t>() - served_before;
  EXPECT_LT(resumed, total) << "the second run fetched everything again (seed " << seed << ")";
  expect_same_files(source_model(), dir);
  expect_same_model(source_model(), dir);
}

TEST(Pull, DiskFullStopsAndResumes) {
  NEED_PYTHON();
  const std::string mnt = deltafin::test::temp_dir("pull-tmpfs");
  const uint64_t total = folder_bytes(source_model());
  const std::string opts = "size=" + std::to_string(total + (4u << 20));
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, opts.c_str()) != 0)
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root): " << std::strerror(errno);
  struct Unmount {
    std::string at;
    ~Unmount() { ::umount2(at.c_str(), MNT_DETACH); }
  } unmount{mnt};
  MockHub hub({{"test/tiny", source_model()}});
  hub_env(hub);
  hub.control({{"slow_ms", 30}});
  const std::string dir = mnt + "/model", filler = mnt + "/filler";
  {
    deltafin::test::Child child(pull_args("test/tiny", dir));
    for (int i = 0; i < 600 && hub.sent() < total / 4; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    // Someone else fills the disk while the pull runs.
    std::ofstream f(filler, std::ios::binary);
    const std::string block(1 << 16, 'x');
    while (f.write(block.data(), block.size())) {
    }
    f.close();
    hub.control({{"slow_ms", 0}});
    const auto r = child.wait(120);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("disk full"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("run the same command again"), std::string::npos) << r.err;
  }
  // Still full: the free-space check refuses before fetching anything.
  const auto refused = run_deltafin(pull_args("test/tiny", dir));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("free space or choose another --dir"), std::string::npos)
      << refused.err;
  fs::remove(filler);
  const uint64_t served = hub.stats()["body_bytes"];
  const auto r = run_deltafin(pull_args("test/tiny", dir));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(hub.stats()["body_bytes"].get<uint64_t>() - served, total) << "it resumed";
  expect_same_files(source_model(), dir);
}

TEST(Pull, UnauthorizedWithoutAToken) {
  NEED_PYTHON();
  MockHub hub({{"org/gated", source_model()}}, "s3cret");
  hub_env(hub);
  const std::string dir = deltafin::test::temp_dir("pull-401") + "/model";
  auto r = run_deltafin(pull_args("org/gated", dir));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("401"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("set HF_TOKEN"), std::string::npos) << r.err;
  hub_env(hub, "wrong");
  r = run_deltafin(pull_args("org/gated", dir));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("the token (HF_TOKEN) was refused"), std::string::npos) << r.err;
  hub_env(hub, "s3cret");
  r = run_deltafin(pull_args("org/gated", dir));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_files(source_model(), dir);
  // A repository the hub does not have, and a name that is not ORG/NAME.
  r = run_deltafin(pull_args("org/absent", dir));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("404"), std::string::npos) << r.err;
  r = run_deltafin(pull_args("../etc", dir));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("expected ORG/NAME"), std::string::npos) << r.err;
  ::unsetenv("HF_TOKEN");
}

TEST(Pull, RefusesToWriteOverWhatIsNotAFile) {
  NEED_PYTHON();
  MockHub hub({{"test/tiny", source_model()}});
  hub_env(hub);
  const std::string base = deltafin::test::temp_dir("pull-clobber");
  // A symbolic link where a file would go: it and what it points to stay untouched.
  const std::string dir = base + "/model", victim = base + "/victim";
  deltafin::test::spit(victim, "keep me");
  fs::create_directories(dir);
  fs::create_symlink(victim, dir + "/config.json");
  auto r = run_deltafin(pull_args("test/tiny", dir));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("config.json exists and is a symbolic link"), std::string::npos) << r.err;
  EXPECT_EQ(deltafin::test::slurp(victim), "keep me");
  EXPECT_TRUE(fs::is_symlink(dir + "/config.json"));
  // A folder where a file would go, and a file where the target folder would be.
  fs::remove(dir + "/config.json");
  fs::create_directories(dir + "/tiktoken.model");
  r = run_deltafin(pull_args("test/tiny", dir));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("tiktoken.model exists and is not a regular file"), std::string::npos)
      << r.err;
  r = run_deltafin(pull_args("test/tiny", victim));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("exists and is not a folder"), std::string::npos) << r.err;
  EXPECT_EQ(deltafin::test::slurp(victim), "keep me");
}

TEST(Pull, IncludeOnlyTheExpertShards) {
  NEED_PYTHON();
  MockHub hub({{"test/tiny", source_model()}});
  hub_env(hub);
  const std::string part = deltafin::test::temp_dir("pull-include") + "/model";
  const auto r = run_deltafin({"pull", "test/tiny", "--dir", part, "--include", "experts"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto index =
      json::parse(deltafin::test::slurp(source_model() + "/model.safetensors.index.json"));
  std::set<std::string> expert_shards, all_shards;
  for (const auto& [name, file] : index["weight_map"].items()) {
    all_shards.insert(file);
    if (deltafin::is_routed_expert_tensor(name)) expert_shards.insert(file);
  }
  ASSERT_LT(expert_shards.size(), all_shards.size()) << "some shards hold only trunk tensors";
  for (const auto& e : fs::directory_iterator(source_model())) {
    const std::string f = e.path().filename().string();
    const bool shard = f.ends_with(".safetensors");
    EXPECT_EQ(fs::exists(part + "/" + f), !shard || expert_shards.count(f) > 0) << f;
  }
}

TEST(Pull, DrafterIntoDraftFolder) {
  NEED_PYTHON();
  const std::string target = deltafin::test::data_dir() + "/k3-tiny-mxfp4/model";
  const std::string draft = deltafin::test::data_dir() + "/eagle3-tiny/model";
  MockHub hub({{"test/target", target}, {"test/draft", draft}});
  hub_env(hub);
  const std::string dir = deltafin::test::temp_dir("pull-draft") + "/model";
  const auto r = run_deltafin({"pull", "test/target", "--dir", dir, "--draft", "test/draft"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_files(target, dir);
  expect_same_files(draft, dir + "/draft");
  const auto d = run_deltafin({"doctor", "--model", dir, "--json", "--threads", "1"});
  ASSERT_EQ(d.exit_code, 0) << d.out << d.err;
  EXPECT_EQ(json::parse(d.out)["checkpoint"]["draft"]["kind"], "eagle3");
}

namespace {

// The permission bits of `path` itself (a link is not followed).
unsigned mode_of(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & 07777;
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.insert(e.path().filename().string());
  return names;
}

const std::string kShard = "model-00002-of-000015.safetensors";  // an LFS file of the source

}  // namespace

// Issue 39, finding 1: the listing's oid and lfs.oid named the partial file. Each must now be a
// hash (40 or 64 hex digits), and nothing is written outside the partial folder.
TEST(Pull, RefusesIdsThatAreNotHashes) {
  NEED_PYTHON();
  MockHub hub({{"test/tiny", source_model()}});
  hub_env(hub);
  const std::string base = deltafin::test::temp_dir("pull-oids");
  const std::string victim = base + "/victim";
  deltafin::test::spit(victim, "keep me");
  struct Case {
    std::string name;
    json patch;
    std::string expect;
    std::vector<std::string> never_made;
  };
  const std::vector<Case> cases = {
      // The NUL ends the C string: the partial file's name was the victim itself.
      {"nul",
       {{"config.json", {{"oid", victim + std::string(1, '\0')}}}},
       "\\x00\": expected 40 hex digits (its git blob id)",
       {}},
      // An absolute path: the partial files were made beside the victim.
      {"absolute",
       {{kShard, {{"lfs", {{"oid", victim}}}}}},
       "with lfs.oid \"" + victim + "\": expected 64 hex digits",
       {victim + ".part", victim + ".done"}},
      // Out of DIR/.deltafin-pull/partial and --dir, into `base`.
      {"traversal",
       {{"config.json", {{"oid", "../../../../escaped"}}}},
       "expected 40 hex digits",
       {base + "/escaped.part", base + "/escaped.done"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    hub.control({{"patch_entries", c.patch}});
    const std::string dir = base + "/" + c.name + "/model";
    const auto r = run_deltafin(pull_args("test/tiny", dir));
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_EQ(deltafin::test::slurp(victim), "keep me");
    for (const auto& p : c.never_made) EXPECT_FALSE(fs::exists(p)) << p;
  }
}

// Finding 6: files with the same bytes (two empty __init__.py, a copied config, a copied shard)
// shared one partial file, and the second could not be moved into place. Also: what pull
// creates is private (folders 0700, files 0600).
TEST(Pull, SameBytesAtSeveralPaths) {
  NEED_PYTHON();
  const std::string src = deltafin::test::temp_dir("pull-same-src") + "/repo";
  for (const char* sub : {"/a", "/b", "/copy"}) fs::create_directories(src + sub);
  std::string big(64 << 10, 'x');
  for (size_t i = 0; i < big.size(); i += 97) big[i] = static_cast<char>('a' + i % 26);
  for (const char* p : {"/a/__init__.py", "/b/__init__.py"}) deltafin::test::spit(src + p, "");
  for (const char* p : {"/config.json", "/copy/config.json"})
    deltafin::test::spit(src + p, "{\"same\": true}\n");
  for (const char* p : {"/shard.bin", "/copy/shard.bin"}) deltafin::test::spit(src + p, big);
  MockHub hub({{"test/same", src}});
  hub_env(hub);
  const std::string top = deltafin::test::temp_dir("pull-same") + "/new", dir = top + "/model";
  const auto r = run_deltafin(pull_args("test/same", dir));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_files(src, dir);
  for (const std::string& p : {top, dir, dir + "/a", dir + "/copy", dir + "/.deltafin-pull"})
    EXPECT_EQ(mode_of(p), 0700u) << p;
  for (const char* p :
       {"/config.json", "/copy/shard.bin", "/a/__init__.py", "/.deltafin-pull/manifest.json"})
    EXPECT_EQ(mode_of(dir + p), 0600u) << p;
  EXPECT_FALSE(fs::exists(dir + "/.deltafin-pull/partial"));
}

// Finding 6: every listed file held two open files for the whole run, so 600 files failed under
// a limit of 256, on every run.
TEST(Pull, ManyFilesUnderALowOpenFileLimit) {
  NEED_PYTHON();
  const std::string src = deltafin::test::temp_dir("pull-many-src") + "/repo";
  fs::create_directories(src + "/files");
  for (int i = 0; i < 600; ++i)
    deltafin::test::spit(src + "/files/f" + std::to_string(i) + ".txt",
                         "file " + std::to_string(i));
  MockHub hub({{"test/many", src}}, "", {"--page-size", "100"});
  hub_env(hub);
  const std::string dir = deltafin::test::temp_dir("pull-many") + "/model";
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  rlimit low = old;
  low.rlim_cur = std::min<rlim_t>(old.rlim_cur, 256);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);  // the child inherits it
  const auto r = run_deltafin(pull_args("test/many", dir));
  ::setrlimit(RLIMIT_NOFILE, &old);
  ASSERT_EQ(r.exit_code, 0) << r.err.substr(0, 4000);
  expect_same_files(src, dir);
}

// Finding 7: a listing page's Link to another host was fetched with the token. Pages there are
// fetched without it, as redirected LFS downloads already were (which must stay so).
TEST(Pull, TokenStaysWithTheHub) {
  NEED_PYTHON();
  MockHub hub({{"test/tiny", source_model()}}, "s3cret");
  hub_env(hub, "s3cret");
  hub.control({{"next_other_host", true}, {"cdn_other_host", true}});
  const std::string dir = deltafin::test::temp_dir("pull-token") + "/model";
  const auto r = run_deltafin(pull_args("test/tiny", dir));
  ::unsetenv("HF_TOKEN");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json s = hub.stats();
  EXPECT_GT(s.value("other_requests", 0), 1) << "pages and LFS files came from the other host";
  EXPECT_EQ(s.value("other_authorization", 0), 0) << "the token went to another host";
  expect_same_files(source_model(), dir);
}

// Finding 9: a listing body that never ends hung pull. Fast, it passes the size limit; slow
// (above libcurl's low-speed limit), the listing's deadline.
TEST(Pull, EndlessListingStops) {
  NEED_PYTHON();
  MockHub hub({{"test/tiny", source_model()}});
  hub_env(hub);
  const std::string dir = deltafin::test::temp_dir("pull-endless") + "/model";
  hub.control({{"endless_listing", "fast"}});
  auto r = run_deltafin(pull_args("test/tiny", dir), "", 60);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("listing the files of test/tiny: the hub's answer is larger than 64 MiB"),
            std::string::npos)
      << r.err;
  hub.control({{"endless_listing", "drip"}});
  ::setenv("DELTAFIN_PULL_LISTING_TIMEOUT", "3", 1);
  r = run_deltafin(pull_args("test/tiny", dir), "", 60);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("no complete answer within the listing's deadline of 3 s"),
            std::string::npos)
      << r.err;
  ::setenv("DELTAFIN_PULL_LISTING_TIMEOUT", "soon", 1);
  r = run_deltafin(pull_args("test/tiny", dir), "", 60);
  ::unsetenv("DELTAFIN_PULL_LISTING_TIMEOUT");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("expected a whole number of seconds"), std::string::npos) << r.err;
}

// Finding 9: the partial files of an older revision survived a successful pull. They are removed
// then; what pull did not make stays, whatever its name.
TEST(Pull, RemovesOnlyItsOwnStalePartials) {
  NEED_PYTHON();
  MockHub hub({{"test/tiny", source_model()}});
  hub_env(hub);
  const std::string base = deltafin::test::temp_dir("pull-stale"), dir = base + "/model";
  const std::string partial = dir + "/.deltafin-pull/partial";
  // An "older revision" listed other bytes for config.json: they never verify, and the run
  // stops with their partial files left.
  hub.control({{"patch_entries", {{"config.json", {{"oid", std::string(40, '1')}}}}}});
  auto r = run_deltafin(pull_args("test/tiny", dir));
  ASSERT_EQ(r.exit_code, 1) << r.err;
  ASSERT_NE(r.err.find("the hub serves other bytes than its listing says"), std::string::npos)
      << r.err;
  const std::set<std::string> stale = names_in(partial);
  ASSERT_FALSE(stale.empty());
  const std::string victim = base + "/victim", a64(64, 'a'), b64(64, 'b');
  deltafin::test::spit(victim, "keep me");
  deltafin::test::spit(partial + "/notes.txt", "mine");
  deltafin::test::spit(partial + "/" + a64 + ".done", "not a map of pull's");
  deltafin::test::spit(partial + "/" + b64 + ".done", "deltafin-pull 2 1 65536 " + b64 + "\n");
  fs::create_symlink(victim, partial + "/" + b64 + ".part");
  hub.control({{"patch_entries", json::object()}});
  r = run_deltafin(pull_args("test/tiny", dir));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_files(source_model(), dir);
  for (const auto& n : stale)
    EXPECT_FALSE(fs::exists(partial + "/" + n)) << n << " outlived a successful pull";
  EXPECT_EQ(deltafin::test::slurp(partial + "/notes.txt"), "mine");
  EXPECT_TRUE(fs::exists(partial + "/" + a64 + ".done"));
  EXPECT_TRUE(fs::is_symlink(partial + "/" + b64 + ".part"));
  EXPECT_EQ(deltafin::test::slurp(victim), "keep me");
}

// Finding 9: two listed sizes of 2^63 wrapped the sum of sizes (std::bad_alloc).
TEST(Pull, RefusesSizesNoFileHas) {
  NEED_PYTHON();
  MockHub hub({{"test/tiny", source_model()}});
  hub_env(hub);
  const uint64_t huge = uint64_t{1} << 63;
  const json big = {{"size", huge}, {"lfs", {{"size", huge}}}};
  hub.control({{"patch_entries", {{kShard, big}, {"model-00003-of-000015.safetensors", big}}}});
  const std::string dir = deltafin::test::temp_dir("pull-huge") + "/model";
  const auto r = run_deltafin(pull_args("test/tiny", dir));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("with size 9223372036854775808: expected at most 4398046511104 bytes"),
            std::string::npos)
      << r.err;
}

// Finding 9: a symbolic link at DIR/.deltafin-pull was followed (partial files and the manifest
// written wherever it pointed). Nor may the hub list a file into that folder.
TEST(Pull, StateFolderIsNeverALink) {
  NEED_PYTHON();
  MockHub hub({{"test/tiny", source_model()}});
  hub_env(hub);
  const std::string base = deltafin::test::temp_dir("pull-state-link");
  const std::string dir = base + "/model", elsewhere = base + "/elsewhere";
  fs::create_directories(dir);
  fs::create_directories(elsewhere);
  fs::create_directory_symlink(elsewhere, dir + "/.deltafin-pull");
  auto r = run_deltafin(pull_args("test/tiny", dir));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find(dir + "/.deltafin-pull is a symbolic link"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::is_empty(elsewhere));
  fs::remove(dir + "/.deltafin-pull");
  const json entry = {{"type", "file"},
                      {"path", ".deltafin-pull/manifest.json"},
                      {"size", 2},
                      {"oid", std::string(40, '0')}};
  hub.control({{"extra_entries", json::array({entry})}});
  r = run_deltafin(pull_args("test/tiny", dir));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("\".deltafin-pull/manifest.json\" inside .deltafin-pull"), std::string::npos)
      << r.err;
}

// What held in the attack of issue 39 and must stay so: listed paths out of --dir are refused
// before anything is written, and a file body longer than the range asked stops the run.
TEST(Pull, RefusesEscapingPathsAndEndlessBodies) {
  NEED_PYTHON();
  MockHub hub({{"test/tiny", source_model()}});
  hub_env(hub);
  const std::string base = deltafin::test::temp_dir("pull-held");
  for (const std::string path : {"../escaped", "/tmp/escaped", "a/../../escaped", "a\\..\\b"}) {
    SCOPED_TRACE(path);
    const json entry = {
        {"type", "file"}, {"path", path}, {"size", 2}, {"oid", std::string(40, '0')}};
    hub.control({{"extra_entries", json::array({entry})}});
    const auto r = run_deltafin(pull_args("test/tiny", base + "/model"));
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("that is not a plain relative path"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(base + "/escaped"));
    EXPECT_FALSE(fs::exists(base + "/model/.deltafin-pull")) << "nothing written before the check";
  }
  hub.control({{"extra_entries", json::array()}, {"endless_body", true}});
  const auto r = run_deltafin(pull_args("test/tiny", base + "/model"), "", 120);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("it does not serve ranges as asked"), std::string::npos) << r.err;
}
