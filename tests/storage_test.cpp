// The storage layer's shared pieces: the one shard reader (ShardFiles) and the reader pool.
// The O_DIRECT fallback is exercised the way a file system that refuses O_DIRECT reads behaves:
// the read fails with EINVAL (here: a destination off the block grid), the shard switches to its
// buffered descriptor for good, and readers running at the same time all get correct bytes.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "storage/checkpoint.h"
#include "storage/reader_pool.h"
#include "storage/shard_files.h"
#include "test_util.h"

namespace deltafin {
namespace {

TEST(ShardFiles, EinvalFallbackUnderConcurrentReaders) {
  auto ck = Checkpoint::open(test::data_dir() + "/k3-tiny-mxfp4/model");
  ShardFiles files(*ck, /*direct_io=*/true);
  if (!files.direct()) GTEST_SKIP() << "this file system refuses O_DIRECT at open";
  const int n_shards = static_cast<int>(ck->shards().size());
  constexpr int kTasks = 96;
  ReaderPool pool(6);
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::string> errors;
  for (int t = 0; t < kTasks; ++t) {
    pool.submit(ReaderPool::Priority::kDemand, [&, t] {
      const int shard = t % n_shards;
      const uint64_t size = ck->shards()[static_cast<size_t>(shard)].size();
      const uint64_t offset = io_align_down((static_cast<uint64_t>(t) * 7919 * kIoAlign) % size);
      const uint64_t length = 2 * kIoAlign;
      const uint64_t need = std::min(length, size - offset);
      // Every third task reads into a buffer one byte off the grid: O_DIRECT refuses it.
      uint8_t* buf = static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, length + kIoAlign));
      uint8_t* dst = buf + (t % 3 == 1 ? 1 : 0);
      std::string err;
      try {
        files.read_aligned(shard, offset, length, dst, need, "test bytes");
        const uint8_t* want = ck->shards()[static_cast<size_t>(shard)].data() + offset;
        if (std::memcmp(dst, want, need) != 0) err = "wrong bytes in task " + std::to_string(t);
      } catch (const std::exception& e) {
        err = e.what();
      }
      std::free(buf);
      std::lock_guard<std::mutex> l(mu);
      if (!err.empty()) errors.push_back(err);
      ++done;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return done == kTasks; });
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_FALSE(files.direct());  // the shards that hit EINVAL now read buffered
}

TEST(ShardFiles, ShortReadNamesTheFile) {
  auto ck = Checkpoint::open(test::data_dir() + "/k3-tiny-mxfp4/model");
  ShardFiles files(*ck, /*direct_io=*/false);
  const uint64_t size = ck->shards()[0].size();
  std::vector<uint8_t> buf(2 * kIoAlign);
  try {
    files.read_aligned(0, io_align_down(size), 2 * kIoAlign, buf.data(), 2 * kIoAlign, "a tail");
    FAIL() << "expected an IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("short read of a tail from " + ck->shards()[0].path()),
              std::string::npos)
        << e.what();
  }
}

TEST(ReaderPool, DemandRunsBeforeBackground) {
  ReaderPool pool(1);
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::vector<std::string> order;
  pool.submit(ReaderPool::Priority::kDemand, [&] {  // holds the only thread
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return release; });
  });
  auto record = [&](const char* name) {
    return [&, name] {
      std::lock_guard<std::mutex> l(mu);
      order.push_back(name);
      cv.notify_all();
    };
  };
  pool.submit(ReaderPool::Priority::kBackground, record("background"));
  pool.submit(ReaderPool::Priority::kDemand, record("demand"));
  {
    std::lock_guard<std::mutex> l(mu);
    release = true;
  }
  cv.notify_all();
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return order.size() == 2; });
  EXPECT_EQ(order, (std::vector<std::string>{"demand", "background"}));
}

}  // namespace
}  // namespace deltafin
