#include "cgroup/devices.h"

#include <linux/bpf.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace berth::cgroup {

const std::vector<DeviceRule>& default_device_rules() {
    static const std::vector<DeviceRule> rules = {
        {'c', -1, -1, "m"},
        {'b', -1, -1, "m"},  // mknod (refused in a
                             // user namespace anyway)
        {'c', 1, 3, "rwm"},
        {'c', 1, 5, "rwm"},
        {'c', 1, 7, "rwm"},  // null zero full
        {'c', 1, 8, "rwm"},
        {'c', 1, 9, "rwm"},  // random urandom
        {'c', 5, 0, "rwm"},
        {'c', 5, 1, "rwm"},
        {'c', 5, 2, "rwm"},     // tty console ptmx
        {'c', 136, -1, "rwm"},  // /dev/pts/*
        {'c', 10, 200, "rwm"},  // /dev/net/tun
    };
    return rules;
}

std::vector<std::string> device_rules_v1() {
    std::vector<std::string> out;
    for (const DeviceRule& r : default_device_rules()) {
        auto num = [](int n) { return n < 0 ? std::string("*") : std::to_string(n); };
        out.push_back(std::string(1, r.type) + " " + num(r.major) + ":" + num(r.minor) + " " +
                      r.access);
    }
    return out;
}

namespace {

bpf_insn insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
    bpf_insn i{};
    i.code = code;
    i.dst_reg = dst & 0xf;
    i.src_reg = src & 0xf;
    i.off = off;
    i.imm = imm;
    return i;
}

int bpf(int cmd, bpf_attr* attr) {
    return static_cast<int>(::syscall(SYS_bpf, cmd, attr, sizeof *attr));
}

// The program, over struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }
// (access_type: device type in the low 16 bits, requested access in the high 16):
//   r2 = type, r3 = access, r4 = major, r5 = minor
//   per rule: if type differs, or access asks for more than the rule gives, or major or
//   minor differ: on to the next rule; else return 1 (allow)
//   return 0 (deny)
std::vector<bpf_insn> device_program() {
    constexpr uint8_t LDXW = BPF_LDX | BPF_MEM | BPF_W;
    std::vector<bpf_insn> p = {
        insn(LDXW, 2, 1, 0, 0), insn(BPF_ALU64 | BPF_AND | BPF_K, 2, 0, 0, 0xffff),
        insn(LDXW, 3, 1, 0, 0), insn(BPF_ALU64 | BPF_RSH | BPF_K, 3, 0, 0, 16),
        insn(LDXW, 4, 1, 4, 0), insn(LDXW, 5, 1, 8, 0),
    };
    for (const DeviceRule& r : default_device_rules()) {
        std::vector<bpf_insn> block;
        // Jumps to the end of this block are patched once its length is known.
        std::vector<size_t> to_next;
        auto jne = [&](uint8_t reg, int32_t value) {
            to_next.push_back(block.size());
            block.push_back(insn(BPF_JMP | BPF_JNE | BPF_K, reg, 0, 0, value));
        };
        if (r.type != 'a') jne(2, r.type == 'c' ? BPF_DEVCG_DEV_CHAR : BPF_DEVCG_DEV_BLOCK);
        int32_t allowed = 0;
        for (const char* a = r.access; *a; ++a) {
            allowed |= *a == 'r'   ? BPF_DEVCG_ACC_READ
                       : *a == 'w' ? BPF_DEVCG_ACC_WRITE
                                   : BPF_DEVCG_ACC_MKNOD;
        }
        // r6 = access & ~allowed: anything asked beyond the rule sends us on.
        block.push_back(insn(BPF_ALU64 | BPF_MOV | BPF_X, 6, 3, 0, 0));
        block.push_back(insn(BPF_ALU64 | BPF_AND | BPF_K, 6, 0, 0, ~allowed));
        jne(6, 0);
        if (r.major >= 0) jne(4, r.major);
        if (r.minor >= 0) jne(5, r.minor);
        block.push_back(insn(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 1));
        block.push_back(insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0));
        for (size_t at : to_next) block[at].off = static_cast<int16_t>(block.size() - at - 1);
        p.insert(p.end(), block.begin(), block.end());
    }
    p.push_back(insn(BPF_ALU64 | BPF_MOV | BPF_K, 0, 0, 0, 0));
    p.push_back(insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0));
    return p;
}

}  // namespace

UniqueFd load_device_program() {
    const std::vector<bpf_insn> program = device_program();
    static char log[16384];
    log[0] = '\0';
    bpf_attr attr{};
    attr.prog_type = BPF_PROG_TYPE_CGROUP_DEVICE;
    attr.insns = reinterpret_cast<uint64_t>(program.data());
    attr.insn_cnt = static_cast<uint32_t>(program.size());
    attr.license = reinterpret_cast<uint64_t>("Apache-2.0");
    attr.log_buf = reinterpret_cast<uint64_t>(log);
    attr.log_size = sizeof log;
    attr.log_level = 1;
    std::strncpy(attr.prog_name, "berth_devices", sizeof attr.prog_name - 1);
    int fd = bpf(BPF_PROG_LOAD, &attr);
    if (fd < 0) {
        const int saved = errno;
        throw SysError("bpf BPF_PROG_LOAD",
                       std::string("cgroup device program (verifier: ") + log + ")", saved);
    }
    return UniqueFd(fd);
}

void attach_device_program(int cgroup_fd, int program_fd, const std::string& cgroup_dir) {
    // A cgroup made again under the same name (a crashed create's) may hold this very program
    // already, and attaching one program twice is EINVAL: take it off first (ENOENT when it
    // was not there).
    bpf_attr detach{};
    detach.target_fd = static_cast<uint32_t>(cgroup_fd);
    detach.attach_bpf_fd = static_cast<uint32_t>(program_fd);
    detach.attach_type = BPF_CGROUP_DEVICE;
    if (bpf(BPF_PROG_DETACH, &detach) != 0 && errno != ENOENT)
        throw_sys("bpf BPF_PROG_DETACH", cgroup_dir);
    bpf_attr attr{};
    attr.target_fd = static_cast<uint32_t>(cgroup_fd);
    attr.attach_bpf_fd = static_cast<uint32_t>(program_fd);
    attr.attach_type = BPF_CGROUP_DEVICE;
    attr.attach_flags = BPF_F_ALLOW_MULTI;
    if (bpf(BPF_PROG_ATTACH, &attr) != 0) throw_sys("bpf BPF_PROG_ATTACH", cgroup_dir);
}

}  // namespace berth::cgroup
