// Helpers the fuzz targets share: a scratch file per process for readers that take a path, and
// argument lists decoded from newline-separated tokens.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

namespace scmoe::fuzz {

// A file under /dev/shm (memory; the system temp directory where absent) named after the process,
// rewritten by every input and removed at exit.
class ScratchFile {
  public:
    explicit ScratchFile(const std::string& tag) {
        namespace fs = std::filesystem;
        std::error_code ec;
        const fs::path dir = fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
        path_ = (dir / ("scmoe-fuzz-" + tag + "-" + std::to_string(::getpid()))).string();
    }
    ~ScratchFile() { std::remove(path_.c_str()); }
    ScratchFile(const ScratchFile&) = delete;
    ScratchFile& operator=(const ScratchFile&) = delete;

    const std::string& path() const { return path_; }
    void write(const void* data, std::size_t size) const {
        std::ofstream out(path_, std::ios::binary | std::ios::trunc);
        out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
        out.close();
        if (!out) {
            std::fprintf(stderr, "fuzz harness: cannot write %s\n", path_.c_str());
            std::abort();
        }
    }
    void write(std::string_view text) const { write(text.data(), text.size()); }

  private:
    std::string path_;
};

// The harness found a broken property: abort with a message (libFuzzer saves the input).
[[noreturn]] inline void property_failed(const char* what) {
    std::fprintf(stderr, "fuzz property failed: %s\n", what);
    std::abort();
}

// argv for a command-line parser: program name, then the input's newline-separated tokens (at most
// `max_tokens`; a final empty token is dropped).
class ArgList {
  public:
    ArgList(const char* program, const std::uint8_t* data, std::size_t size, std::size_t max_tokens = 64) {
        tokens_.emplace_back(program);
        std::string_view text(reinterpret_cast<const char*>(data), size);
        while (!text.empty() && tokens_.size() <= max_tokens) {
            const std::size_t end = text.find('\n');
            tokens_.emplace_back(text.substr(0, end));
            text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
        }
        for (const std::string& t : tokens_) argv_.push_back(t.c_str());
        argv_.push_back(nullptr);
    }
    int argc() const { return static_cast<int>(tokens_.size()); }
    const char* const* argv() const { return argv_.data(); }
    const std::vector<std::string>& tokens() const { return tokens_; }

  private:
    std::vector<std::string> tokens_;
    std::vector<const char*> argv_;
};

}  // namespace scmoe::fuzz
