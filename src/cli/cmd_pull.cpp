// `deltafin pull REPO [--dir DIR] [--revision R] [--include trunk|experts|all] [--draft REPO]`:
// fetches a model repository from the Hugging Face hub (or HF_ENDPOINT) into a folder that run,
// serve and doctor take as is. The listing is pinned to one commit; files are fetched by
// several connections in chunks, resumably, checked against the listing's hashes and renamed
// into place (pull/fetch.h); a manifest of what was published (DIR/.deltafin-pull/manifest.json)
// lets a later run skip what it already has and lets `doctor --verify` check the hashes.
// Folders it creates are 0700 and files 0600; pull's state folder is reached only through
// PullState (no symbolic link followed), and after a successful run the partial files of files
// the revision no longer lists are removed.
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "core/json_parse.h"
#include "core/machine.h"
#include "model/inventory.h"
#include "pull/fetch.h"
#include "pull/hub.h"

namespace deltafin::cli {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
using pull::check_repo_name, pull::Deadline, pull::fetch_files, pull::FetchOptions,
    pull::FetchResult, pull::file_git_oid, pull::file_sha256, pull::get_hub_json,
    pull::hub_endpoint, pull::hub_token, pull::HttpClient, pull::HubFile, pull::HubRepo,
    pull::list_repo, pull::listing_timeout, pull::PullState, pull::resolve_url;

struct PullArgs {
  std::string repo, dir, revision = "main", include = "all", draft, chunk_size = "64M";
  int connections = 8;
};

// The folder to pull into: created (0700, with any missing parents) if missing; refused if it
// exists and is not a folder.
void prepare_dir(const std::string& dir) {
  std::error_code ec;
  const auto st = fs::status(dir, ec);  // follows a symlink to a folder, which is fine
  if (fs::exists(st)) {
    if (!fs::is_directory(st))
      fail_arg("--dir {} exists and is not a folder: refusing to use it", dir);
    return;
  }
  fs::path at;
  for (const auto& part : fs::path(dir)) {
    at /= part;
    if (::mkdir(at.c_str(), 0700) != 0 && errno != EEXIST)
      fail("--dir {}: cannot create {}: {}", dir, at.string(), std::strerror(errno));
  }
  if (!fs::is_directory(dir, ec)) fail("--dir {}: cannot create it: not a folder", dir);
}

// Refuses to write where a listed path would land on something other than a regular file (or
// pass through anything other than a real folder): no symlink, device or folder is replaced.
void check_target(const std::string& dir, const std::string& path) {
  fs::path at = dir;
  const fs::path rel(path);
  for (auto it = rel.begin(); it != rel.end(); ++it) {
    at /= *it;
    struct stat st {};
    if (::lstat(at.c_str(), &st) != 0) return;  // nothing there yet: it will be created
    const bool last = std::next(it) == rel.end();
    if (S_ISLNK(st.st_mode))
      fail("{} exists and is a symbolic link: refusing to write through or over it (remove it)",
           at.string());
    if (last && !S_ISREG(st.st_mode))
      fail("{} exists and is not a regular file: refusing to replace it", at.string());
    if (!last && !S_ISDIR(st.st_mode))
      fail("{} exists and is not a folder: refusing to write under it", at.string());
  }
}

// --include: metadata files always; safetensors shards by what they hold (from the index).
std::vector<HubFile> select_files(HttpClient& http, const HubRepo& r, const std::string& include,
                                  bool have_token) {
  if (include == "all") return r.files;
  std::map<std::string, std::pair<bool, bool>> holds;  // shard -> (trunk, experts)
  for (const auto& f : r.files) {
    if (f.path != "model.safetensors.index.json") continue;
    const Deadline deadline = std::chrono::steady_clock::now() + listing_timeout();
    const auto j = parse_json(
        get_hub_json(http, resolve_url(r, f.path), f.path, deadline, have_token), f.path);
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: no weight_map: cannot tell trunk shards from expert shards", f.path);
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) continue;
      auto& h = holds[it.value().get<std::string>()];
      (is_routed_expert_tensor(it.key()) ? h.second : h.first) = true;
    }
  }
  std::vector<HubFile> out;
  for (const auto& f : r.files) {
    auto it = holds.find(f.path);
    const bool shard = f.path.ends_with(".safetensors") && it != holds.end();
    if (!shard || (include == "trunk" ? it->second.first : it->second.second)) out.push_back(f);
  }
  return out;
}

void pull_one(const PullArgs& a, const std::string& repo_name, const std::string& revision,
              const std::string& dir) {
  check_repo_name(repo_name);
  prepare_dir(dir);
  const std::string token = hub_token(), endpoint = hub_endpoint();
  HttpClient http(token, endpoint);
  const HubRepo repo = list_repo(http, endpoint, repo_name, revision, !token.empty());
  const std::vector<HubFile> files = select_files(http, repo, a.include, !token.empty());
  for (const auto& f : files) check_target(dir, f.path);
  PullState state(dir);
  // What an earlier pull published (and verified): skipped when the listing agrees.
  std::map<std::string, ojson> published;
  std::error_code ec;
  if (const std::string text = state.read_manifest(); !text.empty()) {
    try {
      const auto m = parse_json(text, "manifest.json");
      for (const auto& f : m.at("files")) published[f.at("path").get<std::string>()] = f;
    } catch (const std::exception&) {
      // An unreadable manifest only costs re-checking the files.
    }
  }
  std::vector<HubFile> todo;
  uint64_t total = 0, present = 0;
  for (const auto& f : files) {
    total += f.size;
    const fs::path target = fs::path(dir) / f.path;
    std::error_code e2;
    if (fs::is_regular_file(target, e2) && fs::file_size(target, e2) == f.size) {
      auto it = published.find(f.path);
      const bool same = it != published.end() && it->second.value("oid", "") == f.oid &&
                        it->second.value("sha256", "") == f.sha256;
      // A file from elsewhere (another tool, an older pull) is adopted when its hash matches.
      if (same || (!f.sha256.empty() ? file_sha256(target.string()) == f.sha256
                                     : !f.oid.empty() && file_git_oid(target.string()) == f.oid)) {
        present += f.size;
        continue;
      }
    }
    todo.push_back(f);
  }
  uint64_t need = 0;
  for (const auto& f : todo) need += f.size;
  // Space: the partial files' blocks are already reserved. Progress: the chunks their maps hold.
  const uint64_t have = state.partial_bytes(todo);
  need -= std::min(need, have);
  const uint64_t chunk_bytes = parse_size(a.chunk_size, "--chunk-size");
  const uint64_t fetched_before = state.fetched_bytes(todo, chunk_bytes);
  const uint64_t free = free_bytes(dir).value_or(0);
  if (need > free) {
    fail(
        "{} has {} free, and {} at {} needs {} more ({} in all): free space or choose another "
        "--dir",
        dir, disk_bytes(static_cast<double>(free)), repo_name, repo.commit.substr(0, 12),
        disk_bytes(static_cast<double>(need)), disk_bytes(static_cast<double>(total)));
  }
  fmt::print(stderr, "pull: {} at {} into {}: {} files, {} ({} already here{})\n", repo_name,
             repo.commit.substr(0, 12), dir, files.size(), disk_bytes(static_cast<double>(total)),
             disk_bytes(static_cast<double>(present)),
             fetched_before > 0 ? fmt::format(", {} fetched by an earlier run",
                                              disk_bytes(static_cast<double>(fetched_before)))
                                : std::string());
  FetchOptions fo;
  fo.connections = a.connections;
  fo.chunk_bytes = chunk_bytes;
  FetchResult fr;
  if (!todo.empty()) fr = fetch_files(repo, todo, state, token, fo);
  // The manifest: every file of this selection, as listed (doctor --verify checks against it).
  ojson m{{"endpoint", endpoint},
          {"repo", repo_name},
          {"revision", revision},
          {"commit", repo.commit},
          {"files", ojson::array()}};
  std::set<std::string> listed;
  for (const auto& f : files) {
    listed.insert(f.path);
    m["files"].push_back(
        {{"path", f.path}, {"size", f.size}, {"oid", f.oid}, {"sha256", f.sha256}});
  }
  for (const auto& [path, f] : published)  // files of an earlier --include stay listed
    if (!listed.count(path) && f.value("oid", "") != "" && fs::exists(fs::path(dir) / path, ec))
      m["files"].push_back(f);
  state.write_manifest(m.dump(1) + "\n");
  // Partial files of files this revision no longer lists (an older revision's, a stopped run's).
  if (const int removed = state.remove_stale_partials(repo.files); removed > 0)
    fmt::print(stderr, "pull: removed {} partial files of files no longer listed\n", removed);
  fmt::print(stderr, "pull: {} ready: {} files, {} fetched in {:.1f} s{}\n", dir, files.size(),
             disk_bytes(static_cast<double>(fr.bytes_fetched)), fr.seconds,
             fr.refetched > 0
                 ? fmt::format(" ({} fetched again after a hash mismatch)", fr.refetched)
                 : std::string());
}

void run_pull(const PullArgs& a) {
  check_repo_name(a.repo);
  if (!a.draft.empty()) check_repo_name(a.draft);
  if (parse_size(a.chunk_size, "--chunk-size") < 4096)
    fail_usage("--chunk-size {} is below 4K", a.chunk_size);
  const std::string dir = a.dir.empty() ? a.repo.substr(a.repo.find('/') + 1) : a.dir;
  pull_one(a, a.repo, a.revision, dir);
  if (!a.draft.empty()) {
    PullArgs d = a;
    d.include = "all";
    pull_one(d, a.draft, "main", (fs::path(dir) / "draft").string());
  }
  fmt::print("{}\n", dir);
}

}  // namespace

void register_pull(CLI::App& app) {
  auto a = std::make_shared<PullArgs>();
  auto* cmd = app.add_subcommand(
      "pull", "Fetch a model from the Hugging Face hub: resumable, parallel, every file verified");
  cmd->add_option("repo", a->repo, "Repository, e.g. moonshotai/Kimi-K3")->required();
  cmd->add_option("--dir", a->dir, "Folder to fetch into (default: the repository's name)");
  cmd->add_option("--revision", a->revision, "Branch, tag or commit")->capture_default_str();
  cmd->add_option("--include", a->include,
                  "all files, or only the shards holding trunk tensors (trunk) or routed experts "
                  "(experts), with the metadata files either way")
      ->capture_default_str()
      ->check(CLI::IsMember({"all", "trunk", "experts"}));
  cmd->add_option("--draft", a->draft, "Also fetch this drafter repository into DIR/draft");
  cmd->add_option("--connections", a->connections, "Connections at once")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--chunk-size", a->chunk_size,
                  "Bytes per ranged request (resumption works chunk by chunk)")
      ->capture_default_str();
  cmd->callback([a] { run_pull(*a); });
}

}  // namespace deltafin::cli
