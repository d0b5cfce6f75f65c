// Codes across process boundaries: one errno mapping, and whatever number a peer sends
// becomes a code the client knows.
#include "runtime/wire/error_codes.h"

#include <gtest/gtest.h>

#include <cerrno>

#include "init.pb.h"

using namespace berth;

TEST(ErrorCodes, OneMappingFromErrno) {
    EXPECT_EQ(wire::error_code_for_errno(ENOENT), v1::NOT_FOUND);
    EXPECT_EQ(wire::error_code_for_errno(EACCES), v1::PERMISSION_DENIED);
    EXPECT_EQ(wire::error_code_for_errno(EMFILE), v1::RESOURCE_EXHAUSTED);
    EXPECT_EQ(wire::error_code_for_errno(EDQUOT), v1::RESOURCE_EXHAUSTED);
    EXPECT_EQ(wire::error_code_for_errno(EEXIST), v1::ALREADY_EXISTS);
    EXPECT_EQ(wire::error_code_for_errno(ECANCELED), v1::CANCELED);
    EXPECT_EQ(wire::error_code_for_errno(ELOOP), v1::INVALID_ARGUMENT);
    EXPECT_EQ(wire::error_code_for_errno(EIO), v1::INTERNAL);
    EXPECT_EQ(wire::error_code_for_errno(EIO, v1::UNAVAILABLE), v1::UNAVAILABLE);
}

TEST(ErrorCodes, WhatAPeerSendsIsChecked) {
    EXPECT_EQ(wire::error_code_from_peer(v1::NOT_FOUND), v1::NOT_FOUND);
    EXPECT_EQ(wire::error_code_from_peer(v1::ERROR_CODE_UNSPECIFIED), v1::INTERNAL);
    EXPECT_EQ(wire::error_code_from_peer(static_cast<v1::ErrorCode>(999)), v1::INTERNAL);
    EXPECT_EQ(wire::error_code_from_peer(static_cast<v1::ErrorCode>(-3)), v1::INTERNAL);
    // On the wire the enum is the varint the uint32 field was: old peers interoperate.
    v1::init::Failed failed;
    failed.set_code(static_cast<v1::ErrorCode>(12345));
    v1::init::Failed read;
    ASSERT_TRUE(read.ParseFromString(failed.SerializeAsString()));
    EXPECT_EQ(wire::error_code_from_peer(read.code()), v1::INTERNAL);
}

TEST(ErrorCodes, KindsAndCodesConvertBothWays) {
    for (int c = v1::ErrorCode_MIN; c <= v1::ErrorCode_MAX; ++c) {
        const auto code = static_cast<v1::ErrorCode>(c);
        EXPECT_EQ(wire::error_code(wire::error_kind(code)), code) << c;
    }
    EXPECT_EQ(wire::error_code(Error::Kind::cancelled), v1::CANCELED);
    EXPECT_EQ(wire::error_kind(v1::FAILED_PRECONDITION), Error::Kind::failed_precondition);
    EXPECT_EQ(wire::error_kind(static_cast<v1::ErrorCode>(999)), Error::Kind::internal);
    // A SysError's kind gives the code its errno does.
    EXPECT_EQ(wire::error_code(SysError("open", "/x", EDQUOT).kind()),
              wire::error_code_for_errno(EDQUOT));
}
