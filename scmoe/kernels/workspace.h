// Workspace carving: query, then allocate once.
//
// A component lays out its buffers with a WorkspaceCarver twice: first over a null base to learn
// the size (workspace_bytes), then over the real allocation. Both passes must take the same
// sequence of buffers, so one function does both.
#pragma once

#include <cstddef>
#include <cstdint>

namespace scmoe {

class WorkspaceCarver {
public:
    static constexpr std::size_t kAlignment = 256;

    // base == nullptr: sizing pass, returned pointers are not to be dereferenced.
    explicit WorkspaceCarver(void* base) : base_(static_cast<std::byte*>(base)) {}

    template <class T>
    T* take(std::int64_t count) {
        return static_cast<T*>(take_bytes(static_cast<std::size_t>(count) * sizeof(T)));
    }
    void* take_bytes(std::size_t bytes) {
        std::size_t offset = used_;
        used_ += (bytes + kAlignment - 1) / kAlignment * kAlignment;
        return base_ ? base_ + offset : nullptr;
    }
    std::size_t bytes_used() const { return used_; }

private:
    std::byte* base_;
    std::size_t used_ = 0;
};

}  // namespace scmoe
