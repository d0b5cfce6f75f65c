// Sandbox core latency, measured from a client the way a trial runner sees it:
//   create -> first exec done, exec round trip of `true`, delete;
// plus the host's own fork+exec+wait of `true` as the physical floor.
// Prints medians with min-max and p90 (these machines are noisy: medians are what count).
#include <spawn.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench/latency.h"
#include "runtime/client/client.h"

using namespace berth;
using bench::Clock;
using bench::ms_since;
using bench::summarize;
using bench::Summary;

namespace {

v1::ExecExit run_true(client::Client& c, const std::string& id) {
    v1::Exec e;
    e.set_sandbox(id);
    e.add_argv("/bin/true");
    return c.exec(e, {});
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"berth sandbox core benchmark"};
    std::string rootfs, socket = client::default_socket_path(), json_out;
    int iterations = 200, warmup = 10;
    app.add_option("--rootfs", rootfs, "busybox rootfs directory")->required();
    app.add_option("--socket", socket);
    app.add_option("-n,--iterations", iterations);
    app.add_option("--json", json_out, "write results as JSON here");
    CLI11_PARSE(app, argc, argv);

    client::Client c(socket);
    std::vector<double> create_to_exec, exec_rt, del, host_spawn;

    for (int i = 0; i < iterations + warmup; ++i) {
        auto t0 = Clock::now();
        v1::ClientMessage m;
        m.mutable_create()->set_rootfs(rootfs);
        std::string id = c.call(m).create().sandbox().id();
        auto exit = run_true(c, id);
        double first = ms_since(t0);
        if (exit.exit_code() != 0 || exit.signal() != 0) {
            std::cerr << "true failed in " << id << std::endl;
            return 1;
        }
        auto t1 = Clock::now();
        auto exit2 = run_true(c, id);
        double rt = ms_since(t1);
        (void)exit2;
        auto t2 = Clock::now();
        v1::ClientMessage d;
        d.mutable_delete_()->set_sandbox(id);
        c.call(d);
        double dt = ms_since(t2);
        if (i >= warmup) {
            create_to_exec.push_back(first);
            exec_rt.push_back(rt);
            del.push_back(dt);
        }
    }
    // Exec round trips in one long-lived sandbox (the hot path of a trial).
    v1::ClientMessage m;
    m.mutable_create()->set_rootfs(rootfs);
    std::string id = c.call(m).create().sandbox().id();
    std::vector<double> exec_hot;
    for (int i = 0; i < iterations * 2 + warmup; ++i) {
        auto t = Clock::now();
        run_true(c, id);
        if (i >= warmup) exec_hot.push_back(ms_since(t));
    }
    v1::ClientMessage d;
    d.mutable_delete_()->set_sandbox(id);
    c.call(d);

    for (int i = 0; i < iterations + warmup; ++i) {
        auto t = Clock::now();
        pid_t pid;
        char* args[] = {const_cast<char*>("/bin/true"), nullptr};
        if (posix_spawn(&pid, "/bin/true", nullptr, nullptr, args, environ) != 0) return 1;
        waitpid(pid, nullptr, 0);
        if (i >= warmup) host_spawn.push_back(ms_since(t));
    }

    nlohmann::json out;
    auto report = [&](const char* name, const std::vector<double>& v, double target) {
        Summary s = summarize(v);
        std::printf("%-28s p50 %7.3f ms  p90 %7.3f  [%7.3f - %7.3f]  target %s\n", name, s.p50,
                    s.p90, s.min, s.max,
                    target > 0 ? (std::to_string(target).substr(0, 4) + " ms").c_str() : "-");
        out[name] = {{"p50_ms", s.p50}, {"p90_ms", s.p90},         {"min_ms", s.min},
                     {"max_ms", s.max}, {"target_p50_ms", target}, {"n", v.size()}};
    };
    std::printf("berth sandbox core, %d iterations (busybox rootfs, cgroup %s)\n", iterations,
                c.hello().cgroup_driver().c_str());
    report("create_to_first_exec", create_to_exec, 4.0);
    report("exec_true_fresh_sandbox", exec_rt, 1.0);
    report("exec_true_round_trip", exec_hot, 1.0);
    report("delete", del, 3.0);
    report("host_spawn_true", host_spawn, 0);
    if (!json_out.empty()) {
        FILE* f = std::fopen(json_out.c_str(), "w");
        if (f) {
            std::fputs(out.dump(2).c_str(), f);
            std::fclose(f);
        }
    }
    return 0;
}
