// berth's own nftables table: what sandboxes on berth's bridge may reach, enforced on the
// host side, where a sandbox's root cannot change it.
//
// One `table inet NAME` holds everything but the anti-spoofing filter, which sits in
// `table bridge NAME` (only the bridge family sees which port a frame came in by); every
// command this class sends names those tables (but exists()'s, which lists the names of the
// inet tables), so no other table of the host's ruleset is flushed or rewritten. A sandbox is known
// by its IPv4 address on the bridge, and its state lives in four sets (public4: may reach anything;
// allow4: source . destination . protocol . port; listed4: allowlisted sandboxes, whose established
// connections stay; hostports4: host loopback ports), so granting and revoking
// is an element change, never a rule change; the kernel checks membership on every packet,
// so revoking also cuts connections already established.
//
// Everything a caller passes is validated before any command text is built: nft's input is a
// command language, and an unchecked string would be command injection. Addresses go through
// inet_pton and are printed back canonically, and a sandbox's must lie in the subnet; names
// are [A-Za-z0-9_-]. What fails a check throws berth::Error (invalid_argument) before any
// command runs; failures of libnftables throw berth::Error with libnftables's own error text.
//
// Acts on the network namespace it was constructed in (libnftables opens its netlink socket
// then), and needs CAP_NET_ADMIN there. Not thread-safe, and libnftables keeps process-wide
// state besides its context: use NftTable objects from one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct nft_ctx;

namespace berth::net {

struct TableConfig {
    std::string table;        // the table's name: a letter, then [A-Za-z0-9_-], 15 at most
    std::string bridge;       // the sandboxes' bridge: [A-Za-z0-9_-]{1,15}
    std::string subnet_cidr;  // the sandboxes' IPv4 subnet, e.g. 10.88.0.0/16
    std::string gateway;      // the bridge's own address (in the subnet): berth's DNS
    // Where a sandbox reaches the host's loopback ports it was given (the caller sets
    // route_localnet on the bridge); empty: the gateway.
    std::string host_address;
};

// One destination a sandbox may reach. "Any port" is the range 0-65535.
// (Every member has an initializer, so that callers may name only the ones they set.)
struct AllowRule {
    std::string cidr{};   // an IPv4 address or network (host bits clear), e.g. 1.2.3.0/24
    std::string proto{};  // "tcp", "udp", or "" for both
    uint16_t port_from = 0;
    uint16_t port_to = 65535;
    // Set for entries that should lapse on their own (addresses learned from DNS). Adding an
    // entry that is there again with a timeout restarts its clock where the kernel updates
    // timeouts (6.18 does), and gives a permanent entry that timeout.
    std::optional<std::chrono::seconds> timeout{};
};

// A host address and TCP port whose connections go to the sandbox's `port`.
struct PublishedPort {
    std::string host_ip{};
    uint16_t host_port = 0;
    uint16_t port = 0;
};

class NftTable {
  public:
    // Validates `config` (throws berth::Error, invalid_argument) and opens a libnftables
    // context; touches no ruleset.
    explicit NftTable(TableConfig config);

    // (Re)creates the table with its sets and chains, empty, in one transaction: a table
    // left by an earlier run is replaced, and no packet ever sees half a table.
    void create();
    // Removes the table; absent is fine.
    void destroy();
    bool exists();

    // Public mode: the sandbox may reach any address but the host's own (and other
    // sandboxes', which the bridge decides).
    void set_public(const std::string& sandbox_ip, bool on);
    // Allowlist mode: the sandbox keeps its established connections when an allowed entry
    // lapses or goes (see listed4 in the table); what it may open is in allow4.
    void set_listed(const std::string& sandbox_ip, bool on);
    // Adds `rules` for the sandbox in one transaction (all or none). The kernel refuses an
    // entry that starts or ends inside one this sandbox already has ("File exists").
    void add_allowed(const std::string& sandbox_ip, const std::vector<AllowRule>& rules);
    // A sandbox's whole policy in one transaction: public4 and listed4 membership, and its
    // allow4 entries replaced by `rules`.
    void apply(const std::string& sandbox_ip, bool is_public, bool is_listed,
               const std::vector<AllowRule>& rules);
    // Removes every allow4 entry of the sandbox.
    void clear_allowed(const std::string& sandbox_ip);
    // The host loopback TCP ports the sandbox may reach at host_address: replaces its set.
    void set_host_ports(const std::string& sandbox_ip, const std::vector<uint16_t>& ports);
    // The sandbox's veth (its host end, a port of the bridge) and its address: frames from
    // that port with another source address are dropped (the bridge table's ports4).
    void set_port(const std::string& sandbox_ip, const std::string& link);
    // The sandbox's published ports: replaces its entries of the published4 map. (The caller
    // makes sure a host address and port is published once: the kernel refuses a duplicate
    // key.)
    void set_published(const std::string& sandbox_ip, const std::vector<PublishedPort>& ports);
    // A new sandbox whole, in one transaction of additions only (no listing: the fast path
    // of a create): its port and link (set_port), host ports, published ports, memberships
    // and allow4 entries. The table must hold nothing of `sandbox_ip` (a fresh table, or
    // forget() succeeded since): the caller hands out no address whose forget failed.
    void add_sandbox(const std::string& sandbox_ip, const std::string& link,
                     const std::vector<uint16_t>& host_ports,
                     const std::vector<PublishedPort>& published, bool is_public, bool is_listed,
                     const std::vector<AllowRule>& rules);
    // Two sandboxes (host end of each veth, address) reach each other (`on`) or no longer:
    // the pair in both directions, in `peers` (layer 2) and `peers4`. The caller keeps
    // track of pairs and removes them before forget().
    void set_peers(const std::string& link_a, const std::string& ip_a, const std::string& link_b,
                   const std::string& ip_b, bool on);
    // Removes the sandbox from every set (it is being deleted).
    void forget(const std::string& sandbox_ip);

    // `list table inet NAME`, as nft prints it: for doctor and tests.
    std::string list();

  private:
    struct CtxDeleter {
        void operator()(nft_ctx* ctx) const;
    };

    std::string run(const std::string& commands, const char* what, bool json = false);
    // The set's elements whose first field is `sandbox_ip`, as nft element text.
    std::vector<std::string> elements_of(const char* set, const std::string& sandbox_ip);
    // Runs the transaction `build()` returns (which lists elements to delete); retried when
    // it fails, since an element with a timeout may lapse between the listing and the
    // delete.
    template <typename Build>
    void run_listing(Build build, const char* what);
    std::string checked_sandbox(const std::string& ip) const;
    std::vector<std::string> allowed_elements(const std::string& ip,
                                              const std::vector<AllowRule>& rules) const;

    TableConfig config_;
    std::unique_ptr<nft_ctx, CtxDeleter> ctx_;
};

}  // namespace berth::net
