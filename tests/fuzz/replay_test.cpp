// Replays every fuzz target (compiled with LLM_FUZZ_REPLAY) over the inputs
// that once crashed it (tests/fuzz/regressions/<target>/, committed) and over
// the generated seed corpus (<build>/fuzz-seeds/<target>/, written by
// llm_fuzz_make_seeds as the ctest fixture fuzz.make_seeds). This is how a
// fuzz finding becomes a regression test in the normal and sanitizer builds.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "fuzz_common.h"

namespace llm::fuzz {

namespace {

std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}
std::vector<std::string>& failures() {
  static std::vector<std::string> f;
  return f;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    const std::string path = dir + "/" + e->d_name;
    struct stat st;
    if (e->d_name[0] != '.' && stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) out.push_back(path);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::vector<std::string> target_names() {
  std::vector<std::string> names;
  for (const auto& kv : registry()) names.push_back(kv.first);
  return names;
}

}  // namespace

bool register_target(const char* name, Entry entry) {
  registry()[name] = entry;
  return true;
}

void report_failure(const char* file, int line, const char* what) {
  failures().push_back(std::string(file) + ":" + std::to_string(line) + ": " + what + " (last error: " +
                       llm_last_error() + ")");
}

class FuzzReplay : public ::testing::TestWithParam<std::string> {};

void replay_dir(const std::string& target, const std::string& dir, size_t* n_inputs) {
  const Entry entry = registry().at(target);
  for (const std::string& path : files_in(dir)) {
    const std::vector<uint8_t> bytes = read_all(path);
    failures().clear();
    entry(bytes.data(), bytes.size());
    for (const std::string& f : failures()) ADD_FAILURE() << path << ": " << f;
    ++*n_inputs;
  }
}

// Inputs that once crashed or broke an invariant (committed, small).
TEST_P(FuzzReplay, Regressions) {
  size_t n = 0;
  replay_dir(GetParam(), std::string(LLM_FUZZ_REGRESSION_DIR) + "/" + GetParam(), &n);
  RecordProperty("inputs", int(n));
}

// The generated seed corpus: valid and near-valid files of every kind.
TEST_P(FuzzReplay, Seeds) {
  const std::string dir = std::string(LLM_FUZZ_SEED_DIR) + "/" + GetParam();
  size_t n = 0;
  replay_dir(GetParam(), dir, &n);
  if (n == 0) GTEST_SKIP() << "no seeds in " << dir << " (run llm_fuzz_make_seeds)";
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzReplay, ::testing::ValuesIn(target_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace llm::fuzz
