// Many trials at once, the way a Harbor run on a workstation uses berth: N trials arrive
// spread over a window, each creates a sandbox, runs a few commands and deletes it. A share
// of them leave a crowd of processes behind (a build or server the agent started), whose
// delete has a whole process tree to kill: the question is what that does to everybody
// else's create (berth-helper serving one request at a time made every create wait behind
// every delete). Reports create and delete latency medians, p90 and max, one connection
// per trial.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "bench/latency.h"
#include "runtime/client/client.h"

using namespace berth;
using bench::Clock;
using bench::ms_since;
using bench::summarize;
using bench::Summary;

namespace {

v1::ExecExit run(client::Client& c, const std::string& id, std::vector<std::string> argv) {
    v1::Exec e;
    e.set_sandbox(id);
    for (auto& a : argv) e.add_argv(a);
    return c.exec(e, {});
}

struct Results {
    std::mutex mu;
    std::vector<double> create, create_light, del_light, del_heavy;
    int failures = 0;
};

// What a heavy trial leaves running: `processes` sleepers, or (0) a fork bomb, which fills
// the sandbox's pids limit and keeps forking into every gap a kill leaves.
std::string heavy_command(int processes) {
    if (processes == 0) return "b(){ b|b& }; b </dev/null >/dev/null 2>&1 & sleep 1";
    return "i=0; while [ $i -lt " + std::to_string(processes) +
           " ]; do sleep 1000 & i=$((i+1)); done";
}

void trial(const std::string& socket, const std::string& rootfs, bool heavy, int processes,
           Clock::duration arrival, Results& out) {
    std::this_thread::sleep_for(arrival);
    try {
        client::Client c(socket);
        auto t0 = Clock::now();
        v1::ClientMessage m;
        m.mutable_create()->set_rootfs(rootfs);
        std::string id = c.call(m).create().sandbox().id();
        double create_ms = ms_since(t0);
        for (int i = 0; i < 3; ++i) run(c, id, {"/bin/true"});
        if (heavy) {
            // Left running when the trial ends, as a build or a server would be.
            run(c, id, {"/bin/sh", "-c", heavy_command(processes)});
        }
        auto t1 = Clock::now();
        v1::ClientMessage d;
        d.mutable_delete_()->set_sandbox(id);
        c.call(d);
        double delete_ms = ms_since(t1);
        std::lock_guard lock(out.mu);
        out.create.push_back(create_ms);
        (heavy ? out.del_heavy : out.del_light).push_back(delete_ms);
        if (!heavy) out.create_light.push_back(create_ms);
    } catch (const std::exception& e) {
        std::lock_guard lock(out.mu);
        ++out.failures;
        std::cerr << "trial failed: " << e.what() << std::endl;
    }
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"berth concurrent trials benchmark"};
    std::string rootfs, socket = client::default_socket_path(), json_out;
    int trials = 64, heavy_every = 4, processes = 300, window_ms = 4000, rounds = 3;
    app.add_option("--rootfs", rootfs, "busybox rootfs directory")->required();
    app.add_option("--socket", socket);
    app.add_option("--trials", trials, "trials at once");
    app.add_option("--heavy-every", heavy_every,
                   "one trial in this many leaves processes behind (0: none)");
    app.add_option("--processes", processes, "processes a heavy trial leaves (0: a fork bomb)");
    app.add_option("--window-ms", window_ms, "the trials' arrivals spread over this");
    app.add_option("--rounds", rounds);
    app.add_option("--json", json_out);
    CLI11_PARSE(app, argc, argv);

    nlohmann::json out;
    std::mt19937 rng(12345);
    // The same arrivals for both modes, so only the heavy trials differ.
    for (bool with_heavy : {false, true}) {
        Results r;
        for (int round = 0; round < rounds; ++round) {
            std::vector<std::thread> threads;
            std::uniform_int_distribution<int> at(0, window_ms);
            for (int i = 0; i < trials; ++i) {
                bool heavy = with_heavy && heavy_every > 0 && i % heavy_every == 0;
                threads.emplace_back(trial, socket, rootfs, heavy, processes,
                                     std::chrono::milliseconds(at(rng)), std::ref(r));
            }
            for (auto& t : threads) t.join();
        }
        const char* mode = with_heavy ? "with_heavy_deletes" : "light_only";
        std::printf("%s: %d trials x %d rounds, arrivals over %d ms%s\n", mode, trials, rounds,
                    window_ms,
                    with_heavy ? (", 1 in " + std::to_string(heavy_every) + " leaving " +
                                  (processes ? std::to_string(processes) + " processes"
                                             : std::string("a fork bomb")))
                                     .c_str()
                               : "");
        auto line = [&](const char* name, const std::vector<double>& v) {
            Summary s = summarize(v);
            std::printf("  %-22s p50 %8.1f ms  p90 %8.1f  max %8.1f  (n %zu)\n", name, s.p50, s.p90,
                        s.max, s.n);
            out[mode][name] = {{"p50_ms", s.p50}, {"p90_ms", s.p90}, {"max_ms", s.max}, {"n", s.n}};
        };
        line("create", r.create);
        line("create_light_trials", r.create_light);
        line("delete_light", r.del_light);
        if (with_heavy) line("delete_heavy", r.del_heavy);
        out[mode]["failures"] = r.failures;
        if (r.failures) std::printf("  %d trials failed\n", r.failures);
    }
    if (!json_out.empty()) {
        FILE* f = std::fopen(json_out.c_str(), "w");
        if (f) {
            std::fputs(out.dump(2).c_str(), f);
            std::fclose(f);
        }
    }
    return 0;
}
