// What a storage limit (--storage) costs at create: creates with and without one,
// interleaved and spaced out (so that neither kind gets the quieter moments of a noisy
// machine), timed from a client: create alone, create -> first exec done, and delete.
// Prints medians, p90 and min-max of each and the ratio of the medians.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/client/client.h"

using namespace berth;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double quantile(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

struct Series {
    std::vector<double> create, first_exec, del;
};

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"berth storage-limit create benchmark"};
    std::string rootfs, socket = client::default_socket_path(), json_out;
    int iterations = 60, warmup = 5, gap_ms = 20;
    uint64_t storage = 1ull << 30;
    app.add_option("--rootfs", rootfs, "busybox rootfs directory")->required();
    app.add_option("--socket", socket);
    app.add_option("-n,--iterations", iterations, "creates of each kind");
    app.add_option("--storage-bytes", storage, "the limit of the bounded creates (default 1 GiB)");
    app.add_option("--gap-ms", gap_ms, "pause between two creates");
    app.add_option("--json", json_out, "write results as JSON here");
    CLI11_PARSE(app, argc, argv);

    client::Client c(socket);
    Series plain, bounded;
    for (int i = 0; i < 2 * (iterations + warmup); ++i) {
        const bool with_limit = i % 2 == 1;
        v1::ClientMessage m;
        m.mutable_create()->set_rootfs(rootfs);
        if (with_limit) m.mutable_create()->mutable_resources()->set_storage_bytes(storage);
        auto t0 = Clock::now();
        std::string id = c.call(m).create().sandbox().id();
        double created = ms_since(t0);
        v1::Exec e;
        e.set_sandbox(id);
        e.add_argv("/bin/true");
        auto exit = c.exec(e, {});
        double first = ms_since(t0);
        if (exit.exit_code() != 0 || exit.signal() != 0) {
            std::cerr << "true failed in " << id << std::endl;
            return 1;
        }
        auto t1 = Clock::now();
        v1::ClientMessage d;
        d.mutable_delete_()->set_sandbox(id);
        c.call(d);
        double deleted = ms_since(t1);
        if (i >= 2 * warmup) {
            Series& s = with_limit ? bounded : plain;
            s.create.push_back(created);
            s.first_exec.push_back(first);
            s.del.push_back(deleted);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
    }

    nlohmann::json out;
    std::printf(
        "berth create with and without --storage %llu MiB, %d of each, interleaved "
        "(cgroup %s)\n",
        static_cast<unsigned long long>(storage >> 20), iterations,
        c.hello().cgroup_driver().c_str());
    std::printf("%-22s %28s %28s %7s\n", "", "no limit p50 (p90) [min-max]",
                "--storage p50 (p90) [min-max]", "ratio");
    auto row = [&](const char* name, const std::vector<double>& a, const std::vector<double>& b) {
        const double pa = quantile(a, 0.5), pb = quantile(b, 0.5);
        std::printf("%-22s %7.3f (%6.3f) [%5.2f-%6.2f] %7.3f (%6.3f) [%5.2f-%6.2f] %7.2f\n", name,
                    pa, quantile(a, 0.9), quantile(a, 0), quantile(a, 1), pb, quantile(b, 0.9),
                    quantile(b, 0), quantile(b, 1), pb / pa);
        out[name] = {
            {"plain_p50_ms", pa}, {"storage_p50_ms", pb}, {"ratio", pb / pa}, {"n", a.size()}};
    };
    row("create_ms", plain.create, bounded.create);
    row("create_to_first_exec", plain.first_exec, bounded.first_exec);
    row("delete_ms", plain.del, bounded.del);
    if (!json_out.empty()) {
        if (FILE* f = std::fopen(json_out.c_str(), "w")) {
            std::fputs(out.dump(2).c_str(), f);
            std::fclose(f);
        }
    }
    return 0;
}
