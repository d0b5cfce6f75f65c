// berth's networking, measured from the C++ client (bench/run-network sets up the daemon,
// the test host and the rootfs):
//   - create (and delete) of a rootfs sandbox with `none` vs `public`, and bubblewrap's whole
//     `bwrap --unshare-all ... true` beside them, in the same rounds, spaced --gap-ms apart
//     (as trials arrive, not back to back), the order rotating from round to round;
//   - SetNetwork round trips: public->none, none->public, and the first none->public of a
//     sandbox created `none` (which makes its veth then);
//   - TCP to the test host from a `public` sandbox vs from the host's own end of a plain veth
//     to the same server: connect(2) latency, one-byte echo round trips, and bulk up and down.
//     Both sides run the same static probe (bench/netprobe), which times its own system
//     calls: an exec's cost is in no sample. The two sides alternate in blocks.
// Prints a table (p50, p90, min-max) and writes JSON with --json.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "bench/latency.h"
#include "runtime/client/client.h"

using namespace berth;
using bench::Clock;
using bench::ms_since;
using bench::summarize;
using bench::Summary;

namespace {

struct Config {
    std::string socket = client::default_socket_path(), rootfs, netprobe, server, bwrap, cli,
                json_out;
    int port = 9100, runs = 50, warmup = 3, gap_ms = 100, connects = 1000, rr = 2000,
        bulk_mib = 200, bulk_runs = 5, blocks = 5;
    bool quick = false;
    std::vector<std::string> sections{"create", "switch", "tcp"};
    bool has(const char* s) const {
        return std::find(sections.begin(), sections.end(), s) != sections.end();
    }
};

void gap(const Config& cfg) {
    std::this_thread::sleep_for(std::chrono::milliseconds(cfg.gap_ms));
}

v1::SandboxInfo create(client::Client& c, const Config& cfg, v1::NetworkMode mode) {
    v1::ClientMessage m;
    m.mutable_create()->set_rootfs(cfg.rootfs);
    m.mutable_create()->set_network(mode);
    return c.call(m).create().sandbox();
}

void remove(client::Client& c, const std::string& id) {
    v1::ClientMessage d;
    d.mutable_delete_()->set_sandbox(id);
    c.call(d);
}

void set_network(client::Client& c, const std::string& id, v1::NetworkMode mode) {
    v1::ClientMessage m;
    m.mutable_set_network()->set_sandbox(id);
    m.mutable_set_network()->set_network(mode);
    c.call(m);
}

std::vector<double> parse(const std::string& out) {
    std::vector<double> v;
    std::istringstream in(out);
    double x;
    while (in >> x) v.push_back(x);
    return v;
}

// Runs argv in the sandbox; returns its stdout, or throws (with its stderr) unless it exits 0.
std::string in_sandbox(client::Client& c, const std::string& id,
                       const std::vector<std::string>& argv, bool* ok = nullptr) {
    v1::Exec e;
    e.set_sandbox(id);
    for (const auto& a : argv) e.add_argv(a);
    std::string out, err;
    client::Client::ExecCallbacks cb;
    cb.output = [&](v1::ExecOutput::Stream s, std::string_view data) {
        (s == v1::ExecOutput::STDOUT ? out : err).append(data);
    };
    auto exit = c.exec(e, cb);
    bool good = exit.exit_code() == 0 && exit.signal() == 0;
    if (ok) {
        *ok = good;
        return out;
    }
    if (!good) throw std::runtime_error("in the sandbox: " + argv[1] + ": " + err);
    return out;
}

// Runs argv on the host (no shell), returns its stdout; throws unless it exits 0.
std::string on_host(const std::vector<std::string>& argv) {
    int p[2];
    if (pipe(p) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_addclose(&fa, p[0]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid;
    int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    if (rc != 0) {
        close(p[0]);
        throw std::runtime_error("spawn " + argv[0]);
    }
    std::string out;
    char buf[4096];
    ssize_t r;
    while ((r = read(p[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(r));
    close(p[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        throw std::runtime_error("on the host: " + argv[0] + " " + argv[1] + " failed");
    return out;
}

// bwrap's whole run of `true` (what it has instead of a create): wall milliseconds.
double bwrap_true(const Config& cfg) {
    std::vector<std::string> argv{
        cfg.bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", cfg.rootfs, "/", "/bin/true"};
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    auto t = Clock::now();
    pid_t pid;
    if (posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0)
        throw std::runtime_error("spawn bwrap");
    int status = 0;
    waitpid(pid, &status, 0);
    double ms = ms_since(t);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("bwrap failed");
    return ms;
}

std::string inspect(client::Client& c, const std::string& id) {
    v1::ClientMessage m;
    m.mutable_inspect()->set_sandbox(id);
    const auto& sb = c.call(m).inspect().sandbox();
    return "mode " + v1::NetworkMode_Name(sb.network()) + ", address " + sb.address();
}

// A public sandbox must reach the test host as soon as its reply came; if it does not, says
// whether it does a second later (a rule applied late) and what the daemon thinks it is.
void must_reach(client::Client& c, const Config& cfg, const std::string& id,
                const std::string& when) {
    const std::vector<std::string> argv{"/bin/netprobe", "connect", cfg.server,
                                        std::to_string(cfg.port), "1"};
    bool ok = true;
    in_sandbox(c, id, argv, &ok);
    if (ok) return;
    std::string state = inspect(c, id);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    in_sandbox(c, id, argv, &ok);
    throw std::runtime_error("a public sandbox (" + state + ") did not reach the test host " +
                             when + (ok ? "; a second later it did" : "; nor a second later"));
}

struct Report {
    nlohmann::json json;
    // For a throughput (higher is better) the p90 column is the slow tail too: the rate
    // 90 % of the runs reached (the 10th percentile).
    void row(const std::string& name, const std::vector<double>& v, const char* unit,
             const std::string& note = {}, bool higher_is_better = false) {
        Summary s = summarize(v);
        if (higher_is_better) {
            std::vector<double> neg;
            for (double x : v) neg.push_back(-x);
            s.p90 = -summarize(neg).p90;
        }
        std::printf("  %-34s %9.3f %9.3f   [%9.3f - %9.3f] %-4s n=%-5zu %s\n", name.c_str(), s.p50,
                    s.p90, s.min, s.max, unit, s.n, note.c_str());
        json[name] = {{"p50", s.p50}, {"p90", s.p90}, {"min", s.min},
                      {"max", s.max}, {"n", s.n},     {"unit", unit}};
    }
    void ratio(const std::string& name, double r, const std::string& what) {
        std::printf("  %-34s %9.2f   %s\n", name.c_str(), r, what.c_str());
        json["ratios"][name] = r;
    }
    static void header(const char* title) {
        std::printf("\n%s\n  %-34s %9s %9s   %-25s\n", title, "", "p50", "p90", "[min - max]");
    }
};

double p50(const std::vector<double>& v) {
    return summarize(v).p50;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"berth network benchmark"};
    Config cfg;
    app.add_option("--rootfs", cfg.rootfs, "busybox rootfs with /bin/netprobe")->required();
    app.add_option("--socket", cfg.socket);
    app.add_option("--netprobe", cfg.netprobe, "the host's netprobe")->required();
    app.add_option("--server", cfg.server, "the test host's address (netprobe serve)")->required();
    app.add_option("--port", cfg.port);
    app.add_option("--bwrap", cfg.bwrap, "bwrap to compare creates with (none: skipped)");
    app.add_option("--cli", cfg.cli,
                   "the berth CLI: `berth create` timed beside the others (none: skipped)");
    app.add_option("-n,--runs", cfg.runs, "create rounds and switch round trips");
    app.add_option("--gap-ms", cfg.gap_ms, "pause between creates and between switches");
    app.add_option("--connects", cfg.connects, "connects per side");
    app.add_option("--rr", cfg.rr, "one-byte round trips per side");
    app.add_option("--bulk-mib", cfg.bulk_mib, "MiB per bulk transfer");
    app.add_option("--bulk-runs", cfg.bulk_runs, "bulk transfers per side and direction");
    app.add_option("--sections", cfg.sections, "of create, switch, tcp (all by default)")
        ->delimiter(',');
    app.add_flag("--quick", cfg.quick, "few runs: shows it works, the figures mean little");
    app.add_option("--json", cfg.json_out, "write results as JSON here");
    CLI11_PARSE(app, argc, argv);
    if (cfg.quick) {
        cfg.runs = 5;
        cfg.warmup = 1;
        cfg.connects = 100;
        cfg.rr = 200;
        cfg.bulk_mib = 32;
        cfg.bulk_runs = 2;
        cfg.blocks = 2;
    }
    const std::string port = std::to_string(cfg.port);

    try {
        client::Client c(cfg.socket);
        Report rep;
        rep.json["config"] = {{"runs", cfg.runs},
                              {"gap_ms", cfg.gap_ms},
                              {"connects", cfg.connects},
                              {"rr", cfg.rr},
                              {"bulk_mib", cfg.bulk_mib},
                              {"bulk_runs", cfg.bulk_runs},
                              {"quick", cfg.quick},
                              {"bwrap", !cfg.bwrap.empty()},
                              {"cgroup_driver", c.hello().cgroup_driver()}};
        std::printf("berth network benchmark: %d create rounds %d ms apart, cgroup driver %s\n",
                    cfg.runs, cfg.gap_ms, c.hello().cgroup_driver().c_str());

        // 1. Creates: none, public (and bwrap) in the same rounds, rotating their order.
        // Kinds: 0 none, 1 public (C++ client), 2 bwrap, 3 `berth create` (CLI, none).
        std::vector<double> c_none, c_pub, d_none, d_pub, bw, c_cli;
        std::vector<int> kinds{0, 1};
        if (!cfg.bwrap.empty()) kinds.push_back(2);
        if (!cfg.cli.empty()) kinds.push_back(3);
        for (int round = 0; cfg.has("create") && round < cfg.warmup + cfg.runs; ++round) {
            bool keep = round >= cfg.warmup;
            for (size_t k = 0; k < kinds.size(); ++k) {
                int kind = kinds[(k + static_cast<size_t>(round)) % kinds.size()];
                if (kind == 2) {
                    double ms = bwrap_true(cfg);
                    if (keep) bw.push_back(ms);
                } else if (kind == 3) {
                    // A process per create, as a shell script or a trial runner without a
                    // client library does it: the CLI's start-up is in the figure.
                    auto t = Clock::now();
                    std::string id =
                        on_host({cfg.cli, "-H", cfg.socket, "create", "--rootfs", cfg.rootfs});
                    double ms = ms_since(t);
                    while (!id.empty() && id.back() == '\n') id.pop_back();
                    if (id.size() != 32) throw std::runtime_error("berth create said: " + id);
                    gap(cfg);
                    remove(c, id);
                    if (keep) c_cli.push_back(ms);
                } else {
                    auto mode = kind == 0 ? v1::NETWORK_NONE : v1::NETWORK_PUBLIC;
                    auto t = Clock::now();
                    auto info = create(c, cfg, mode);
                    double ms = ms_since(t);
                    if (mode == v1::NETWORK_PUBLIC && info.address().empty())
                        throw std::runtime_error("a public sandbox without an address");
                    gap(cfg);  // (the delete of a sandbox that has run a while, not at once)
                    auto t2 = Clock::now();
                    remove(c, info.id());
                    double dms = ms_since(t2);
                    if (keep) {
                        (kind == 0 ? c_none : c_pub).push_back(ms);
                        (kind == 0 ? d_none : d_pub).push_back(dms);
                    }
                }
                gap(cfg);
            }
        }
        if (cfg.has("create")) {
            Report::header("create / delete (ms)");
            rep.row("create_none", c_none, "ms");
            rep.row("create_public", c_pub, "ms");
            rep.row("delete_none", d_none, "ms");
            rep.row("delete_public", d_pub, "ms");
            if (!c_cli.empty())
                rep.row("create_cli_none", c_cli, "ms", "(`berth create`: a CLI process)");
            if (!bw.empty())
                rep.row("bwrap_true", bw, "ms", "(its whole run: no overlay, no cgroup)");
            rep.ratio("create public/none p50", p50(c_pub) / p50(c_none), "same rounds");
            rep.ratio("delete public/none p50", p50(d_pub) / p50(d_none), "same rounds");
            if (!bw.empty()) {
                rep.ratio("create none/bwrap p50", p50(c_none) / p50(bw), "same rounds");
                rep.ratio("create public/bwrap p50", p50(c_pub) / p50(bw), "same rounds");
                if (!c_cli.empty())
                    rep.ratio("create CLI none/bwrap p50", p50(c_cli) / p50(bw),
                              "same rounds (target <= 0.8)");
            }
        }

        // 2. Mode switches.
        std::vector<double> to_none, to_pub, first_pub;
        if (cfg.has("switch")) {
            auto info = create(c, cfg, v1::NETWORK_PUBLIC);
            const std::string& id = info.id();
            for (int i = 0; i < cfg.warmup + cfg.runs; ++i) {
                gap(cfg);
                auto t = Clock::now();
                set_network(c, id, v1::NETWORK_NONE);
                double a = ms_since(t);
                gap(cfg);
                t = Clock::now();
                set_network(c, id, v1::NETWORK_PUBLIC);
                double b = ms_since(t);
                if (i >= cfg.warmup) {
                    to_none.push_back(a);
                    to_pub.push_back(b);
                }
            }
            // In force when the reply comes: public reaches the server, none does not.
            must_reach(c, cfg, id,
                       "after " + std::to_string(cfg.warmup + cfg.runs) +
                           " public->none->public switches");
            set_network(c, id, v1::NETWORK_NONE);
            bool ok = true;
            in_sandbox(c, id, {"/bin/netprobe", "connect", cfg.server, port, "1"}, &ok);
            if (ok) throw std::runtime_error("a `none` sandbox reached the test host");
            remove(c, id);
        }
        for (int i = 0; cfg.has("switch") && i < cfg.warmup + cfg.runs; ++i) {
            auto info = create(c, cfg, v1::NETWORK_NONE);
            gap(cfg);
            auto t = Clock::now();
            set_network(c, info.id(), v1::NETWORK_PUBLIC);
            double ms = ms_since(t);
            if (i == 0) must_reach(c, cfg, info.id(), "after its first none->public");
            remove(c, info.id());
            if (i >= cfg.warmup) first_pub.push_back(ms);
            gap(cfg);
        }
        if (cfg.has("switch")) {
            Report::header("SetNetwork round trip through the client (ms)");
            rep.row("switch_public_to_none", to_none, "ms");
            rep.row("switch_none_to_public", to_pub, "ms");
            rep.row("switch_first_none_to_public", first_pub, "ms",
                    "(created none: its veth made)");
        }

        // 3. TCP: a public sandbox vs the host's end of the plain veth, alternating blocks.
        if (cfg.has("tcp")) {
            auto info = create(c, cfg, v1::NETWORK_PUBLIC);
            const std::string id = info.id();
            auto probe_sb = [&](std::vector<std::string> args) {
                args.insert(args.begin(), "/bin/netprobe");
                return parse(in_sandbox(c, id, args));
            };
            auto probe_host = [&](std::vector<std::string> args) {
                args.insert(args.begin(), cfg.netprobe);
                return parse(on_host(args));
            };
            probe_sb({"connect", cfg.server, port, "20"});  // warm: ARP, conntrack, caches
            probe_host({"connect", cfg.server, port, "20"});
            std::vector<double> conn_sb, conn_host, rr_sb, rr_host;
            auto append = [](std::vector<double>& to, const std::vector<double>& v) {
                to.insert(to.end(), v.begin(), v.end());
            };
            for (int b = 0; b < cfg.blocks; ++b) {
                std::string nc = std::to_string(cfg.connects / cfg.blocks);
                std::string nr = std::to_string(cfg.rr / cfg.blocks);
                bool sb_first = b % 2 == 0;
                for (int side = 0; side < 2; ++side) {
                    if ((side == 0) == sb_first) {
                        append(conn_sb, probe_sb({"connect", cfg.server, port, nc}));
                        append(rr_sb, probe_sb({"rr", cfg.server, port, nr}));
                    } else {
                        append(conn_host, probe_host({"connect", cfg.server, port, nc}));
                        append(rr_host, probe_host({"rr", cfg.server, port, nr}));
                    }
                }
            }
            std::vector<double> up_sb, up_host, down_sb, down_host;  // MiB/s
            const std::string mib = std::to_string(cfg.bulk_mib);
            auto rate = [&](const std::vector<double>& secs) {
                if (secs.size() != 1 || secs[0] <= 0) throw std::runtime_error("bulk: no time");
                return cfg.bulk_mib / secs[0];
            };
            for (int r = 0; r < cfg.bulk_runs; ++r) {
                bool sb_first = r % 2 == 0;
                for (int side = 0; side < 2; ++side) {
                    if ((side == 0) == sb_first) {
                        up_sb.push_back(rate(probe_sb({"send", cfg.server, port, mib})));
                        down_sb.push_back(rate(probe_sb({"recv", cfg.server, port, mib})));
                    } else {
                        up_host.push_back(rate(probe_host({"send", cfg.server, port, mib})));
                        down_host.push_back(rate(probe_host({"recv", cfg.server, port, mib})));
                    }
                }
            }
            remove(c, id);
            Report::header(
                "TCP to the test host: public sandbox vs the host's end of a plain veth");
            rep.row("connect_sandbox", conn_sb, "us");
            rep.row("connect_plain_veth", conn_host, "us");
            rep.row("echo_rtt_sandbox", rr_sb, "us", "(1 byte each way, one connection)");
            rep.row("echo_rtt_plain_veth", rr_host, "us");
            rep.row("upload_sandbox", up_sb, "MiB/s", "(" + mib + " MiB each; p90: 90 % reached)",
                    true);
            rep.row("upload_plain_veth", up_host, "MiB/s", {}, true);
            rep.row("download_sandbox", down_sb, "MiB/s", {}, true);
            rep.row("download_plain_veth", down_host, "MiB/s", {}, true);
            rep.ratio("connect sandbox/veth p50", p50(conn_sb) / p50(conn_host),
                      "latency, same run");
            rep.ratio("echo rtt sandbox/veth p50", p50(rr_sb) / p50(rr_host), "latency, same run");
            rep.ratio("upload sandbox/veth p50", p50(up_sb) / p50(up_host), "throughput, same run");
            rep.ratio("download sandbox/veth p50", p50(down_sb) / p50(down_host),
                      "throughput, same run");
        }

        if (!cfg.json_out.empty()) {
            FILE* f = std::fopen(cfg.json_out.c_str(), "w");
            if (!f) throw std::runtime_error("cannot write " + cfg.json_out);
            std::fputs(rep.json.dump(2).c_str(), f);
            std::fputc('\n', f);
            std::fclose(f);
        }
    } catch (const std::exception& e) {
        std::cerr << "network_bench: " << e.what() << std::endl;
        return 1;
    }
    return 0;
}
