// Runs as root, in the host's network namespace: berth-helper's DNS child, which serves the
// sandboxes' DNS (net/dns_forwarder.h) and opens berth's nftables table to what their
// allowlisted names resolve to; and DnsControl, the helper's side of its control channel
// (proto/berth/v1/dns.proto).
//
// A process of its own, not a thread of the helper's: a forwarder serving hostile sandboxes
// is best kept where its crash or stall costs only DNS, and libnftables keeps process-wide
// state that the helper's own NftTable would share with a thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "net/dns_forwarder.h"
#include "net/host_network.h"
#include "net/nft_table.h"

namespace berth::v1::dns {
class Request;
}

namespace berth::net {

struct DnsServiceConfig {
    DnsForwarderConfig forwarder;
    TableConfig table;  // berth's table, which the helper has made
    // What a learned address's allow4 entry lasts: the answer's TTL, clamped. The floor is
    // for TTLs of 0 and 1 (CDNs, dnsmasq's local answers): the entry must outlive the
    // connect() that follows the lookup, and as taking an entry out also cuts what it
    // carries (nft_table.h), a program that resolves once and keeps its connection a while
    // should not lose it the next second. The ceiling is for TTLs of days or years: an
    // address a name no longer points to should not stay open for as long.
    std::chrono::seconds min_entry_ttl{5};
    std::chrono::seconds max_entry_ttl{24 * 3600};
};

// Whether an address an allowlisted name resolved to may be opened. Not: 0/8, loopback,
// link-local (169.254/16: a cloud's metadata service), multicast, 240/4, nor the sandboxes'
// own subnet. Whoever runs an allowlisted domain's DNS picks its answers, and an answer is
// not a reason to open what no sandbox should reach (a name "resolving" to
// 169.254.169.254). Private ranges (10/8, 172.16/12, 192.168/16) stay learnable: internal
// names are a reason to allowlist.
bool learnable_address(const std::string& address, const std::string& subnet_cidr);

// What `learned` adds for `address` of an allowlisted name: one AllowRule per port range
// (none: every port, TCP and UDP), lasting `ttl` clamped to [min, max]; nothing for an
// address that is not learnable_address.
std::vector<AllowRule> learned_rules(const std::string& address, std::chrono::seconds ttl,
                                     const std::vector<DnsPortRule>& ports,
                                     const DnsServiceConfig& config);

// The DNS child's main loop: serves the forwarder and answers `control`'s requests, one
// reply each, until the helper closes `control` (returns 0). Returns 1 after writing why to
// stderr when it cannot go on (the listeners cannot be bound, the channel breaks).
int run_dns_service(UniqueFd control, const DnsServiceConfig& config);

// The helper's side: each call sends one request and waits for its reply, at most
// `timeout` (a child that stopped answering must not hang the helper's create or delete).
// Throws berth::Error with the child's error (and its kind) when it refused,
// deadline_exceeded when it did not answer in time, SysError when the channel broke. After
// a timeout the channel is out of step: the caller restarts the child.
class DnsControl {
  public:
    explicit DnsControl(UniqueFd channel,
                        std::chrono::milliseconds timeout = std::chrono::seconds(10))
        : channel_(std::move(channel)), timeout_(timeout) {}

    void set_policy(const std::string& source_ip, const DnsPolicy& policy);
    void forget(const std::string& source_ip);

    int fd() const { return channel_.get(); }

  private:
    void call(v1::dns::Request& request);

    UniqueFd channel_;
    std::chrono::milliseconds timeout_;
    uint64_t next_id_ = 1;
};

// A sandbox's network policy as berth's DNS enforces it: public forwards, allowlist answers
// the entries' names (an entry's port range going with the addresses it opens), the rest is
// refused.
DnsPolicy dns_policy(const Policy& policy);

// berth-helper's DNS child: forks run_dns_service (with `config`) and keeps the policies it
// was told, so that a child that died or stopped answering is started again and told them
// all before the call that found it so returns. A policy the child refuses (a bad pattern)
// throws Error(invalid_argument); a child that cannot be started again throws.
std::unique_ptr<SandboxDns> start_dns_child(const DnsServiceConfig& config);

}  // namespace berth::net
