// The budget berthd derives from the host: the host keeps room for itself, 64 default
// sandboxes fit within it, and the options parse strictly.
#include "runtime/daemon/host_budget.h"

#include <gtest/gtest.h>

using namespace berth::daemon;

namespace {
constexpr uint64_t kGiB = uint64_t{1} << 30, kMiB = uint64_t{1} << 20;
}

TEST(HostBudget, ThisMachinesShape) {
    // 24 GiB, pid_max 32768, threads-max 192730 (the CI machine).
    HostBudget b = derive_budget({24 * kGiB, 32768, 192730});
    EXPECT_EQ(b.total_memory, (24 * kGiB - 24 * kGiB / 5) / kMiB * kMiB);
    EXPECT_EQ(b.total_memory % kMiB, 0u);
    EXPECT_EQ(b.total_pids, 16384u);  // half of pid_max: 8 sandboxes of 4096 took it all
    EXPECT_EQ(b.default_pids, 1024u);
    EXPECT_EQ(b.default_memory, b.total_memory / 8 / kMiB * kMiB);
}

TEST(HostBudget, SmallHostsKeepRoom) {
    HostBudget small = derive_budget({kGiB, 32768, 7000});
    EXPECT_EQ(small.total_memory, kGiB / 2);
    EXPECT_EQ(small.total_pids, 3500u);  // threads-max is the smaller count
    EXPECT_EQ(small.default_memory, 512 * kMiB);
    EXPECT_EQ(small.default_pids, 256u);
    HostBudget four = derive_budget({4 * kGiB, 4194304, 31000});
    EXPECT_EQ(four.total_memory, 3 * kGiB);  // 1 GiB is more than 20% of 4 GiB
    EXPECT_EQ(four.default_pids, 968u);
}

TEST(HostBudget, BigHostsCapTheDefaults) {
    HostBudget b = derive_budget({512 * kGiB, 4194304, 4000000});
    EXPECT_EQ(b.total_pids, 2000000u);
    EXPECT_EQ(b.default_pids, 4096u);
    EXPECT_LT(b.total_memory, 512 * kGiB);
}

TEST(HostBudget, OptionsParseStrictly) {
    uint64_t v = 7;
    std::string error;
    EXPECT_TRUE(parse_budget_option("auto", true, 42, &v, &error));
    EXPECT_EQ(v, 42u);
    EXPECT_TRUE(parse_budget_option("none", true, 42, &v, &error));
    EXPECT_EQ(v, 0u);
    EXPECT_TRUE(parse_budget_option("3g", true, 42, &v, &error));
    EXPECT_EQ(v, 3 * kGiB);
    EXPECT_TRUE(parse_budget_option("2048", false, 42, &v, &error));
    EXPECT_EQ(v, 2048u);
    EXPECT_FALSE(parse_budget_option("2k", false, 42, &v, &error));
    EXPECT_FALSE(parse_budget_option("", false, 42, &v, &error));
    EXPECT_FALSE(parse_budget_option("-1", false, 42, &v, &error));
    EXPECT_FALSE(parse_budget_option("lots", true, 42, &v, &error));
    EXPECT_FALSE(error.empty());
}
