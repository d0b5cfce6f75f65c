#include "base/error.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <string>

namespace berth {
namespace {

using Kind = Error::Kind;

TEST(Error, CarriesKindMessageAndErrno) {
    const Error e(Kind::not_found, "image debian:12", ENOENT);
    EXPECT_EQ(e.kind(), Kind::not_found);
    EXPECT_STREQ(e.what(), "image debian:12");
    EXPECT_EQ(e.err(), ENOENT);
    EXPECT_EQ(Error(Kind::internal, "x").err(), 0);
}

TEST(Error, WrapPrefixesContextOutermostFirst) {
    Error e(Kind::permission_denied, "open /x: Permission denied (errno 13)", EACCES);
    e.wrap("reading the layout").wrap("importing /tmp/a.tar");
    EXPECT_STREQ(e.what(),
                 "importing /tmp/a.tar: reading the layout: open /x: Permission denied (errno 13)");
    EXPECT_EQ(e.kind(), Kind::permission_denied);
    EXPECT_EQ(e.err(), EACCES);
}

TEST(Error, WithContextWrapsWhatPropagatesAndKeepsItsType) {
    try {
        with_context("copying a", [] { throw_sys("open", "/a", ENOENT); });
        FAIL() << "nothing thrown";
    } catch (const SysError& e) {
        EXPECT_STREQ(e.what(), "copying a: open /a: No such file or directory (errno 2)");
        EXPECT_EQ(e.code(), ENOENT);
        EXPECT_EQ(e.kind(), Kind::not_found);
    }
}

TEST(Error, WithContextPassesValuesAndOtherExceptionsThrough) {
    EXPECT_EQ(with_context("x", [] { return 42; }), 42);
    int n = 0;
    with_context("x", [&] { ++n; });
    EXPECT_EQ(n, 1);
    try {
        with_context("x", [] { throw std::runtime_error("plain"); });
        FAIL() << "nothing thrown";
    } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "plain");
    }
}

TEST(Error, SysErrorKindFollowsErrno) {
    EXPECT_EQ(SysError("open", "/x", ENOENT).kind(), Kind::not_found);
    EXPECT_EQ(SysError("open", "/x", EACCES).kind(), Kind::permission_denied);
    EXPECT_EQ(SysError("write", "/x", ENOSPC).kind(), Kind::resource_exhausted);
    EXPECT_EQ(SysError("mkdir", "/x", EEXIST).kind(), Kind::already_exists);
    EXPECT_EQ(SysError("read", "", ECANCELED).kind(), Kind::cancelled);
    EXPECT_EQ(SysError("write", "", EPIPE).kind(), Kind::unavailable);
    EXPECT_EQ(SysError("openat2", "/x", ELOOP).kind(), Kind::invalid_argument);
    EXPECT_EQ(SysError("read", "/x", EIO).kind(), Kind::internal);
    EXPECT_EQ(SysError::relayed("unpack: read: I/O error", EIO).err(), EIO);
    EXPECT_EQ(kind_for_errno(EIO, Kind::unavailable), Kind::unavailable);
}

TEST(Error, SysErrorMessageNamesCallSubjectAndErrno) {
    EXPECT_STREQ(SysError("open", "/run/x", EACCES).what(),
                 "open /run/x: Permission denied (errno 13)");
    EXPECT_STREQ(SysError("poll", "", EINVAL).what(), "poll: Invalid argument (errno 22)");
}

}  // namespace
}  // namespace berth
