#include "storage/place.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "core/checksum.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/json_parse.h"
#include "core/machine.h"
#include "core/mapped_file.h"
#include "core/sysinfo.h"
#include "core/timer.h"
#include "core/weight_buffer.h"
#include "model/config.h"
#include "storage/checkpoint.h"
#include "storage/expert_directory.h"
#include "storage/expert_store.h"
#include "storage/home.h"
#include "storage/placement.h"
#include "storage/plan.h"
#include "storage/shard_files.h"
#include "storage/trunk_units.h"

namespace deltafin {

namespace fs = std::filesystem;

namespace {

constexpr const char* kPlaceRecord = ".deltafin-place.json";
constexpr const char* kJournal = "journal";

// An aligned buffer freed on scope exit.
struct Buffer {
  explicit Buffer(uint64_t n) : p(alloc_weight_buffer(std::max<uint64_t>(n, kIoAlign), "a copy")) {}
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* p;
};

struct FdCloser {
  int fd = -1;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens a layer's data file in a copy's folder for writing (created 0600; an interrupted copy
// reopens it), with O_DIRECT where the file system takes it (the copy should not fill the page
// cache with a drive's worth of experts). Never through a link, and only a regular file.
int open_copy_file(const std::string& path, bool direct) {
  const int flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  int fd = -1;
#ifdef O_DIRECT
  if (direct) fd = ::open(path.c_str(), flags | O_DIRECT, 0600);
#endif
  if (fd < 0) fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0) fail_io("cannot create {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail_io("{} is not a regular file (expected the copy place writes there)", path);
  }
  return fd;
}

// Makes a folder of place's in a home (0700), or checks that the one an interrupted run made is
// a folder and not a link to elsewhere.
void make_place_folder(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) == 0) return;
  if (errno != EEXIST) fail_io("cannot create {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    fail_io("{} exists and is not a folder (expected the folder place copies into)", path);
}

// Removes a folder place made in `home` (by a name it recorded), never through a link.
void remove_place_folder(const std::string& home, const std::string& name) {
  if (!is_place_folder_name(name)) return;
  const std::string path = home + "/" + name;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return;
  std::error_code ec;
  fs::remove_all(path, ec);
}

uint64_t device_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_dev) : 0;
}

// The model folder opened for copying from.
struct Source {
  explicit Source(const std::string& model, bool direct_io)
      : config(load_config(model)),
        ck(Checkpoint::open(model)),
        format(check_inventory(config, *ck).expert_format),
        dir(config, *ck, format),
        files(*ck, direct_io),
        fingerprint(checkpoint_fingerprint(*ck)),
        scratch_bytes(ExpertStore::slot_bytes_for(dir, config)) {}
  ModelConfig config;
  std::unique_ptr<Checkpoint> ck;
  ExpertFormat format;
  ExpertDirectory dir;
  ShardFiles files;
  std::string fingerprint;
  uint64_t scratch_bytes;

  // The expert's image (storage/home.h) into `out`, as the store reads it.
  void read(int layer, int expert, uint8_t* out) const {
    const ExpertLocation& loc = dir.location(layer, expert);
    read_image(files, loc, 0, loc.image_bytes, out,
               fmt::format("expert {} of layer {}", expert, layer));
  }
  // Bytes its entry takes in a home's data file: the image.
  uint64_t span(int layer, int expert) const { return dir.location(layer, expert).image_bytes; }
};

// The decision for every home, as written to (and read back from) .deltafin-place.json.
struct Decision {
  std::string args;
  double model_probe = 0, model_share = 0;
  size_t replicated = 0;
  size_t spare_copies = 0;
  uint64_t spare_bytes = 0;
  struct Home {
    std::string dir;
    double probe = 0, share = 0;
    std::vector<std::pair<int, int>> experts;  // (layer, expert), ascending
    std::string folder;  // "data-ID": where its copy goes (FOLDER.partial until it is verified)
  };
  std::vector<Home> homes;

  std::string to_json() const {
    nlohmann::json j;
    j["args"] = args;
    j["model_probe_bytes_per_s"] = model_probe;
    j["model_share"] = model_share;
    j["replicated"] = replicated;
    j["spare_copies"] = spare_copies;
    j["spare_bytes"] = spare_bytes;
    for (const auto& h : homes) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& [l, e] : h.experts) list.push_back({l, e});
      j["homes"].push_back({{"dir", h.dir},
                            {"probe_bytes_per_s", h.probe},
                            {"share", h.share},
                            {"experts", list},
                            {"folder", h.folder}});
    }
    return j.dump() + "\n";
  }
  // The record in `home` if it is one of this request; nullopt otherwise.
  static std::optional<Decision> read(const std::string& home, const std::string& args) {
    std::error_code ec;
    const std::string path = home + "/" + kPlaceRecord;
    if (!fs::exists(path, ec)) return std::nullopt;
    try {
      const nlohmann::json j = parse_json(read_regular_file(path), path);
      if (j.at("args").get<std::string>() != args) return std::nullopt;
      Decision d;
      d.args = args;
      d.model_probe = j.at("model_probe_bytes_per_s").get<double>();
      d.model_share = j.at("model_share").get<double>();
      d.replicated = j.at("replicated").get<size_t>();
      d.spare_copies = j.value("spare_copies", size_t{0});
      d.spare_bytes = j.value("spare_bytes", uint64_t{0});
      for (const auto& h : j.at("homes")) {
        Home x;
        x.dir = h.at("dir").get<std::string>();
        x.probe = h.at("probe_bytes_per_s").get<double>();
        x.share = h.at("share").get<double>();
        for (const auto& p : h.at("experts"))
          x.experts.emplace_back(p.at(0).get<int>(), p.at(1).get<int>());
        x.folder = h.at("folder").get<std::string>();
        d.homes.push_back(std::move(x));
      }
      return d;
    } catch (const std::exception&) {
      return std::nullopt;  // a torn or foreign record: decide again
    }
  }
  // The folder the record in `home` (of any request) names for that home's copy; "" when there
  // is no such record or the name is not one place gives.
  static std::string folder_in(const std::string& home) {
    try {
      const std::string path = home + "/" + kPlaceRecord;
      const nlohmann::json j = parse_json(read_regular_file(path), path);
      for (const auto& h : j.at("homes")) {
        const std::string f = h.at("folder").get<std::string>();
        if (h.at("dir").get<std::string>() == home && is_place_folder_name(f) &&
            !f.ends_with(".partial"))
          return f;
      }
    } catch (const std::exception&) {
    }
    return "";
  }
};

// Offsets of a home's experts in their layer files: ascending expert ids, back to back.
std::vector<HomeEntry> lay_out(const Source& src, const std::vector<std::pair<int, int>>& experts) {
  std::vector<HomeEntry> out;
  std::map<int, uint64_t> end;
  for (const auto& [l, e] : experts) {
    HomeEntry h;
    h.layer = l;
    h.expert = e;
    h.bytes = src.dir.location(l, e).bytes;
    h.offset = end[l];
    end[l] += src.span(l, e);
    out.push_back(h);
  }
  return out;
}

std::string placement_id(const std::string& fingerprint, const std::vector<HomeEntry>& entries) {
  std::string text = std::string(kHomeFormat) + ";" + fingerprint;
  for (const auto& e : entries) text += fmt::format(";{},{},{}", e.layer, e.expert, e.offset);
  return checksum_hex(checksum64(text.data(), text.size()));
}

// Journal lines "LAYER EXPERT CHECKSUM" of the copies already synced in a partial folder.
std::map<std::pair<int, int>, uint64_t> read_journal(const std::string& path) {
  std::map<std::pair<int, int>, uint64_t> done;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline: torn by a crash
    int l = -1, e = -1;
    char hex[17] = {};
    uint64_t h = 0;
    if (std::sscanf(line.c_str(), "%d %d %16s", &l, &e, hex) == 3 && parse_checksum_hex(hex, &h))
      done[{l, e}] = h;
  }
  return done;
}

// Copies one home's experts into data-ID.partial, verifies them and publishes the home.
class HomeWriter {
 public:
  HomeWriter(const Source& src, const PlaceOptions& o, const Decision& d, const Decision::Home& h)
      : src_(src), o_(o), d_(d), h_(h), entries_(lay_out(src, h.experts)) {
    id_ = placement_id(src.fingerprint, entries_);
    partial_ = h.dir + "/" + folder() + ".partial";
    final_ = h.dir + "/" + folder();
  }

  // "data-ID": the folder this placement's copies go to in the home.
  std::string folder() const { return "data-" + id_; }

  bool published() const {
    try {
      const HomeManifest m = read_home_manifest(h_.dir);
      return m.placement == id_ && m.checkpoint == src_.fingerprint;
    } catch (const Error&) {
      return false;
    }
  }

  // Bytes still to write (what the journal does not hold yet).
  uint64_t bytes_to_write() {
    std::error_code ec;
    if (fs::is_directory(final_, ec)) return 0;  // written and verified; the manifest is next
    done_ = read_journal(partial_ + "/" + kJournal);
    uint64_t n = 0;
    for (const auto& e : entries_) {
      if (!done_.count({e.layer, e.expert})) n += src_.span(e.layer, e.expert);
    }
    return n;
  }
  uint64_t bytes() const {
    uint64_t n = 0;
    for (const auto& e : entries_) n += src_.span(e.layer, e.expert);
    return n;
  }
  size_t experts() const { return entries_.size(); }
  // Removes the copy an earlier request of place was making here, by the name its record gives
  // (a changed request decides anew), unless it is this request's or the published placement.
  void clear_earlier_copy() const {
    const std::string earlier = Decision::folder_in(h_.dir);
    if (earlier.empty() || earlier == folder()) return;
    remove_place_folder(h_.dir, earlier + ".partial");
    const auto made = home_folders_made(h_.dir);
    if (made.empty() || made.front() != earlier) remove_place_folder(h_.dir, earlier);
  }

  // Returns the bytes written by this run.
  uint64_t run() {
    std::error_code ec;
    uint64_t written = 0;
    if (!fs::is_directory(final_, ec)) {
      make_place_folder(partial_);
      written = copy();
      verify();
      sync_dir(partial_);
      fs::rename(partial_, final_, ec);
      if (ec) fail_io("cannot rename {} to {}: {}", partial_, final_, ec.message());
      sync_dir(h_.dir);
    }
    HomeManifest m;
    m.checkpoint = src_.fingerprint;
    m.placement = id_;
    m.args = d_.args;
    m.model = fs::absolute(o_.model).lexically_normal().string();
    m.probe_bytes_per_s = h_.probe;
    m.model_probe_bytes_per_s = d_.model_probe;
    const auto journal = read_journal(final_ + "/" + kJournal);
    for (HomeEntry e : entries_) {
      e.checksum = journal.at({e.layer, e.expert});
      m.experts.push_back(e);
    }
    // What the manifest being replaced names (its data folder, what it had yet to remove) is
    // superseded: recorded first, removed once the new manifest is published.
    for (const auto& name : home_folders_made(h_.dir)) {
      if (name != folder() && fs::exists(h_.dir + "/" + name, ec) &&
          std::find(m.superseded.begin(), m.superseded.end(), name) == m.superseded.end())
        m.superseded.push_back(name);
    }
    write_file_atomic(h_.dir + "/" + kHomeManifestName, m.to_json());
    sync_dir(h_.dir);
    for (const auto& name : m.superseded) remove_place_folder(h_.dir, name);
    return written;
  }

 private:
  void say(const std::string& line) const {
    if (o_.progress) o_.progress(line);
  }

  uint64_t copy() {
    done_ = read_journal(partial_ + "/" + kJournal);
    std::vector<size_t> todo;
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (!done_.count({entries_[i].layer, entries_[i].expert})) todo.push_back(i);
    }
    if (todo.empty()) return 0;
    if (!done_.empty())
      say(fmt::format("{}: continuing an interrupted copy ({} of {} experts already there)", h_.dir,
                      entries_.size() - todo.size(), entries_.size()));
    std::map<int, int> fds;
    for (size_t i : todo) {
      const int l = entries_[i].layer;
      if (!fds.count(l)) fds[l] = open_copy_file(partial_ + "/" + home_layer_file(l), o_.direct_io);
    }
    const std::string journal_path = partial_ + "/" + kJournal;
    const int journal =
        ::open(journal_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (journal < 0) fail_io("cannot open {}: {}", journal_path, std::strerror(errno));

    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::pair<size_t, uint64_t>> finished;  // (entry, checksum) not yet journaled
    // Workers still running (under mu): counted down as each ends, so the loop that starts them
    // must not read it.
    const size_t n_workers = static_cast<size_t>(std::max(1, o_.threads));
    size_t running = n_workers;
    std::atomic<size_t> next{0};
    std::atomic<bool> stop{false};
    std::exception_ptr error;
    uint64_t written = 0;
    std::vector<std::thread> workers;
    for (size_t t = 0; t < n_workers; ++t) {
      workers.emplace_back([&] {
        Buffer out(src_.scratch_bytes);
        for (size_t k = next++; k < todo.size() && !stop; k = next++) {
          try {
            if (o_.interrupted && o_.interrupted()) {
              stop = true;
              break;
            }
            const HomeEntry& e = entries_[todo[k]];
            src_.read(e.layer, e.expert, out.p);
            const uint64_t h = expert_checksum(src_.dir.location(e.layer, e.expert), out.p);
            const std::string path = partial_ + "/" + home_layer_file(e.layer);
            write_all_at(fds.at(e.layer), out.p, src_.span(e.layer, e.expert), e.offset, path);
            std::lock_guard<std::mutex> l(mu);
            finished.emplace_back(todo[k], h);
            written += src_.span(e.layer, e.expert);
            cv.notify_all();
          } catch (...) {
            std::lock_guard<std::mutex> l(mu);
            if (!error) error = std::current_exception();
            stop = true;
            cv.notify_all();
            break;
          }
        }
        std::lock_guard<std::mutex> l(mu);
        --running;
        cv.notify_all();
      });
    }
    // Syncs the data, then journals it: a journal line never names bytes that are not on disk.
    size_t journaled = done_.size();
    Stopwatch since_report;
    auto commit = [&](std::vector<std::pair<size_t, uint64_t>> batch) {
      if (batch.empty()) return;
      for (const auto& [l, fd] : fds) {
        if (::fdatasync(fd) != 0)
          fail_io("cannot sync {}: {}", partial_ + "/" + home_layer_file(l), std::strerror(errno));
      }
      std::string lines;
      for (const auto& [i, h] : batch)
        lines += fmt::format("{} {} {}\n", entries_[i].layer, entries_[i].expert, checksum_hex(h));
      write_all_at(journal, reinterpret_cast<const uint8_t*>(lines.data()), lines.size(),
                   static_cast<uint64_t>(::lseek(journal, 0, SEEK_END)), journal_path);
      if (::fdatasync(journal) != 0) fail_io("cannot sync {}", journal_path);
      journaled += batch.size();
      if (since_report.elapsed() >= 5.0) {
        say(fmt::format("{}: {} of {} experts copied", h_.dir, journaled, entries_.size()));
        since_report.reset();
      }
    };
    std::exception_ptr commit_error;
    {
      std::unique_lock<std::mutex> l(mu);
      Stopwatch since_sync;
      while (running > 0) {
        cv.wait_for(l, std::chrono::milliseconds(200));
        if (finished.size() >= 16 || since_sync.elapsed() >= 1.0) {
          auto batch = std::move(finished);
          finished.clear();
          l.unlock();
          try {
            commit(std::move(batch));
          } catch (...) {
            if (!commit_error) commit_error = std::current_exception();
            stop = true;
          }
          since_sync.reset();
          l.lock();
        }
      }
    }
    for (auto& t : workers) t.join();
    try {
      if (!commit_error) commit(std::move(finished));
    } catch (...) {
      commit_error = std::current_exception();
    }
    for (const auto& [l, fd] : fds) ::close(fd);
    ::close(journal);
    if (error) std::rethrow_exception(error);
    if (commit_error) std::rethrow_exception(commit_error);
    if (journaled < entries_.size()) {
      fail(
          "place interrupted: {} of {} experts copied to {} (synced); run the same command again "
          "to continue",
          journaled, entries_.size(), h_.dir);
    }
    return written;
  }

  // Every copy read back from the drive and checked against the checksum taken from the model.
  void verify() {
    const auto journal = read_journal(partial_ + "/" + kJournal);
    std::map<int, std::unique_ptr<DirectFile>> files;
    for (const auto& e : entries_) {
      if (!files.count(e.layer))
        files[e.layer] =
            std::make_unique<DirectFile>(partial_ + "/" + home_layer_file(e.layer), o_.direct_io);
    }
    run_on_threads(entries_.size(), o_.threads, [&](size_t i) {
      thread_local std::unique_ptr<Buffer> buf;
      if (!buf) buf = std::make_unique<Buffer>(src_.scratch_bytes);
      const HomeEntry& e = entries_[i];
      const std::string what = fmt::format("expert {} of layer {}", e.expert, e.layer);
      const ExpertLocation& loc = src_.dir.location(e.layer, e.expert);
      files.at(e.layer)->read_aligned(e.offset, loc.image_bytes, buf->p, loc.image_bytes, what);
      if (expert_checksum(loc, buf->p) != journal.at({e.layer, e.expert}))
        fail_io("{} in {} does not read back as written: the drive may be failing", what, partial_);
    });
  }

  const Source& src_;
  const PlaceOptions& o_;
  const Decision& d_;
  const Decision::Home& h_;
  std::vector<HomeEntry> entries_;
  std::string id_, partial_, final_;
  std::map<std::pair<int, int>, uint64_t> done_;
};

std::string canonical_home(const std::string& home) {
  std::error_code ec;
  fs::path p = fs::absolute(home, ec).lexically_normal();
  if (!fs::exists(p, ec)) {
    if (!fs::is_directory(p.parent_path(), ec))
      fail_setting("home", home, "neither it nor its parent folder exists (is the drive mounted?)");
    if (::mkdir(p.c_str(), 0700) != 0 && errno != EEXIST)
      fail_io("cannot create the home {}: {}", home, std::strerror(errno));
  }
  if (!fs::is_directory(p, ec)) fail_setting("home", home, "not a folder");
  return fs::canonical(p, ec).string();
}

// Step 3's room per home, after the share placement `p`: kSpareShareOfFree of what its drive has
// free beyond the shares of every home on it (homes on one drive split it). The budget per home
// needs no term here: it is the home's capacity, which plan_placement's filling respects.
std::vector<uint64_t> spare_room(const std::vector<std::string>& homes, const Placement& p,
                                 const std::vector<uint64_t>& bytes) {
  std::vector<uint64_t> share_bytes(homes.size(), 0), spare(homes.size(), 0);
  std::map<uint64_t, std::vector<size_t>> by_drive;
  for (size_t h = 0; h < homes.size(); ++h) {
    for (size_t e : p.homes[h]) share_bytes[h] += bytes[e];
    by_drive[device_of(homes[h])].push_back(h);
  }
  for (const auto& [dev, hs] : by_drive) {
    const uint64_t free = free_bytes(homes[hs.front()]).value_or(0);
    uint64_t taken = 0;
    for (size_t h : hs) taken += share_bytes[h];
    if (free <= taken) continue;
    const auto each = static_cast<uint64_t>(static_cast<double>(free - taken) * kSpareShareOfFree /
                                            static_cast<double>(hs.size()));
    for (size_t h : hs) spare[h] = each;
  }
  return spare;
}

// The decision for this request: the one a previous run wrote (a rerun continues it) or a new
// one from fresh probes.
Decision decide(const Source& src, const PlaceOptions& o, const std::vector<std::string>& homes,
                const std::string& args) {
  std::optional<Decision> prev;
  for (const auto& h : homes) {
    auto d = Decision::read(h, args);
    if (!d || d->homes.size() != homes.size() || (prev && d->to_json() != prev->to_json())) {
      prev.reset();
      break;
    }
    prev = std::move(d);
  }
  if (prev) {
    if (o.progress) o.progress("continuing the placement an earlier run decided");
    return *prev;
  }
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  Decision d;
  d.args = args;
  std::vector<std::string> shards;
  for (const auto& s : src.ck->shards()) shards.push_back(s.path());
  d.model_probe = probe_files(shards, o.threads, o.probe_bytes, 1, 4ull << 20);
  if (!(d.model_probe > 0)) fail_io("could not read the model folder {} to probe it", o.model);
  say(fmt::format("probe: model folder {} reads at {:.2f} GB/s", o.model, d.model_probe / 1e9));
  PlacementRequest r;
  r.model_bandwidth = d.model_probe;
  for (const auto& h : homes) {
    const double bw = probe_dir(h, "the home " + h, o.probe_bytes, o.threads, 2, 4ull << 20);
    say(fmt::format("probe: home {} reads at {:.2f} GB/s", h, bw / 1e9));
    r.home_bandwidth.push_back(bw);
    r.home_capacity.push_back(o.budget_per_home > 0 ? o.budget_per_home : kNoCapacityLimit);
  }
  const ExpertDirectory& dir = src.dir;
  const int first = dir.first_moe_layer(), E = dir.num_experts();
  const auto heat = read_heat_file(o.heat_file, dir.num_layers(), E);
  uint64_t heat_total = 0;
  for (uint64_t h : heat) heat_total += h;
  std::vector<std::pair<int, int>> keys;
  for (int l = first; l < dir.num_layers(); ++l) {
    for (int e = 0; e < E; ++e) {
      keys.emplace_back(l, e);
      // One count more than seen, so an expert no run asked for yet still has a place.
      r.heat.push_back(static_cast<double>(heat[static_cast<size_t>(l * E + e)]) + 1.0);
      r.bytes.push_back(src.span(l, e));
    }
  }
  say(heat_total > 0 ? fmt::format("heat: {} expert uses counted by earlier runs", heat_total)
                     : std::string("heat: no earlier runs counted; all experts count as equal"));
  r.replicate = o.replicate == kSpareRoom ? 0.0 : o.replicate;
  Placement p = plan_placement(r);
  if (o.replicate == kSpareRoom) {
    r.spare = spare_room(homes, p, r.bytes);
    p = plan_placement(r);
    say(fmt::format(
        "spare room: {} more copies of the hottest experts ({}) beyond the homes' shares, in up "
        "to {:.0f}% of each home drive's free space (a replicated share of 0 keeps the shares "
        "alone; the budget per home caps a home)",
        p.spare_copies, gib(p.spare_bytes), 100.0 * kSpareShareOfFree));
  }
  d.spare_copies = p.spare_copies;
  d.spare_bytes = p.spare_bytes;
  d.model_share = p.share[0];
  d.replicated = p.replicated;
  for (size_t h = 0; h < homes.size(); ++h) {
    Decision::Home x;
    x.dir = homes[h];
    x.probe = r.home_bandwidth[h];
    x.share = p.share[h + 1];
    for (size_t i : p.homes[h]) x.experts.push_back(keys[i]);
    d.homes.push_back(std::move(x));
  }
  return d;
}

}  // namespace

PlaceResult place_experts(const PlaceOptions& o) {
  if (o.homes.empty()) fail_setting("home", "", "place needs at least one home folder");
  if (o.replicate != kSpareRoom && !(o.replicate >= 0 && o.replicate <= 1))
    fail_setting("replicate", fmt::format("{}", o.replicate), "expected a share between 0 and 1");
  const Source src(o.model, o.direct_io);
  const std::string model_dir = fs::canonical(o.model).string();
  std::vector<std::string> homes;
  for (const auto& h : o.homes) {
    const std::string c = canonical_home(h);
    if (c == model_dir) fail_setting("home", h, "is the model folder itself");
    if (std::find(homes.begin(), homes.end(), c) != homes.end())
      fail_setting("home", h, "given twice");
    homes.push_back(c);
  }
  for (size_t i = 0; i < homes.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (device_of(homes[i]) == device_of(homes[j]) && o.progress)
        o.progress(
            fmt::format("warning: homes {} and {} are on the same drive: they share its "
                        "bandwidth",
                        homes[j], homes[i]));
    }
  }
  std::vector<std::string> sorted = homes;
  std::sort(sorted.begin(), sorted.end());
  std::string args_text = fmt::format("{}|{}|{}", src.fingerprint, o.budget_per_home, o.replicate);
  for (const auto& h : sorted) args_text += "|" + h;
  const std::string args = checksum_hex(checksum64(args_text.data(), args_text.size()));

  PlaceResult res;
  // Already this request's placement everywhere: nothing to probe, decide or write.
  bool up_to_date = true;
  std::vector<HomeManifest> current;
  for (const auto& h : homes) {
    try {
      HomeManifest m = read_home_manifest(h);
      up_to_date = up_to_date && m.args == args && m.checkpoint == src.fingerprint;
      current.push_back(std::move(m));
    } catch (const Error&) {
      up_to_date = false;
    }
  }
  if (up_to_date) {
    res.model_probe_bytes_per_s = current.front().model_probe_bytes_per_s;
    for (size_t i = 0; i < homes.size(); ++i) {
      ExpertHome check(homes[i], src.fingerprint, src.dir, o.direct_io);  // its files are there
      PlacedHome ph;
      ph.dir = homes[i];
      ph.probe_bytes_per_s = current[i].probe_bytes_per_s;
      ph.experts = current[i].experts.size();
      for (const auto& e : current[i].experts) ph.bytes += src.span(e.layer, e.expert);
      ph.up_to_date = true;
      res.homes.push_back(ph);
    }
    return res;
  }

  Decision d = decide(src, o, homes, args);
  std::vector<std::unique_ptr<HomeWriter>> writers;
  for (auto& h : d.homes) {
    writers.push_back(std::make_unique<HomeWriter>(src, o, d, h));
    h.folder = writers.back()->folder();
  }
  for (const auto& w : writers) w->clear_earlier_copy();
  // Room: every drive must hold what its homes still need, before anything is written.
  std::map<uint64_t, std::pair<uint64_t, std::vector<std::string>>> need;  // device -> bytes
  for (size_t i = 0; i < homes.size(); ++i) {
    if (writers[i]->published()) continue;
    auto& n = need[device_of(homes[i])];
    // + the manifest and the journal (under 128 bytes per expert each)
    n.first += writers[i]->bytes_to_write() + 4096 + 256 * writers[i]->experts();
    n.second.push_back(homes[i]);
  }
  for (const auto& [dev, n] : need) {
    const std::optional<uint64_t> free_space = free_bytes(n.second.front());
    if (!free_space) fail_io("cannot stat the drive of {}", n.second.front());
    const uint64_t free = *free_space;
    if (n.first > free) {
      std::string names;
      for (const auto& h : n.second) names += (names.empty() ? "" : ", ") + h;
      fail_arg(
          "no room: {} need{} {} more for {} share of the experts, the drive has {} free (free "
          "space, or lower the budget per home to place fewer experts there); nothing was "
          "written",
          names, n.second.size() == 1 ? "s" : "", gib(n.first),
          n.second.size() == 1 ? "its" : "their", gib(free));
    }
  }
  for (const auto& h : homes) write_file_atomic(h + "/" + kPlaceRecord, d.to_json());
  res.model_probe_bytes_per_s = d.model_probe;
  res.model_share = d.model_share;
  res.replicated = d.replicated;
  res.spare_copies = d.spare_copies;
  res.spare_bytes = d.spare_bytes;
  for (size_t i = 0; i < homes.size(); ++i) {
    PlacedHome ph;
    ph.dir = homes[i];
    ph.probe_bytes_per_s = d.homes[i].probe;
    ph.share = d.homes[i].share;
    ph.experts = writers[i]->experts();
    ph.bytes = writers[i]->bytes();
    ph.up_to_date = writers[i]->published();
    if (!ph.up_to_date) ph.bytes_written = writers[i]->run();
    res.homes.push_back(ph);
  }
  for (const auto& h : homes) {
    std::error_code ec;
    fs::remove(h + "/" + kPlaceRecord, ec);
  }
  return res;
}

std::vector<HomeCheck> verify_homes(const std::string& model, const std::vector<std::string>& homes,
                                    bool direct_io) {
  const Source src(model, direct_io);
  std::vector<HomeCheck> out;
  for (const auto& h : homes) {
    HomeCheck c;
    c.dir = h;
    std::unique_ptr<ExpertHome> home;
    try {
      home = std::make_unique<ExpertHome>(h, src.fingerprint, src.dir, direct_io);
    } catch (const Error& e) {
      c.problems.push_back(e.what());
      out.push_back(std::move(c));
      continue;
    }
    const auto& entries = home->manifest().experts;
    c.experts = entries.size();
    std::mutex mu;
    run_on_threads(entries.size(), 4, [&](size_t i) {
      thread_local std::unique_ptr<Buffer> a, b;
      if (!a) {
        a = std::make_unique<Buffer>(src.scratch_bytes);
        b = std::make_unique<Buffer>(src.scratch_bytes);
      }
      const HomeEntry& e = entries[i];
      const std::string what = fmt::format("expert {} of layer {}", e.expert, e.layer);
      std::string problem;
      try {
        home->read(e, a->p, what);
        src.read(e.layer, e.expert, b->p);
        if (!same_expert_bytes(src.dir.location(e.layer, e.expert), a->p, b->p))
          problem = fmt::format("{} differs from the model folder's bytes", what);
      } catch (const Error& err) {
        problem = err.what();
      }
      std::lock_guard<std::mutex> l(mu);
      c.bytes += src.span(e.layer, e.expert);
      if (!problem.empty()) c.problems.push_back(problem);
    });
    std::sort(c.problems.begin(), c.problems.end());
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace deltafin
