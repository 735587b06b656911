// Prefix snapshots (issue 26): a restored state continues exactly as the state it was taken from,
// from RAM and from disk, on the golden models and a small model of K3's shape, with and without
// a draft model; the tree shares, splits and evicts; a bad file is never used.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "draft/draft_model.h"
#include "draft/tap_drafter.h"
#include "engine/engine.h"
#include "fixtures/synthetic.h"
#include "greedy_util.h"
#include "prefix/prefix_store.h"
#include "prefix/reuse.h"
#include "test_util.h"

namespace deltafin {
namespace {

namespace fs = std::filesystem;

std::string golden(const char* name) {
  return test::data_dir() + "/" + name + "/model";
}

const std::string& small_k3() {
  static const std::string dir = [] {
    const std::string d = test::temp_dir("prefix_k3") + "/model";
    make_model(d, test::small_k3_spec());
    return d;
  }();
  return dir;
}

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab, uint32_t seed = 7) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) {
    seed = seed * 1664525u + 1013904223u;
    t = static_cast<int32_t>((seed >> 8) % static_cast<uint32_t>(std::min<int64_t>(vocab, 250)));
  }
  return p;
}

std::vector<float> feed(Model& m, State& s, std::span<const int32_t> ids) {
  return m.forward(s, ids);
}

PrefixStoreOptions ram_only() {
  PrefixStoreOptions o;
  o.ram_bytes = 1ull << 30;
  o.model_id = "test";
  return o;
}

PrefixStoreOptions disk_only(const std::string& dir) {
  PrefixStoreOptions o;
  o.dir = dir;
  o.disk_bytes = 1ull << 30;
  o.model_id = "test";
  return o;
}

class PrefixExact : public ::testing::TestWithParam<std::string> {};

// The state restored from a snapshot at m continues bit for bit as the state it was taken from:
// the same logits for the rest of the prompt and the same greedy continuation, from RAM and from
// disk. Against one uncut pass over the whole prompt the logits differ only by fp32 summation
// order (the KDA chunks start where a pass starts): the bound is checked and the tokens agree.
TEST_P(PrefixExact, ARestoredStateContinuesBitForBit) {
  const std::string dir = GetParam() == "small-k3" ? small_k3() : golden(GetParam().c_str());
  auto model = open_model(dir);
  const int64_t V = model->config().vocab;
  const auto p = prompt_of(50, V);
  const size_t m = 29;
  State a = model->new_state();
  feed(*model, a, std::span(p).first(m));
  PrefixStore ram(model->config(), ram_only());
  PrefixStore disk(model->config(), disk_only(test::temp_dir("prefix_exact")));
  ram.save(std::span(p).first(m), a, nullptr);
  disk.save(std::span(p).first(m), a, nullptr);
  const auto want = feed(*model, a, std::span(p).subspan(m));
  for (PrefixStore* store : {&ram, &disk}) {
    State b = model->new_state();
    const Restored r = store->restore(p, static_cast<int64_t>(p.size()) - 1, b, nullptr);
    ASSERT_EQ(r.position, static_cast<int64_t>(m));
    EXPECT_EQ(r.from_disk, store == &disk);
    const auto got = feed(*model, b, std::span(p).subspan(m));
    ASSERT_EQ(got.size(), want.size());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << "not bit-identical";
    const auto ga = test::generate_greedy(*model, a, std::vector<int32_t>{1}, 8, {}, nullptr, 1);
    const auto gb = test::generate_greedy(*model, b, std::vector<int32_t>{1}, 8, {}, nullptr, 1);
    EXPECT_EQ(ga, gb);
    a = model->new_state();  // a again as it was for the next store
    feed(*model, a, p);
  }
  State whole = model->new_state();
  const auto one_pass = feed(*model, whole, p);
  float worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::fabs(one_pass[i] - want[i]));
  EXPECT_LT(worst, 1e-3f) << "largest difference to one uncut pass";
  EXPECT_EQ(std::max_element(one_pass.begin(), one_pass.end()) - one_pass.begin(),
            std::max_element(want.begin(), want.end()) - want.begin());
}

INSTANTIATE_TEST_SUITE_P(Models, PrefixExact,
                         ::testing::Values("k3-tiny-bf16", "k3-tiny-mxfp4", "small-k3",
                                           "kimi-linear-tiny", "k2-tiny", "deepseek-v3-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// A draft model's cache is part of the snapshot: a drafter restored at m proposes exactly what
// one that followed the whole sequence proposes (EAGLE-3.1 rows lag the sequence by one, DSpark's
// do not), from RAM and from disk.
TEST(PrefixDrafters, ARestoredDrafterProposesTheSameDrafts) {
  const std::string target_dir = golden("k3-tiny-mxfp4");
  auto model = open_model(target_dir);
  for (const char* kind : {"eagle3-tiny", "dspark-tiny"}) {
    auto dm = open_draft_model(test::data_dir() + "/" + kind + "/model", model->config());
    const auto p = prompt_of(40, model->config().vocab, 11);
    const size_t m = 23;
    for (bool on_disk : {false, true}) {
      PrefixStore store(model->config(),
                        on_disk ? disk_only(test::temp_dir("prefix_draft")) : ram_only());
      auto d1 = dm->new_drafter(*model);
      State a = model->new_state();
      d1->attach(a);
      feed(*model, a, std::span(p).first(m));
      store.save(std::span(p).first(m), a, d1.get());
      feed(*model, a, std::span(p).subspan(m));
      std::vector<int32_t> history = p;
      history.push_back(5);  // the anchor
      const DraftProposal want = d1->propose(history, 4);
      ASSERT_FALSE(want.tokens.empty()) << kind;
      const auto want_logits = d1->last_logits();

      auto d2 = dm->new_drafter(*model);
      State b = model->new_state();
      const Restored r = store.restore(p, static_cast<int64_t>(p.size()) - 1, b, d2.get());
      ASSERT_EQ(r.position, static_cast<int64_t>(m)) << kind;
      EXPECT_TRUE(r.with_draft) << kind;
      d2->attach(b);  // the same state again: keeps what was restored
      feed(*model, b, std::span(p).subspan(m));
      const DraftProposal got = d2->propose(history, 4);
      EXPECT_TRUE(d2->fallback_reason().empty()) << kind << ": " << d2->fallback_reason();
      EXPECT_EQ(got.tokens, want.tokens) << kind << (on_disk ? " (disk)" : " (RAM)");
      EXPECT_EQ(d2->last_logits(), want_logits) << kind;
    }
  }
}

// A drafter restored without draft rows (a snapshot saved without it) says why on stderr, on its
// own line, and drafts nothing; the output never depends on it.
TEST(PrefixDrafters, AMissingDraftStateStopsDraftingWithOneLine) {
  auto model = open_model(golden("k3-tiny-mxfp4"));
  auto dm = open_draft_model(test::data_dir() + "/eagle3-tiny/model", model->config());
  const auto p = prompt_of(20, model->config().vocab);
  PrefixStore store(model->config(), ram_only());
  State a = model->new_state();
  feed(*model, a, std::span(p).first(10));
  store.save(std::span(p).first(10), a, nullptr);
  auto d = dm->new_drafter(*model);
  State b = model->new_state();
  testing::internal::CaptureStderr();
  const Restored r = store.restore(p, 19, b, d.get());
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.position, 10);
  EXPECT_FALSE(r.with_draft);
  EXPECT_NE(err.find("has no draft state"), std::string::npos) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  std::vector<int32_t> history(p.begin(), p.begin() + 10);
  history.push_back(3);
  EXPECT_TRUE(d->propose(history, 3).tokens.empty());
}

// Prompts that share a prefix share its rows: the tree splits, the deepest snapshot on a path
// wins, and under a small RAM budget the least recently used leaves go first while the shared
// prefix stays.
TEST(PrefixTree, SharesSplitsAndEvictsLeavesFirst) {
  auto model = open_model(golden("k3-tiny-mxfp4"));
  const auto shared = prompt_of(24, model->config().vocab, 1);
  State s = model->new_state();
  feed(*model, s, shared);
  const uint64_t one = s.bytes();
  PrefixStoreOptions o = ram_only();
  o.ram_bytes = one * 3;  // room for about three snapshots of this length
  PrefixStore store(model->config(), o);
  store.save(shared, s, nullptr);
  for (uint32_t k = 0; k < 6; ++k) {  // six conversations after the shared prefix
    std::vector<int32_t> ids = shared;
    const auto tail = prompt_of(6, model->config().vocab, 100 + k);
    ids.insert(ids.end(), tail.begin(), tail.end());
    State c = s;
    feed(*model, c, tail);
    store.save(ids, c, nullptr);
    State probe = model->new_state();
    EXPECT_EQ(store.restore(ids, static_cast<int64_t>(ids.size()), probe, nullptr).position,
              static_cast<int64_t>(ids.size()));
  }
  const PrefixStats st = store.stats();
  EXPECT_LE(st.ram_bytes, o.ram_bytes);
  EXPECT_LT(st.ram_snapshots, 7);
  EXPECT_TRUE(store.has(shared)) << "the shared prefix is evicted last";
  std::vector<int32_t> other = shared;
  other.push_back(3);
  other.push_back(4);
  State probe = model->new_state();
  EXPECT_EQ(store.restore(other, static_cast<int64_t>(other.size()) - 1, probe, nullptr).position,
            static_cast<int64_t>(shared.size()));
  // Nothing deeper than the limit is used: a prompt that is exactly a kept prefix feeds its
  // last token again.
  State again = model->new_state();
  EXPECT_LT(store.restore(shared, static_cast<int64_t>(shared.size()) - 1, again, nullptr).position,
            static_cast<int64_t>(shared.size()));
}

// Files that are truncated, corrupt or of another model are never used: each is ignored with one
// warning line and removed, and the lookup falls back to what else is kept (here: nothing).
TEST(PrefixFiles, BadFilesAreIgnoredWithOneLineAndRemoved) {
  auto model = open_model(golden("k3-tiny-mxfp4"));
  const auto p = prompt_of(30, model->config().vocab);
  State a = model->new_state();
  feed(*model, a, std::span(p).first(20));
  auto one_file = [](const std::string& dir) {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".dfsnap") return e.path().string();
    return std::string();
  };
  auto damaged = [&](const char* how) {
    const std::string dir = test::temp_dir(std::string("prefix_bad_") + how);
    {
      PrefixStore w(model->config(), disk_only(dir));
      w.save(std::span(p).first(20), a, nullptr);
    }
    const std::string f = one_file(dir);
    EXPECT_FALSE(f.empty());
    if (std::string(how) == "truncated") {
      fs::resize_file(f, fs::file_size(f) - 4096);
    } else if (std::string(how) == "flipped") {
      std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(static_cast<std::streamoff>(fs::file_size(f) / 2));
      char c = 0;
      io.read(&c, 1);
      io.seekp(static_cast<std::streamoff>(fs::file_size(f) / 2));
      c = static_cast<char>(c ^ 0x10);
      io.write(&c, 1);
    }
    return std::make_pair(dir, f);
  };
  for (const char* how : {"truncated", "flipped", "foreign"}) {
    auto [dir, f] = damaged(how);
    PrefixStoreOptions o = disk_only(dir);
    if (std::string(how) == "foreign") o.model_id = "another";
    testing::internal::CaptureStderr();
    PrefixStore r(model->config(), o);
    State b = model->new_state();
    const Restored got = r.restore(p, 29, b, nullptr);
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(got.position, 0) << how;
    EXPECT_EQ(b.position(), 0) << how;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << how << ": " << err;
    EXPECT_NE(err.find(f), std::string::npos) << how << ": " << err;
    EXPECT_FALSE(fs::exists(f)) << how;
  }
}

// A folder that cannot be made (here a path under a regular file) leaves the RAM tier working
// and says so once.
TEST(PrefixFiles, AnUnusableFolderKeepsSnapshotsInRam) {
  auto model = open_model(golden("k3-tiny-mxfp4"));
  const std::string file = test::temp_dir("prefix_unusable") + "/plain";
  std::ofstream(file) << "x";
  PrefixStoreOptions o = ram_only();
  o.dir = file + "/states";
  o.disk_bytes = 1ull << 30;
  testing::internal::CaptureStderr();
  PrefixStore store(model->config(), o);
  const auto p = prompt_of(12, model->config().vocab);
  State a = model->new_state();
  feed(*model, a, std::span(p).first(8));
  store.save(std::span(p).first(8), a, nullptr);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find("RAM only"), std::string::npos) << err;
  State b = model->new_state();
  EXPECT_EQ(store.restore(p, 11, b, nullptr).position, 8);
}

// The mode bits of `path` (no link followed).
unsigned mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// A snapshot begins with the prompt's token ids: it is the conversation. Whatever the umask, the
// folders the store makes are 0700 and its files 0600, and a name planted in the folder (a link
// where a predictable temporary name would be) is never written through (issue 39, finding 4).
TEST(PrefixFiles, SnapshotsArePrivateAndNeverWrittenThroughALink) {
  auto model = open_model(golden("k3-tiny-mxfp4"));
  const auto p = prompt_of(12, model->config().vocab);
  State a = model->new_state();
  feed(*model, a, std::span(p).first(8));
  const mode_t old = ::umask(022);
  const std::string base = test::temp_dir("prefix_private");
  const std::string dir = base + "/cache/states";  // neither folder exists yet
  std::string name;
  {
    PrefixStore w(model->config(), disk_only(dir));
    w.save(std::span(p).first(8), a, nullptr);
  }
  ::umask(old);
  EXPECT_EQ(mode_of(base + "/cache"), 0700u);
  EXPECT_EQ(mode_of(dir), 0700u);
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(mode_of(e.path().string()), 0600u) << e.path();
    if (e.path().extension() == ".dfsnap") name = e.path().filename().string();
  }
  ASSERT_FALSE(name.empty());
  // The same snapshot into a folder where, once the store has opened it, someone plants a link
  // to a file of the user's at its temporary's old name (NAME.tmp): the file is untouched and
  // the snapshot is a file of its own.
  const std::string other = test::temp_dir("prefix_planted");
  const std::string precious = test::temp_dir("prefix_precious") + "/precious.txt";
  test::spit(precious, "precious\n");
  {
    PrefixStore w(model->config(), disk_only(other));
    fs::create_symlink(precious, other + "/" + name + ".tmp");
    w.save(std::span(p).first(8), a, nullptr);
  }
  EXPECT_TRUE(test::slurp(precious) == "precious\n") << "the linked file was written through";
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(other + "/" + name)));
  EXPECT_EQ(mode_of(other + "/" + name), 0600u);
  PrefixStore r(model->config(), disk_only(other));
  State b = model->new_state();
  EXPECT_EQ(r.restore(p, 11, b, nullptr).position, 8);
}

// The reuse policy: the cut positions of a chat prompt, and no cut where a snapshot is kept.
TEST(PrefixReuse, CutsAtTheEndOfTheMessagesAndALongSystemPrompt) {
  auto model = open_model(golden("k3-tiny-mxfp4"));
  PrefixStore store(model->config(), ram_only());
  const auto p = prompt_of(200, model->config().vocab);
  State s = model->new_state();
  SequenceReuse a(&store, p, PromptMarks{80, 190}, s, nullptr);
  EXPECT_EQ(std::vector<int64_t>(a.cuts().begin(), a.cuts().end()),
            (std::vector<int64_t>{80, 190}));
  SequenceReuse short_system(&store, p, PromptMarks{10, 190}, s, nullptr);
  EXPECT_EQ(std::vector<int64_t>(short_system.cuts().begin(), short_system.cuts().end()),
            (std::vector<int64_t>{190}));
  feed(*model, s, std::span(p).first(80));
  store.save(std::span(p).first(80), s, nullptr);
  State fresh = model->new_state();
  SequenceReuse b(&store, p, PromptMarks{80, 190}, fresh, nullptr);
  EXPECT_EQ(b.restored().position, 80);
  EXPECT_EQ(std::vector<int64_t>(b.cuts().begin(), b.cuts().end()), (std::vector<int64_t>{190}));
}

}  // namespace
}  // namespace deltafin
