#include "base/undo.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace berth {
namespace {

TEST(UndoList, UndoesNewestFirstWhenNotCommitted) {
    std::string order;
    {
        UndoList undo;
        undo.push([&] { order += "a"; });
        undo.push([&] { order += "b"; });
        undo.push([&] { order += "c"; });
    }
    EXPECT_EQ(order, "cba");
}

TEST(UndoList, CommitKeepsEverything) {
    std::string order;
    {
        UndoList undo;
        undo.push([&] { order += "a"; });
        undo.commit();
    }
    EXPECT_EQ(order, "");
}

TEST(UndoList, AFailingStepDoesNotStopTheOthers) {
    std::string order;
    {
        UndoList undo;
        undo.push([&] { order += "a"; });
        undo.push([] { throw std::runtime_error("expected in a test"); });
        undo.push([&] { order += "c"; });
    }
    EXPECT_EQ(order, "ca");
}

TEST(UndoList, RunsWhileAnExceptionPropagates) {
    std::string order;
    try {
        UndoList undo;
        undo.push([&] { order += "undone"; });
        throw std::runtime_error("a step failed");
    } catch (const std::runtime_error&) {
    }
    EXPECT_EQ(order, "undone");
}

TEST(ScopeGuard, RunsUnlessDismissed) {
    int runs = 0;
    {
        ScopeGuard guard([&] { ++runs; });
    }
    {
        ScopeGuard guard([&] { ++runs; });
        guard.dismiss();
    }
    EXPECT_EQ(runs, 1);
}

}  // namespace
}  // namespace berth
