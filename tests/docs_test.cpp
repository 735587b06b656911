// The repository explains itself: every document or source path a file of the tree cites names a
// file of the tree, and nothing points outside it (a clone has no sibling folders and none of
// the machine paths it was written on). Run over the files git tracks (plus new, unignored
// ones), or over the source tree when it is not a git checkout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>

#include "test_util.h"

namespace deltafin {
namespace {

namespace fs = std::filesystem;

fs::path source_root() {
  return fs::weakly_canonical(fs::path(test::data_dir()) / ".." / "..");
}

// Paths relative to the root, '/'-separated.
std::vector<std::string> tree_files(const fs::path& root) {
  std::vector<std::string> out;
  if (fs::exists(root / ".git")) {
    const std::string cmd = "git -C '" + root.string() +
                            "' ls-files -z --cached --others --exclude-standard 2>/dev/null";
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      std::string name;
      for (int ch; (ch = std::fgetc(p)) != EOF;) {
        if (ch != 0) {
          name += static_cast<char>(ch);
        } else {
          out.push_back(name);
          name.clear();
        }
      }
      ::pclose(p);
    }
    if (!out.empty()) return out;
  }
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() && (name == ".git" || name == "node_modules" ||
                               name.rfind("build", 0) == 0 || name == "__pycache__")) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) out.push_back(fs::relative(it->path(), root).generic_string());
  }
  return out;
}

// Text worth reading: not a fuzz input (random bytes by design), not an npm lockfile (what third
// parties wrote about their packages), not binary, not huge.
bool readable_text(const std::string& rel, const std::string& bytes) {
  if (rel.rfind("tests/data/fuzz/", 0) == 0) return false;
  if (fs::path(rel).filename() == "package-lock.json") return false;
  if (bytes.size() > (2u << 20)) return false;
  return bytes.find('\0') == std::string::npos;
}

struct Tree {
  fs::path root;
  std::vector<std::string> files;
  std::set<std::string> names;  // every file's path and every suffix after a '/'
  Tree() : root(source_root()), files(tree_files(root)) {
    for (const auto& f : files) {
      names.insert(f);
      for (size_t s = f.find('/'); s != std::string::npos; s = f.find('/', s + 1))
        names.insert(f.substr(s + 1));
    }
  }
};

const Tree& tree() {
  static const Tree t;
  return t;
}

// A cited path exists when, relative to the citing file (./ and ../ forms), it is a file or
// folder; otherwise when some file of the tree is it or ends with it (`docs/MODEL.md`,
// `model/taps.h` meaning src/model/taps.h, `MODEL.md` beside the citing document).
bool cited_path_exists(const Tree& t, const std::string& citing, const std::string& path) {
  const fs::path dir = (t.root / citing).parent_path();
  std::error_code ec;
  if (fs::exists(dir / path, ec)) return true;
  if (path.rfind("./", 0) == 0 || path.rfind("../", 0) == 0) return false;
  if (fs::exists(t.root / path, ec)) return true;
  return t.names.count(path) > 0;
}

// Citations: paths under a top-level folder of the repository or a layer folder of src/, with
// an extension, and Markdown file names. A match that continues a longer path (a build
// folder's `build/src/...`, a URL, `$VAR/...`) is not a citation of the tree.
const std::regex& citation() {
  static const std::regex re(
      R"((?:\.\.?/)*(?:docs|tools|src|tests|bench|include|python|web|cmake|fuzz|assets|\.ci|)"
      R"(core|tensor|kernels|gpu|tokenizer|model|storage|engine|generate|draft|fixtures|server|)"
      R"(cli|capi)/[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.[A-Za-z0-9]+|[A-Za-z0-9_-]+\.md)");
  return re;
}

bool continues_path(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/' ||
         c == '-' || c == '$' || c == '}' || c == '~' || c == ':';
}

TEST(Docs, EveryCitedPathExists) {
  const Tree& t = tree();
  ASSERT_GT(t.files.size(), 100u) << "no source tree found at " << t.root;
  int checked = 0;
  for (const auto& rel : t.files) {
    if (rel == "tests/docs_test.cpp") continue;  // its examples of missing documents
    const std::string text = test::slurp((t.root / rel).string());
    if (!readable_text(rel, text)) continue;
    for (std::sregex_iterator it(text.begin(), text.end(), citation()), end; it != end; ++it) {
      const auto at = static_cast<size_t>(it->position());
      if (at > 0 && continues_path(text[at - 1])) continue;
      std::string path = it->str();
      while (!path.empty() && path.back() == '.') path.pop_back();
      ++checked;
      const size_t line =
          1 + static_cast<size_t>(std::count(text.begin(), text.begin() + at, '\n'));
      EXPECT_TRUE(cited_path_exists(t, rel, path))
          << rel << ":" << line << " cites " << path << ", which is not in the tree";
    }
  }
  EXPECT_GT(checked, 200) << "the citation pattern found almost nothing: is it still right?";
}

// The checker itself: a cited document that does not exist is caught, one that does is not.
TEST(Docs, CitedPathCheckCatchesAMissingDocument) {
  const Tree& t = tree();
  EXPECT_TRUE(cited_path_exists(t, "docs/ARCHITECTURE.md", "MODEL.md"));
  EXPECT_TRUE(cited_path_exists(t, "src/model/model.cpp", "docs/MODEL.md"));
  EXPECT_TRUE(cited_path_exists(t, "src/model/model.cpp", "model/taps.h"));
  EXPECT_TRUE(cited_path_exists(t, "tests/data/eagle3-tiny/README.md", "../../../docs/MODEL.md"));
  EXPECT_FALSE(cited_path_exists(t, "tests/data/eagle3-tiny/README.md", "../../docs/MODEL.md"));
  EXPECT_FALSE(cited_path_exists(t, "src/draft/eagle3.h", "docs/NO-SUCH-NOTES.md"));
  EXPECT_FALSE(cited_path_exists(t, "docs/SPECULATIVE.md", "NO-SUCH-NOTES.md"));
  const std::string sample = "see docs/NO-SUCH-NOTES.md and build/src/cli/deltafin.bin";
  std::vector<std::string> found;
  for (std::sregex_iterator it(sample.begin(), sample.end(), citation()), end; it != end; ++it) {
    const auto at = static_cast<size_t>(it->position());
    if (at == 0 || !continues_path(sample[at - 1])) found.push_back(it->str());
  }
  EXPECT_EQ(found, std::vector<std::string>{"docs/NO-SUCH-NOTES.md"});
}

// Nothing refers to the folder beside the checkout the project was developed with, or to
// absolute paths of the machines it was measured on.
TEST(Docs, NothingPointsOutsideTheRepository) {
  const Tree& t = tree();
  const std::vector<std::string> outside = {std::string("../") + "shared",
                                            std::string("/") + "work/"};
  for (const auto& rel : t.files) {
    const std::string text = test::slurp((t.root / rel).string());
    if (!readable_text(rel, text)) continue;
    for (const auto& o : outside) {
      const size_t at = text.find(o);
      EXPECT_EQ(at, std::string::npos)
          << rel << ":" << 1 + std::count(text.begin(), text.begin() + static_cast<long>(at), '\n')
          << " refers to " << o << ", which a clone of the repository does not have";
    }
  }
}

}  // namespace
}  // namespace deltafin
