// Scratch files for tests, one folder per test process.
//
// ctest runs every GoogleTest case as a process of its own, several at once.
// Two cases that wrote the same fixed name under one shared folder raced: one
// renamed its finished file while the other was still writing it. Each process
// therefore gets build/test-tmp/p<pid>/, made on first use and removed when the
// process exits normally (a failed run's files stay only if it crashed).
#pragma once

#include <filesystem>
#include <string>
#include <system_error>

#ifdef _WIN32
#include <process.h>
#define LLM_TEST_GETPID _getpid
#else
#include <unistd.h>
#define LLM_TEST_GETPID getpid
#endif

namespace llm::testing {

class ProcessTmpDir {
 public:
  ProcessTmpDir()
      : pid_(long(LLM_TEST_GETPID())), path_(std::string(LLM_TEST_TMPDIR) + "/p" + std::to_string(pid_)) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);  // left by an earlier process with the same pid
    std::filesystem::create_directories(path_, ec);
  }
  ~ProcessTmpDir() {
    std::error_code ec;
    if (long(LLM_TEST_GETPID()) == pid_) std::filesystem::remove_all(path_, ec);  // not from a forked child
  }
  const std::string& path() const { return path_; }

 private:
  long pid_;
  std::string path_;
};

// This process's scratch folder; exists once this returns.
inline const std::string& tmp_dir() {
  static const ProcessTmpDir dir;
  return dir.path();
}

inline std::string tmp_path(const std::string& name) { return tmp_dir() + "/" + name; }

}  // namespace llm::testing
