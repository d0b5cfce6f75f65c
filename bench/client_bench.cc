// berth measured through its C++ client library, for bench/run-compare: the same workloads the
// peers run from their CLIs, without a CLI process per step. Prints one JSON object:
//   {"samples_ms": [...], "failures": N, "errors": ["..."]}
// Workloads:
//   cold   create a sandbox, run `true`, delete it                   (one sample each)
//   create create a sandbox (timed), then delete it (not timed)      (one sample each)
//   exec   one sandbox; run COMMAND (after --) and check its stdout   (one sample each)
//   trial  create, 20 x `true`, copy FILE in, copy /etc out, delete  (one sample each;
//          with --parallel K, K trials at once on K connections, the batch's wall time)
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/client/client.h"
#include "transfer/archive.h"
#include "transfer/root.h"

using namespace berth;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Config {
    std::string socket, rootfs, image, copy_file, out_dir, expect_stdout;
    std::vector<std::string> command{"true"};
    int execs_per_trial = 20;
};

std::string create(client::Client& c, const Config& cfg) {
    v1::ClientMessage m;
    if (cfg.image.empty())
        m.mutable_create()->set_rootfs(cfg.rootfs);
    else
        m.mutable_create()->set_image(cfg.image);
    return c.call(m).create().sandbox().id();
}

void remove(client::Client& c, const std::string& id) {
    v1::ClientMessage d;
    d.mutable_delete_()->set_sandbox(id);
    c.call(d);
}

// Runs argv and throws unless it exits 0 (and printed `expect`, when given).
void run(client::Client& c, const std::string& id, const std::vector<std::string>& argv,
         const std::string& expect = {}) {
    v1::Exec e;
    e.set_sandbox(id);
    for (const auto& a : argv) e.add_argv(a);
    std::string out;
    client::Client::ExecCallbacks cb;
    cb.output = [&](v1::ExecOutput::Stream s, std::string_view data) {
        if (s == v1::ExecOutput::STDOUT) out.append(data);
    };
    v1::ExecExit exit = c.exec(e, cb);
    if (exit.exit_code() != 0 || exit.signal() != 0) {
        throw std::runtime_error(argv[0] + " exited " + std::to_string(exit.exit_code()) +
                                 " signal " + std::to_string(exit.signal()));
    }
    if (!expect.empty() && out != expect) {
        throw std::runtime_error(argv[0] + " printed '" + out + "', expected '" + expect + "'");
    }
}

// Where a trial's time went: connect, create, the execs, copy in, copy out, delete.
struct Phases {
    std::vector<double> ms;
    Clock::time_point last = Clock::now();
    void mark() {
        ms.push_back(ms_since(last));
        last = Clock::now();
    }
};
const char* const kPhaseNames[] = {"connect", "create", "execs", "copy_in", "copy_out", "delete"};

// One trial, as a Harbor-style runner does it. `out` is a fresh host directory.
void trial(const Config& cfg, const std::string& out, Phases& phases) {
    client::Client c(cfg.socket);
    phases.mark();
    const std::string id = create(c, cfg);
    phases.mark();
    for (int i = 0; i < cfg.execs_per_trial; ++i) run(c, id, {"true"});
    phases.mark();
    const transfer::Root host = transfer::Root::open("/");
    v1::CopyIn in;
    in.set_sandbox(id);
    in.set_path("/root");
    transfer::WriteOptions wopt;
    c.copy_in(in, [&](int fd) { transfer::write_archive(host, cfg.copy_file, fd, wopt); });
    phases.mark();
    v1::CopyOut o;
    o.set_sandbox(id);
    o.set_path("/etc");
    transfer::ExtractOptions xopt;
    c.copy_out(o, [&](int fd) { transfer::extract_archive(fd, host, out, xopt); });
    phases.mark();
    remove(c, id);
    phases.mark();
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"berth C++ client workloads for bench/run-compare"};
    Config cfg;
    std::string workload;
    int iterations = 20, warmup = 2, parallel = 1;
    app.add_option("--socket", cfg.socket)->required();
    auto* rootfs = app.add_option("--rootfs", cfg.rootfs, "sandboxes from this directory");
    auto* image = app.add_option("--image", cfg.image, "sandboxes from this image");
    rootfs->excludes(image);
    app.add_option("--workload", workload)
        ->required()
        ->check(CLI::IsMember({"cold", "create", "exec", "trial"}));
    app.add_option("-n,--iterations", iterations);
    app.add_option("--warmup", warmup);
    app.add_option("--parallel", parallel, "trials at once (trial)");
    app.add_option("--copy-file", cfg.copy_file, "file copied in by a trial");
    app.add_option("--out-dir", cfg.out_dir, "where trials copy /etc out to (made empty)");
    app.add_option("--expect", cfg.expect_stdout, "the command's expected stdout (exec)");
    app.add_option("command", cfg.command, "command for exec (after --)");
    CLI11_PARSE(app, argc, argv);
    if (cfg.rootfs.empty() && cfg.image.empty()) {
        std::cerr << "client_bench: give --rootfs DIR or --image REF" << std::endl;
        return 2;
    }

    nlohmann::json result{{"samples_ms", nlohmann::json::array()},
                          {"failures", 0},
                          {"errors", nlohmann::json::array()},
                          {"phases_ms", nlohmann::json::object()}};
    std::mutex mu;
    auto fail = [&](const std::string& what) {
        std::lock_guard lock(mu);
        result["failures"] = result["failures"].get<int>() + 1;
        if (result["errors"].size() < 10) result["errors"].push_back(what);
    };
    try {
        client::Client c(cfg.socket);
        std::string hot;
        if (workload == "exec") hot = create(c, cfg);
        for (int i = 0; i < warmup + iterations; ++i) {
            double ms = 0;
            if (workload == "cold") {
                auto t = Clock::now();
                std::string id = create(c, cfg);
                run(c, id, {"true"});
                remove(c, id);
                ms = ms_since(t);
            } else if (workload == "create") {
                auto t = Clock::now();
                std::string id = create(c, cfg);
                ms = ms_since(t);
                remove(c, id);
            } else if (workload == "exec") {
                auto t = Clock::now();
                run(c, hot, cfg.command, cfg.expect_stdout);
                ms = ms_since(t);
            } else {
                std::vector<std::string> outs;
                for (int k = 0; k < parallel; ++k) {
                    outs.push_back(cfg.out_dir + "/" + std::to_string(i) + "." + std::to_string(k));
                }
                std::vector<Phases> phases(parallel);
                auto t = Clock::now();
                std::vector<std::jthread> threads;
                for (int k = 0; k < parallel; ++k) {
                    threads.emplace_back([&, k] {
                        try {
                            phases[k].last = Clock::now();
                            trial(cfg, outs[k], phases[k]);
                        } catch (const std::exception& e) {
                            fail(e.what());
                        }
                    });
                }
                threads.clear();  // joins
                ms = ms_since(t);
                if (i >= warmup && parallel == 1 && phases[0].ms.size() == std::size(kPhaseNames)) {
                    for (size_t p = 0; p < phases[0].ms.size(); ++p) {
                        result["phases_ms"][kPhaseNames[p]].push_back(phases[0].ms[p]);
                    }
                }
                for (const auto& o : outs) {
                    if (!std::filesystem::exists(o + "/etc/passwd")) fail(o + ": /etc not copied");
                    std::filesystem::remove_all(o);
                }
            }
            if (i >= warmup) result["samples_ms"].push_back(ms);
        }
        if (!hot.empty()) remove(c, hot);
    } catch (const std::exception& e) {
        fail(e.what());
        std::cout << result.dump() << std::endl;
        return 1;
    }
    std::cout << result.dump() << std::endl;
    return 0;
}
