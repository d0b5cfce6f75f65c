// Undoing a multi-step operation that fails part-way: each step that made something pushes
// how to unmake it; unless the operation commits, the steps are undone newest first when
// the list goes out of scope (the way crun's cleanup_* attributes and Go's defer are used).
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <utility>
#include <vector>

namespace berth {

// One action at scope exit, unless dismissed.
template <typename F>
class ScopeGuard {
  public:
    explicit ScopeGuard(F f) : f_(std::move(f)) {}
    ScopeGuard(const ScopeGuard&) = delete;
    ScopeGuard& operator=(const ScopeGuard&) = delete;
    ~ScopeGuard() {
        if (active_) f_();
    }
    void dismiss() { active_ = false; }

  private:
    F f_;
    bool active_ = true;
};

class UndoList {
  public:
    UndoList() = default;
    UndoList(const UndoList&) = delete;
    UndoList& operator=(const UndoList&) = delete;
    // Undoes what was pushed (newest first) unless committed. An undo step that throws is
    // reported on stderr and the rest still run: what remains is for the next sweep.
    ~UndoList() {
        if (!committed_) run();
    }

    void push(std::function<void()> step) { steps_.push_back(std::move(step)); }
    // The operation succeeded: nothing is undone.
    void commit() {
        committed_ = true;
        steps_.clear();
    }
    size_t size() const { return steps_.size(); }

  private:
    void run() noexcept {
        while (!steps_.empty()) {
            auto step = std::move(steps_.back());
            steps_.pop_back();
            try {
                step();
            } catch (const std::exception& e) {
                std::fprintf(stderr, "berth: undoing a failed step: %s\n", e.what());
            }
        }
    }
    std::vector<std::function<void()>> steps_;
    bool committed_ = false;
};

}  // namespace berth
